"""TileLang kernels compiled ahead on a CPU machine and carried to a GPU machine in one tarball.

TileLang keeps each compiled kernel in its own directory under ``$TILELANG_CACHE_DIR`` (default
``~/.tilelang/cache``): ``<version>/<platform>/kernels/<key>``, the key hashing the kernel's TIR, target and pass
configs. A kernel built for ``sm_90a`` on a CPU machine (see ``backends/tilelang/_build.py``) is therefore a
disk-cache hit on an H100 or H200 once its directory is in that machine's cache; a kernel the cache lacks compiles
on first use there (5-35 s each).

    python scripts/prebuild_tilelang.py                      # CPU machine: compile, pack .devcache/tilelang-cache.tar.xz
    python -m kernel_dispatch.testing.tilelang_cache unpack  # GPU machine: merge into $TILELANG_CACHE_DIR (or the default)

:func:`build` compiles :class:`KernelJob` s in spawned worker processes, :func:`pack` writes the kernel directories
a build used into a tarball, :func:`unpack` merges a tarball into a cache.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import multiprocessing
import os
import tarfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

DEFAULT_TAR = Path(".devcache") / "tilelang-cache.tar.xz"
TILELANG_DEFAULT_CACHE = "~/.tilelang/cache"


@dataclass(frozen=True)
class KernelJob:
    """One kernel to compile: ``factory(*args)`` of ``module`` returns a ``T.prim_func``, compiled for sm_90a the way
    the launchers compile it (``_build.compile_kernel``: same target and pass configs, so the same cache key).

    label: names the kernel in progress lines and failures. module: a dotted module name, or the path of a script
    file (loaded by path in the worker, so a tool in scripts/ can list kernels of its own).
    """

    label: str
    module: str
    factory: str
    args: tuple = ()


@dataclass(frozen=True)
class BuildResult:
    """What compiling one job gave: seconds taken, the kernel's directory in the cache, or the error."""

    job: KernelJob
    seconds: float
    cache_path: str | None = None
    error: str | None = None


def cache_dir() -> Path:
    """The cache TileLang uses in this process: ``$TILELANG_CACHE_DIR``, else its default."""
    return Path(os.environ.get("TILELANG_CACHE_DIR") or TILELANG_DEFAULT_CACHE).expanduser()


def _module(name: str):
    if not name.endswith(".py"):
        return importlib.import_module(name)
    path = Path(name).resolve()
    spec = importlib.util.spec_from_file_location(f"kernel_job_{path.stem}", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"module: cannot load {path}")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def build_one(job: KernelJob) -> BuildResult:
    """Compile ``job`` into this process's TileLang cache; an error is returned, not raised."""
    from ..backends.tilelang import _build

    t = time.perf_counter()
    try:
        prim = getattr(_module(job.module), job.factory)(*job.args)
        kernel = _build.compile_kernel(prim, dict(sorted(_build.SM90A.items())))
    except Exception as e:  # one failed kernel is a line in the report, not the end of the build
        lines = [s for s in str(e).strip().splitlines() if s.strip()]
        return BuildResult(job, time.perf_counter() - t, error=f"{type(e).__name__}: {lines[-1][:300] if lines else ''}")
    path = getattr(kernel, "_tilelang_cache_path", None)
    if path is None:
        return BuildResult(job, time.perf_counter() - t, error="TileLang kept no cache directory (is its cache off?)")
    return BuildResult(job, time.perf_counter() - t, cache_path=str(path))


def build(jobs: Iterable[KernelJob], cache: Path, workers: int,
          progress: Callable[[BuildResult], None] | None = None) -> list[BuildResult]:
    """Compile every job in ``workers`` spawned processes into the TileLang cache ``cache`` (created if needed;
    kernels already there load instead of compiling). Returns the results in the order of ``jobs``."""
    if workers < 1:
        raise ValueError(f"workers: expected >= 1, got {workers}")
    cache.mkdir(parents=True, exist_ok=True)
    os.environ["TILELANG_CACHE_DIR"] = str(cache)  # the spawned workers inherit it
    results = []
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        for res in pool.map(build_one, list(jobs)):
            results.append(res)
            if progress is not None:
                progress(res)
    return results


def pack(results: Iterable[BuildResult], cache: Path, tar_path: Path) -> int:
    """Write the cache directories of the successful ``results`` (paths relative to ``cache``) to ``tar_path``
    (xz); returns how many kernels it holds."""
    paths = sorted({Path(r.cache_path) for r in results if r.cache_path})
    root = cache.resolve()
    tar_path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(tar_path, "w:xz") as tar:
        for p in paths:
            rel = p.resolve().relative_to(root)  # ValueError if a kernel was cached elsewhere
            tar.add(p, arcname=str(rel))
    return len(paths)


def unpack(tar_path: Path, cache: Path | None = None) -> tuple[Path, int]:
    """Merge the kernels of ``tar_path`` into ``cache`` (default: :func:`cache_dir`); returns (cache, kernels)."""
    cache = (cache or cache_dir()).expanduser()
    if not tar_path.is_file():
        raise FileNotFoundError(f"tar_path: no TileLang kernel tarball at {tar_path} (scripts/prebuild_tilelang.py "
                                "writes it on a CPU machine)")
    cache.mkdir(parents=True, exist_ok=True)
    with tarfile.open(tar_path) as tar:
        names = tar.getnames()
        tar.extractall(cache, filter="data")
    kernels = {Path(n).parts[:4] for n in names if len(Path(n).parts) >= 4 and Path(n).parts[2] == "kernels"}
    return cache, len(kernels)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m kernel_dispatch.testing.tilelang_cache",
                                description="Merge prebuilt TileLang kernels into the TileLang cache of this machine.")
    sub = p.add_subparsers(dest="command", required=True)
    up = sub.add_parser("unpack", help="merge a tarball of scripts/prebuild_tilelang.py into the TileLang cache")
    up.add_argument("--tar", type=Path, default=DEFAULT_TAR, help="the tarball (default: %(default)s)")
    up.add_argument("--cache", type=Path, help="the cache (default: $TILELANG_CACHE_DIR, else ~/.tilelang/cache)")
    args = p.parse_args(argv)
    try:
        cache, n = unpack(args.tar, args.cache)
    except FileNotFoundError as e:
        p.exit(1, f"{e}\n")
    print(f"{n} TileLang kernels from {args.tar} in {cache}")
    if args.cache is not None and Path(args.cache).expanduser() != cache_dir():
        print(f"TileLang reads this cache with TILELANG_CACHE_DIR={cache}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
