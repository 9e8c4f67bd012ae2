"""Where the CuTe DSL backend's compiled kernels live, and how one is loaded without the DSL.

A kernel store is a directory of shared objects, one per :class:`KernelKey`: ``<name>.so`` exporting the TVM FFI
entry ``__tvm_ffi_<name>``, and ``<name>.json`` beside it (arch, DSL version, the hash of the kernel's sources,
compile seconds, shared memory, registers, spills). ``python -m kernel_dispatch.backends.cute.build`` fills one for
every shipped kernel on any machine with the DSL (no GPU needed) and writes ``manifest.json``, the sidecars in one
file. Running a kernel needs only two things from the DSL's wheels: ``libcute_dsl_runtime.so`` (loaded here with
RTLD_GLOBAL) and the ``tvm_ffi`` package.

Two ways to run, one kernel source: where the DSL is installed, a kernel missing from the store (or built from
other sources) is compiled at first use and saved there (JIT, cached on disk); where it is not, the store must
hold it, and :class:`MissingKernelError` names the kernel and the command that builds it.

Environment: ``KERNEL_DISPATCH_CUTE_KERNELS`` (the store; default ``~/.cache/kernel_dispatch/cute/sm_90a``),
``KERNEL_DISPATCH_CUTE_RUNTIME`` (a directory with ``lib/libcute_dsl_runtime.so`` and, where no ``tvm_ffi`` is
installed, ``site/tvm_ffi``: what ``build --pack-runtime`` writes).
"""
import ctypes
import functools
import hashlib
import importlib.util
import json
import os
import shutil
import sys
import threading
from pathlib import Path

from ._kernel_key import ARCH, KernelKey

PACKAGE_DIR = Path(__file__).parent
# which source files make each kernel (a change to any of them makes its stored build stale)
KERNEL_MODULES = {"fwd_sm90": "_lazy_attention_fwd_sm90_kernel", "lse_sm90": "_lazy_attention_lse_sm90_kernel",
                  "dq_sm90": "_lazy_attention_dq_sm90_kernel", "dkdv_sm90": "_lazy_attention_dkdv_sm90_kernel"}
KERNEL_SOURCES = {kernel: (f"{module}.py",) for kernel, module in KERNEL_MODULES.items()}
KERNEL_SOURCES["lse_sm90"] += ("_lazy_attention_fwd_sm90_kernel.py",  # its row folds are the forward's
                               "_exp_band.py")
COMMON_SOURCES = ("_kernel_key.py", "_tiles.py")
BUILD_COMMAND = "python -m kernel_dispatch.backends.cute.build"


class MissingKernelError(RuntimeError):
    """A kernel the call needs is neither in the store nor compilable here (the DSL is not installed)."""


def store_dir() -> Path:
    """The kernel store of this process (``KERNEL_DISPATCH_CUTE_KERNELS`` or the per-user cache)."""
    env = os.environ.get("KERNEL_DISPATCH_CUTE_KERNELS")
    return Path(env) if env else Path.home() / ".cache" / "kernel_dispatch" / "cute" / ARCH


def dsl_installed() -> bool:
    """Whether the CuTe DSL can be imported (checked without importing it)."""
    return importlib.util.find_spec("nvidia_cutlass_dsl") is not None


@functools.lru_cache(maxsize=None)
def source_hash(kernel: str) -> str:
    """sha256 (16 hex digits) of the source files that define ``kernel``."""
    if kernel not in KERNEL_SOURCES:
        raise ValueError(f"kernel: expected one of {sorted(KERNEL_SOURCES)}, got {kernel!r}")
    h = hashlib.sha256()
    for name in KERNEL_SOURCES[kernel] + COMMON_SOURCES:
        path = PACKAGE_DIR / name
        h.update(name.encode() + b"\0" + (path.read_bytes() if path.exists() else b"") + b"\0")
    return h.hexdigest()[:16]


