"""Compile, on a CPU machine, the TileLang kernels that the GPU tests and the benchmark's default sweep use, for
sm_90a (H100, H200), and pack them into one tarball for the GPU machine.

    python scripts/prebuild_tilelang.py                      # .devcache/tilelang-cache.tar.xz
    python scripts/prebuild_tilelang.py --list               # what it would build (--ops to narrow it)
    python -m kernel_dispatch.testing.tilelang_cache unpack  # on the GPU machine, with .devcache carried there

Needs the package importable (``make install``, or ``PYTHONPATH=.`` from the repository root) and a CUDA compiler
(the ``cpu-build`` extra). A TileLang kernel is compiled per shape class (head dim or feature size, dtype, a few
flags); batch, sequence length and token count are symbolic. This builds:

- lazy_attention: its five kernels at head dims 64 and 128, fp16 and bf16, causal and not (every shape class the
  TileLang backend supports), each in its fixed-length and its packed-documents form (lazy_attention_varlen);
- mhc_pre, mhc_post: every kernel at each n = 4 feature size of the test cases, of the benchmark's default sweep
  and of the GPU training configs, fp16 and bf16, with the default hyper-parameters and the SM count of an H100
  SXM or H200 (132: the mHC pre backward's token splits depend on it; ``--sms`` for other cards);
- with ``--ceiling``, the plain-attention kernels of scripts/gpu_ceiling_tilelang_attention.py.

The cache (``--cache``) persists between runs, so unchanged kernels load instead of compiling; the tarball holds
only what this run needed. tests/test_prebuild_tilelang.py checks that the list covers every TileLang case of the
equivalence matrix. A cold build takes 5-35 s per kernel and core.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch

from kernel_dispatch.backends.tilelang import lazy_attention, mhc_post, mhc_pre
from kernel_dispatch.ops import mhc_bench
from kernel_dispatch.testing.tilelang_cache import DEFAULT_TAR, BuildResult, KernelJob, build, pack

DTYPES = (torch.float16, torch.bfloat16)
HP = (20, 2.0, 1e-6, 1e-6, 1e-6)  # mhc_pre defaults: sinkhorn_iters, post_mult, norm_eps, pre_eps, sinkhorn_eps
SMS = 132
# n = 4 feature sizes beyond the benchmark's: the matrix's cases (tests/cases.py) and model.dim of the GPU
# training configs and tests (384)
MHC_TEST_D = (8, 16, 24, 32, 264, 520, 384, 1280, 2560, 4096, 7168)
CEILING_TOOL = Path(__file__).resolve().parent / "gpu_ceiling_tilelang_attention.py"


def _job(label: str, factory, args: tuple) -> KernelJob:
    return KernelJob(label, factory.__module__, factory.__name__, tuple(args))


def attention_jobs(D: int, dtype: torch.dtype, causal: bool) -> list[KernelJob]:
    """The kernels of one TileLang lazy attention call (forward and backward) at head dim D, fixed-length and
    packed-documents (lazy_attention_varlen) forms."""
    dt = lazy_attention.DTYPES[dtype]
    mask = "causal" if causal else "full"
    jobs = [_job(f"lazy_attention {name} d{D} {dt} {mask}", lazy_attention.FACTORIES[name],
                 (D, dt, causal, lazy_attention.CONFIGS[D][name])) for name in lazy_attention.FACTORIES]
    return jobs + [_job(f"lazy_attention_varlen {name} d{D} {dt} {mask}", lazy_attention.FACTORIES[name],
                        (D, dt, causal, lazy_attention.CONFIGS[D][name], True))
                   for name in lazy_attention.VARLEN_KERNELS]


def mhc_pre_jobs(D: int, dtype: torch.dtype, sms: int = SMS) -> list[KernelJob]:
    """Every kernel of TileLang mhc_pre (forward, backward, the residual path's dx) at feature size D."""
    specs = mhc_pre.kernel_specs(D, dtype, HP, sms)
    return [_job(f"mhc_pre {stage} D{D} {str(dtype)[6:]}", f, a) for stage, (f, a) in specs.items()]


def mhc_post_jobs(D: int, dtype: torch.dtype) -> list[KernelJob]:
    """The forward and backward kernel of TileLang mhc_post at feature size D."""
    return [_job(f"mhc_post {stage} D{D} {str(dtype)[6:]}", f, a)
            for stage, (f, a) in zip(("fwd", "bwd"), mhc_post.kernel_specs(D, dtype))]


def kvcache_jobs(D: int, dtype: torch.dtype) -> list[KernelJob]:
    """The three KV-cache kernels at head dim D: every tile height (16, 32, 64 rows of query heads x queries) and
    flag the launcher picks (scores kept or not; one split writing O directly or partials)."""
    from kernel_dispatch.backends.tilelang import lazy_attention_with_kvcache as kv

    dt = kv.DTYPES[dtype]
    jobs = []
    for rows in (16, 32, 64):
        tiles = kv.tiles_for(D, rows)
        flags = [("lse", (keep,)) for keep in (True, False)] + [
            ("out", (keep, direct)) for keep in (True, False) for direct in (True, False)] + [("reduce", ())]
        jobs += [_job(f"kvcache {name} {flag} d{D} {dt} m{tiles.block_m}", kv.prim_func, (name, D, dt, flag, tiles))
                 for name, flag in flags]
    return jobs


def shape_classes(mhc_d: tuple[int, ...] | None = None, dtypes: tuple = DTYPES) -> dict[str, list[tuple]]:
    """{operator: [shape class]}: (head_dim, dtype, causal) for lazy_attention, (D, dtype) for mHC (``mhc_d``:
    default every size of the tests and the benchmark), each in those of ``dtypes`` the operator's kernels take."""
    mhc_d = mhc_d or sorted(set(MHC_TEST_D) | set(mhc_bench.DEFAULT["D"]))
    half = [dt for dt in dtypes if dt in DTYPES]  # the attention kernels: fp16 and bf16 only
    return {
        "lazy_attention": [(D, dt, c) for D in lazy_attention.HEAD_DIMS for dt in half for c in (True, False)],
        "mhc_pre": [(D, dt) for D in mhc_d for dt in dtypes],
        "mhc_post": [(D, dt) for D in mhc_d for dt in dtypes],
        "lazy_attention_with_kvcache": [(D, dt) for D in (64, 128) for dt in half],
    }


def ceiling_jobs() -> list[KernelJob]:
    """The kernels of the TileLang ceiling probe (its ``VARIANTS``), loaded from the script by path."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_ceiling_tilelang_attention", CEILING_TOOL)
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    return [KernelJob(f"ceiling {name}", str(CEILING_TOOL), "build_variant", (name,)) for name in tool.VARIANTS]


def all_jobs(sms: int = SMS, ceiling: bool = False, ops: tuple[str, ...] | None = None,
             mhc_d: tuple[int, ...] | None = None, dtypes: tuple = DTYPES) -> list[KernelJob]:
    """Every job of ``ops`` (default: all) at the shape classes of :func:`shape_classes`, each kernel once (kernels
    that do not depend on the dtype are shared)."""
    makers = {"lazy_attention": attention_jobs, "mhc_pre": lambda D, dt: mhc_pre_jobs(D, dt, sms),
              "mhc_post": mhc_post_jobs, "lazy_attention_with_kvcache": kvcache_jobs}
    jobs: dict[tuple, KernelJob] = {}
    for op, classes in shape_classes(mhc_d, dtypes).items():
        if ops is not None and op not in ops:
            continue
        for cls in classes:
            for job in makers[op](*cls):
                jobs.setdefault((job.module, job.factory, job.args), job)
    for job in ceiling_jobs() if ceiling else []:
        jobs.setdefault((job.module, job.factory, job.args), job)
    return list(jobs.values())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cache", type=Path, default=Path("~/.cache/kernel-dispatch/tilelang").expanduser(),
                    help="TileLang cache to build into, kept between runs (default: %(default)s)")
    ap.add_argument("--tar", type=Path, default=DEFAULT_TAR, help="tarball to write (default: %(default)s)")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="compiling processes (default: cores)")
    ap.add_argument("--sms", type=int, default=SMS, help="SM count of the GPU (default: %(default)s)")
    ap.add_argument("--ops", help="comma list of operators to build (default: every operator with TileLang kernels)")
    ap.add_argument("--D", help="mHC feature sizes to build (comma list, any sizes; default: every size of the "
                               "tests, the benchmark and the GPU configs)")
    ap.add_argument("--dtypes", default="float16,bfloat16",
                    help="dtypes to build, comma list of float16, bfloat16, float32 (default: %(default)s)")
    ap.add_argument("--ceiling", action="store_true", help="also the kernels of gpu_ceiling_tilelang_attention.py")
    ap.add_argument("--only", help="comma list of label fragments: build only the kernels whose label (see --list) "
                                   "contains one of them, e.g. 'varlen dkdv,d128 bfloat16 causal'")
    ap.add_argument("--list", action="store_true", help="print the kernels and exit")
    args = ap.parse_args(argv)
    ops = None
    if args.ops:
        ops = tuple(args.ops.split(","))
        unknown = set(ops) - set(shape_classes())
        if unknown:
            ap.error(f"--ops: unknown operators {sorted(unknown)}; valid: {', '.join(shape_classes())}")
    try:
        dtypes = tuple(getattr(torch, name) for name in args.dtypes.split(","))
        mhc_d = tuple(int(d) for d in args.D.split(",")) if args.D else None
    except (AttributeError, ValueError) as e:
        ap.error(f"--dtypes / --D: {e}")
    jobs = all_jobs(args.sms, args.ceiling, ops, mhc_d, dtypes)
    if args.only:
        jobs = [job for job in jobs if any(part in job.label for part in args.only.split(","))]
    if args.list:
        for job in jobs:
            print(job.label)
        print(f"{len(jobs)} kernels")
        return 0
    t0 = time.perf_counter()

    def progress(r: BuildResult) -> None:
        state = f"FAILED {r.error}" if r.error else f"{r.seconds:5.1f} s"
        print(f"[{time.perf_counter() - t0:6.0f} s] {r.job.label}: {state}", flush=True)

    print(f"{len(jobs)} kernels into {args.cache}, {args.workers} processes", flush=True)
    results = build(jobs, args.cache, args.workers, progress)
    failed = [r for r in results if r.error]
    n = pack(results, args.cache, args.tar)
    print(f"{n} kernels in {args.tar} ({args.tar.stat().st_size / 2**20:.1f} MiB), {len(failed)} failed, "
          f"{time.perf_counter() - t0:.0f} s")
    for r in failed:
        print(f"FAILED {r.job.label}: {r.error}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
