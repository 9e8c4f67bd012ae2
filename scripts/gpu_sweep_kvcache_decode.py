"""Which launch configuration of the Triton KV-cache decode kernels is fastest, shape by shape.

    python scripts/gpu_sweep_kvcache_decode.py [--kv-shapes 1x4K,16x4K] [--json out.json]

At each decode shape of the benchmark (bf16, H=32, Hkv=8, D=128, W=512, Lq=1, every row full) it times the shipped
configuration (``TILES``, ``POLICY`` in kernel_dispatch/backends/triton/lazy_attention_with_kvcache.py), then every
split policy x tile (keys per step, warps, stages) of the lists below (``--one-split-only``: none), then, where
B * Hkv is at least half the SM count, one split in two kernels and fused on each of ``ONE_SPLIT_TILES``
(with and without L2 hints), each as a CUDA-graph replay with the L2 flushed (the benchmark's timer), and SDPA cuDNN
on the same shape. Each configuration's output is compared with the shipped one's (max abs difference; the
additions change order between splits and tiles, nothing else). Finally the device time of each kernel of the shipped and
the best configurations under torch.profiler. Prints one table per shape.
"""
from __future__ import annotations

import argparse
import dataclasses
import itertools
import json

import torch
from torch.profiler import ProfilerActivity, profile

from kernel_dispatch.backends.kvcache_splits import SplitPolicy
from kernel_dispatch.backends.triton import lazy_attention_with_kvcache as kv
from kernel_dispatch.benchmarks.timing import Settings, Timer, copy_bandwidth_gbps
from kernel_dispatch.ops import lazy_attention_with_kvcache_bench as bench

POLICIES = [SplitPolicy(c, 128) for c in (1, 2, 4)]
TILES = [kv.KVCacheTiles(64, n, w, st) for n, w, st in ((64, 4, 3), (64, 8, 3), (64, 8, 2), (128, 8, 2))]
# one split per batch row and kv head: both passes in one kernel (fused) or two
ONE_SPLIT_TILES = [kv.KVCacheTiles(64, n, w, st, hints) for n, w, st in (
    (64, 4, 3), (64, 4, 4), (128, 8, 3), (128, 4, 3), (256, 8, 3)) for hints in (False, True)]


def kernel_us(fn, runs: int = 5) -> dict[str, float]:
    """Device microseconds per call of each kernel ``fn`` launches (eager, torch.profiler)."""
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(runs):
            fn()
        torch.cuda.synchronize()
    out = {}
    for ev in prof.key_averages():
        t = getattr(ev, "device_time_total", None) or getattr(ev, "cuda_time_total", 0)
        if t > 0:
            out[ev.key[:60]] = t / runs
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    bench.add_arguments(p)
    p.add_argument("--json", help="write every measurement to this file")
    p.add_argument("--one-split-only", action="store_true", help="skip the split policies: one split only")
    args = p.parse_args()
    args.W = None
    dev = torch.device("cuda")
    timer = Timer(dev, Settings(warmup=3, min_reps=10, max_reps=30, budget_s=0.1))
    copy_gbps = copy_bandwidth_gbps(timer)
    results = []
    for s in bench.shapes(args, quick=False, Ds=None):
        t = bench.make_inputs(s, torch.bfloat16, dev)
        scale = s.D ** -0.5

        def run(**over):
            return kv.forward(t.q, t.k, t.v, t.bias, t.tau, t.seqlens, scale, **over)

        def ms(fn):
            return timer.measure(fn)["median_ms"]

        shipped = run()
        rows = [("shipped", ms(bench.graphed(run)), 0.0, {})]
        with torch.nn.attention.sdpa_kernel([torch.nn.attention.SDPBackend.CUDNN_ATTENTION]):
            sd = bench.graphed(lambda: torch.nn.functional.scaled_dot_product_attention(t.q, t.k, t.v, scale=scale,
                                                                                       enable_gqa=True))
            cudnn = ms(sd)

        def measure(label, **over):
            try:
                out = run(**over)
                diff = (out.float() - shipped.float()).abs().max().item()
                rows.append((label, ms(bench.graphed(lambda: run(**over))), diff, over))
            except Exception as e:  # noqa: BLE001  a configuration that does not fit is a result too
                rows.append((label, float("inf"), float("nan"), {"error": str(e)[:80]}))

        for pol, tl_ in itertools.product(POLICIES, [] if args.one_split_only else TILES):
            measure(f"{pol.ctas_per_sm}/SM min {pol.min_keys}, N{tl_.block_n} w{tl_.num_warps} s{tl_.num_stages}",
                    policy=pol, tiles=tl_)
        base = kv.tiles_for(torch.bfloat16, s.H // s.Hkv)
        measure("shipped, L2 hints", tiles=dataclasses.replace(base, l2_hints=True))
        if s.B * s.Hkv >= torch.cuda.get_device_properties(dev).multi_processor_count // 2:
            measure("one split, two kernels", splits=1, fuse=False)
            for tl_ in ONE_SPLIT_TILES:
                measure(f"one split fused, N{tl_.block_n} w{tl_.num_warps} s{tl_.num_stages}"
                        + (" hints" if tl_.l2_hints else ""), splits=1, tiles=tl_)
        best = min(rows, key=lambda r: r[1])
        sol_ms = bench.kv_bytes(s, torch.bfloat16) / (copy_gbps * 1e9) * 1e3
        print(f"\n== B={s.B} n={s.n}: cuDNN {cudnn * 1e3:.1f} us, speed of light {sol_ms * 1e3:.1f} us ==")
        for label, t_ms, diff, over in sorted(rows, key=lambda r: r[1])[:14] + [rows[0]]:
            print(f"  {label:48s} {t_ms * 1e3:9.1f} us  x cuDNN {t_ms / cudnn:5.2f}  SOL {sol_ms / t_ms:5.1%}  "
                  f"max|diff| {diff:.1e}  {over.get('error', '')}")
        over = {k: v for k, v in best[3].items() if k != "error"}
        for label, fn in (("shipped", run), ("best", lambda: run(**over))):
            print(f"  kernels, {label}: " + ", ".join(f"{k.split('(')[0]} {v:.1f} us" for k, v in
                                                      kernel_us(fn).items()))
        results.append({"shape": s.as_dict(), "cudnn_ms": cudnn, "sol_ms": sol_ms,
                        "rows": [{"label": r[0], "ms": r[1], "diff": r[2],
                                  "config": {k: (v.__dict__ if hasattr(v, "__dict__") else v)
                                             for k, v in r[3].items()}} for r in rows]})
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
