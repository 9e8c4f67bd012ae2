"""Where the time goes: the device time of every kernel in one training step (forward + backward) of the
benchmark's candidates, under torch.profiler.

    python scripts/gpu_profile_kernels.py [--ops lazy_attention,mhc] [--backends triton,tilelang,sdpa_cudnn]
        [--L 4096] [--D 128] [--T 16384] [--W 512]

lazy_attention: bf16, causal, B*L = 16384 tokens, H=16 (default L=4096, D=128, W=512: the target shape);
mhc: the block pre -> identity -> post, T=16384, n=4, D=4096, bf16. The step is the benchmark's own (the same
inputs and calls as ``python -m kernel_dispatch.bench``); each runs twice (compile, autotune), then once profiled.
The table lists every kernel with its device time in microseconds, largest first, and its share of the step.
Needs the package importable (make install, or PYTHONPATH=.); TileLang kernels load from the cache that
``python -m kernel_dispatch.testing.tilelang_cache unpack`` fills (scripts/prebuild_tilelang.py builds it).
"""
from __future__ import annotations

import argparse

import torch
from torch.profiler import ProfilerActivity, profile

from kernel_dispatch.ops import lazy_attention_bench as attention
from kernel_dispatch.ops import mhc_bench as mhc


def kernel_rows(step) -> list[tuple[float, int, str]]:
    """[(device us, launches, kernel name)] of one call of ``step`` under the CUDA profiler, largest first."""
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    rows = []
    for ev in prof.key_averages():
        t = getattr(ev, "device_time_total", None) or getattr(ev, "cuda_time_total", 0)
        if t > 0:
            rows.append((t, ev.count, ev.key))
    return sorted(rows, reverse=True)


def steps(op: str, backends: list[str], args) -> list[tuple[str, object]]:
    """(label, candidate) of every backend or baseline at the op's shape."""
    dev = torch.device("cuda")
    if op == "lazy_attention":
        s = attention.Shape(max(1, 16384 // args.L), 16, args.L, args.D, args.W)
        mod = attention
    else:
        s = mhc.Shape(args.T, 4, args.D_mhc)
        mod = mhc
    t = mod.make_inputs(s, torch.bfloat16, dev)
    ref = mod.Reference(t, s)
    return [(f"{op} {s.label()} {name}", mod.candidate(name, s, t, ref)) for name in backends]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ops", default="lazy_attention,mhc")
    ap.add_argument("--backends", default="triton,tilelang,sdpa_cudnn")
    ap.add_argument("--L", type=int, default=4096, help="lazy attention sequence length")
    ap.add_argument("--D", type=int, default=128, help="lazy attention head dim")
    ap.add_argument("--W", type=int, default=512, help="lazy attention bias length")
    ap.add_argument("--T", type=int, default=16384, help="mHC tokens")
    ap.add_argument("--D-mhc", type=int, default=4096, help="mHC feature size")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA device")
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    for op in args.ops.split(","):
        for label, cand in steps(op, args.backends.split(","), args):
            if cand.reason:
                print(f"\n== {label}: not run ({cand.reason})", flush=True)
                continue
            try:
                cand.fwd_bwd()
                cand.fwd_bwd()
                torch.cuda.synchronize()
                rows = kernel_rows(cand.fwd_bwd)
            except Exception as e:  # report and go on with the next
                print(f"\n== {label}: failed {type(e).__name__}: {str(e)[-300:]}", flush=True)
                continue
            total = sum(r[0] for r in rows)
            print(f"\n== {label}: {total:.0f} us of kernels in one forward + backward", flush=True)
            for t, count, key in rows[:16]:
                print(f"  {t:9.1f} us {100 * t / total:5.1f}%  x{count:<3d} {key[:100]}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
