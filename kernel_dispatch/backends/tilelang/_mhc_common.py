"""Shared settings of the mHC TileLang kernels: stream count, block sizes, compilation.

Every mHC factory (``_mhc_*_kernel.py``) returns a ``T.prim_func`` whose token count is a
symbolic dimension, so one compiled kernel serves every T. :func:`compile_mhc` compiles it for
the device's architecture (sm_90a on Hopper) through the tvm_ffi backend and keeps it for the
life of the process; TileLang also caches the build on disk under ``$TILELANG_CACHE_DIR``
(default ``~/.tilelang/cache``), so a new process reuses the cubin.
"""
from __future__ import annotations

import functools

from ._build import PASS_CONFIGS, SM90A, device_target, import_tilelang

N_STREAMS = 4
SMEM_LIMIT = 232448  # opt-in shared memory per block on sm_90 (227 KiB)
VEC = 8            # elements per 16-byte access of a 16-bit dtype; D must be a multiple of it
ROW_BLOCK = 1024   # elements of D per CTA in the streaming kernels (128 threads x VEC)


def tl_dtype(dtype) -> str:
    """The TileLang name of a torch dtype (float16 / bfloat16 / float32)."""
    return str(dtype).replace("torch.", "")


def compile_mhc(prim_func, target: dict | None = None, pass_configs: dict | None = None):
    """Compile ``prim_func`` for ``target`` (default sm_90a); returns the callable JIT kernel."""
    tilelang = import_tilelang()
    cfg = dict(PASS_CONFIGS)
    cfg.update(pass_configs or {})
    return tilelang.compile(prim_func, target=dict(target or SM90A), execution_backend="tvm_ffi", pass_configs=cfg)


@functools.lru_cache(maxsize=None)
def _kernel_cached(factory, args: tuple, target_items: tuple, cfg_items: tuple):
    return compile_mhc(factory(*args), dict(target_items), dict(cfg_items))


def kernel(factory, *args, device=None, pass_configs: dict | None = None):
    """The compiled kernel of ``factory(*args)`` for ``device`` (cached per process)."""
    target = device_target(device) if device is not None else SM90A
    return _kernel_cached(factory, tuple(args), tuple(sorted(target.items())),
                          tuple(sorted((pass_configs or {}).items())))


X_DTYPES = ("float16", "bfloat16")


def check_streams(name: str, x) -> tuple[int, int, int]:
    """(T, n, D) of a [T, n, D] CUDA tensor this backend supports, else ValueError/TypeError naming ``name``."""
    if x.dim() != 3:
        raise ValueError(f"{name}: expected [T, n, D], got shape {list(x.shape)}")
    T, n, D = x.shape
    if n != N_STREAMS:
        raise ValueError(f"{name}: n = {n} not supported by the tilelang mHC kernels (n = {N_STREAMS} only)")
    if D % VEC:
        raise ValueError(f"{name}: D = {D} not supported by the tilelang mHC kernels (a multiple of {VEC})")
    if tl_dtype(x.dtype) not in X_DTYPES:
        raise TypeError(f"{name}: dtype {x.dtype} not supported by the tilelang mHC kernels (float16, bfloat16)")
    if x.device.type != "cuda":
        raise ValueError(f"{name}: expected a CUDA tensor, got device {x.device}")
    return T, n, D


def dense(t, dtype=None):
    """``t`` (cast to ``dtype`` if given) contiguous and 16-byte aligned, as the TMA copies need."""
    if dtype is not None:
        t = t.to(dtype)
    t = t.contiguous()
    return t if t.data_ptr() % 16 == 0 else t.clone()


def bf16_pieces(x):
    """x [T, n, D] as bf16 pieces [T, P, n, D]: P = 1 (x itself) for bf16; P = 2 for fp16 (hi, lo with
    x = hi + lo exactly: 11 significant bits fit in two 8-bit pieces)."""
    import torch

    T, n, D = x.shape
    if x.dtype == torch.bfloat16:
        return x.view(T, 1, n, D)
    hi = x.to(torch.bfloat16)
    lo = (x.float() - hi.float()).to(torch.bfloat16)
    return torch.stack([hi, lo], dim=1)


@functools.lru_cache(maxsize=None)
def sm_count(device_index: int) -> int:
    """The number of streaming multiprocessors of CUDA device ``device_index``."""
    import torch

    return torch.cuda.get_device_properties(device_index).multi_processor_count
