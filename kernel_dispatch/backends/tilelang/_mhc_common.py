"""Shared settings of the mHC TileLang kernels: stream count, block sizes, input checks.

Every mHC factory (``_mhc_*_kernel.py``) returns a ``T.prim_func`` whose token count is a
symbolic dimension, so one compiled kernel (``_build.kernel``) serves every T.
"""
from __future__ import annotations

import functools

N_STREAMS = 4
SMEM_LIMIT = 232448  # opt-in shared memory per block on sm_90 (227 KiB)
VEC = 8            # elements per 16-byte access of a 16-bit dtype; D must be a multiple of it
ROW_BLOCK = 1024   # elements of D per CTA in the streaming kernels (128 threads x VEC)


def feature_block(D: int) -> int:
    """Features per CTA (or per step) of the streaming kernels for feature size ``D``: ROW_BLOCK, or D rounded
    up to a multiple of 256 when that is smaller."""
    return min(ROW_BLOCK, -(-D // 256) * 256)


def tl_dtype(dtype) -> str:
    """The TileLang name of a torch dtype (float16 / bfloat16 / float32)."""
    return str(dtype).replace("torch.", "")


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