def stored(key: KernelKey, directory: Path | None = None) -> dict | None:
    """The sidecar of ``key``'s build in the store when it is there and current, else None."""
    d = directory or store_dir()
    meta_path, lib = d / f"{key.name}.json", d / f"{key.name}.so"
    if not (meta_path.exists() and lib.exists()):
        return None
    try:
        meta = json.loads(meta_path.read_text())
    except (OSError, ValueError):
        return None
    if meta.get("source_hash") != source_hash(key.kernel) or meta.get("arch") != ARCH:
        return None
    return meta


def why_missing(key: KernelKey) -> str | None:
    """Why ``key`` cannot be run on this machine (not stored and no DSL to compile it), or None."""
    if stored(key) is not None:
        return None
    can_build = dsl_installed()
    if can_build and shutil.which("gcc") is not None:
        return None
    d = store_dir()
    stale = (d / f"{key.name}.so").exists()
    what = "built from other sources (stale)" if stale else "not built"
    missing = "gcc is not on PATH to link it" if can_build else "the CuTe DSL is not installed to compile it"
    return (f"kernel {key.name} {what} in {d} and {missing} (build it where the DSL is: pip install "
            f"'kernel-dispatch[cute]'; {BUILD_COMMAND} --out DIR; then KERNEL_DISPATCH_CUTE_KERNELS=DIR)")


def runtime_library() -> Path | None:
    """``libcute_dsl_runtime.so``: from ``KERNEL_DISPATCH_CUTE_RUNTIME`` or the installed DSL's cu13/cu12 wheel."""
    env = os.environ.get("KERNEL_DISPATCH_CUTE_RUNTIME")
    if env:
        lib = Path(env) / "lib" / "libcute_dsl_runtime.so"
        return lib if lib.exists() else None
    spec = importlib.util.find_spec("nvidia_cutlass_dsl")
    for root in (spec.submodule_search_locations or []) if spec else []:
        for sub in ("cu13", "cu12"):
            lib = Path(root) / sub / "lib" / "libcute_dsl_runtime.so"
            if lib.exists():
                return lib
    return None


def runtime_unavailable() -> str | None:
    """Why the runtime (``libcute_dsl_runtime.so`` and ``tvm_ffi``) cannot be loaded here, or None."""
    if runtime_library() is None:
        where = os.environ.get("KERNEL_DISPATCH_CUTE_RUNTIME")
        return (f"libcute_dsl_runtime.so not in {where}/lib" if where else
                "the CuTe DSL runtime is not installed (pip install 'kernel-dispatch[cute]', or "
                "KERNEL_DISPATCH_CUTE_RUNTIME=DIR from `" + BUILD_COMMAND + " --pack-runtime`)")
    try:
        _load_runtime()
    except Exception as e:  # a broken install is a reason, never a crash
        return f"CuTe DSL runtime not loadable ({type(e).__name__}: {e})"
    return None


@functools.lru_cache(maxsize=None)
def _load_runtime():
    """Load ``libcute_dsl_runtime.so`` globally (the shared objects resolve against it) and return ``tvm_ffi``."""
    ctypes.CDLL(str(runtime_library()), mode=ctypes.RTLD_GLOBAL)
    try:
        import tvm_ffi
    except ImportError:
        env = os.environ.get("KERNEL_DISPATCH_CUTE_RUNTIME")
        if not env or not (Path(env) / "site" / "tvm_ffi").exists():
            raise
        # an installed tvm_ffi wins: two versions in one process do not mix (TileLang brings its own)
        sys.path.append(str(Path(env) / "site"))
        import tvm_ffi
    return tvm_ffi


_build_lock = threading.Lock()


@functools.lru_cache(maxsize=None)
def function(key: KernelKey):
    """The callable kernel ``key`` (a ``tvm_ffi.Function``: call it with torch tensors and Python scalars in its
    module's ``ARGS`` order), from the store, or compiled into it first where the DSL is installed."""
    tvm_ffi = _load_runtime()
    d = store_dir()
    if stored(key, d) is None:
        reason = why_missing(key)
        if reason:
            raise MissingKernelError(f"cute: {reason}")
        from . import build  # imports the DSL

        with _build_lock:
            if stored(key, d) is None:
                build.build_one(key, d)
    return tvm_ffi.load_module(str(d / f"{key.name}.so"))[key.name]
