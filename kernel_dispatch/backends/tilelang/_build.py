"""Compiling TileLang kernels: the CUDA toolkit, the target, and one ``compile`` for every factory.

TileLang finds ``nvcc`` through ``CUDA_HOME`` (read once, when ``tilelang`` is first imported).
On a machine without a system toolkit the pip packages ``nvidia-cuda-nvcc`` and
``nvidia-cuda-cccl`` (the ``cpu-build`` extra) provide one under ``site-packages/nvidia/cu13``;
:func:`import_tilelang` points ``CUDA_HOME`` there when it is unset, so kernels lower and build
to cubins for ``sm_90a`` on a CPU-only machine (never ask for target ``"cuda"``/``"auto"`` there:
TileLang then probes for a device).

:func:`kernel` is the backend's one compiled-kernel cache: every launcher gets its kernels from it, compiled once
per process. TileLang also caches them on disk, under ``$TILELANG_CACHE_DIR`` (default ``~/.tilelang/cache``):
``<version>/linux-x86_64/kernels`` (whole kernels, keyed by the kernel's TIR, target and pass configs) and
``<version>/cuda-binaries`` (cubins keyed by the CUDA source). A kernel built here for ``sm_90a`` is therefore a
cache hit on an H100/H200 host.
"""
from __future__ import annotations

import functools
import importlib.metadata
import os
import pathlib
import sys

SM90A = {"kind": "cuda", "arch": "sm_90a"}

# Fast math: exp2/log2 through the SFU approximations (relative error ~2^-22), as flash attention does.
PASS_CONFIGS = {"tl.enable_fast_math": True}


def pip_cuda_home() -> str | None:
    """The toolkit root of the pip ``nvidia-cuda-nvcc`` package (holding ``bin/nvcc``), or None."""
    try:
        files = importlib.metadata.files("nvidia-cuda-nvcc") or []
    except importlib.metadata.PackageNotFoundError:
        return None
    for f in files:
        if f.name == "nvcc":
            return str(pathlib.Path(f.locate()).resolve().parent.parent)
    return None


def cuda_home(required: bool = True) -> str | None:
    """The CUDA toolkit TileLang will use: ``$CUDA_HOME``, else the pip toolkit, else /usr/local/cuda.

    Sets ``CUDA_HOME`` when it was unset and a toolkit is found. Without any ``nvcc``: raises
    RuntimeError naming the packages to install when ``required``, else returns None (kernels
    already in TileLang's disk cache still load).
    """
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if home:
        return home
    home = pip_cuda_home()
    if home is None and os.path.exists("/usr/local/cuda/bin/nvcc"):
        home = "/usr/local/cuda"
    if home is None:
        if required:
            raise RuntimeError("no CUDA compiler found: set CUDA_HOME, or `pip install nvidia-cuda-nvcc "
                               "nvidia-cuda-cccl` (the cpu-build extra of this package)")
        return None
    os.environ["CUDA_HOME"] = home
    return home


def import_tilelang():
    """Import ``tilelang`` after pointing ``CUDA_HOME`` at a toolkit if one exists; returns the module."""
    if "tilelang" not in sys.modules:
        cuda_home(required=False)
    import tilelang

    return tilelang


def device_target(device) -> dict:
    """The TileLang target for a CUDA ``device``: ``sm_90a`` on Hopper (wgmma, TMA), else ``sm_XY``."""
    import torch

    return dict(_target_of(torch.device(device).index if torch.device(device).index is not None
                           else torch.cuda.current_device()))


@functools.lru_cache(maxsize=None)
def _target_of(index: int) -> tuple:
    import torch

    major, minor = torch.cuda.get_device_capability(index)
    if (major, minor) == (9, 0):
        return tuple(SM90A.items())
    return (("kind", "cuda"), ("arch", f"sm_{major}{minor}"))


def compile_kernel(prim_func, target: dict | None = None):
    """Compile ``prim_func`` (a ``T.prim_func``) for ``target`` (default sm_90a) to a JIT kernel.

    The kernel takes torch tensors and scalars in the order of the prim_func's parameters and
    writes its outputs in place (no output is allocated by TileLang).
    """
    tilelang = import_tilelang()
    return tilelang.compile(prim_func, target=dict(target or SM90A), execution_backend="tvm_ffi",
                            pass_configs=dict(PASS_CONFIGS))


@functools.lru_cache(maxsize=None)
def _compiled(factory, args: tuple, target: tuple):
    return compile_kernel(factory(*args), dict(target))


def kernel(factory, args: tuple, device=None):
    """The compiled kernel of ``factory(*args)`` (a kernel factory's ``T.prim_func``) for CUDA ``device``'s
    target (:func:`device_target`; sm_90a when ``device`` is None), compiled once per process."""
    target = SM90A if device is None else device_target(device)
    return _compiled(factory, tuple(args), tuple(sorted(target.items())))
