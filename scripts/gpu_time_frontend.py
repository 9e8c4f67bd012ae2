"""What the lazy-attention front end costs on one GPU: the cute forward through ``lazy_attention`` and through its
launcher, and cuDNN's forward, each run as the benchmark runs it (a 256 MiB L2 flush, then one call) under
torch.profiler, the cases interleaved round by round; with ``--step fwd_bwd`` the benchmark's forward+backward
(``torch.autograd.grad`` of every input) through the front end and cuDNN's.

    python scripts/gpu_time_frontend.py [--step fwd|fwd_bwd] [--shape 4x4096x128] [--W 512] [--rounds 20]

For each it prints the host's microseconds per call (the GPU kept busy, so no launch waits) and, from the kernel
timeline, the medians over the rounds of: the time from the flush's end to the first kernel (host work the flush did
not hide, plus launch latency), the span from the flush's end to the last kernel's end (what the benchmark's CUDA
events measure) and the kernels' busy time, with the last round's kernels (duration, start after the flush).
bf16, H = 16, causal, tau = -1; the kernels come from the cute backend's store (``KERNEL_DISPATCH_CUTE_KERNELS`` /
runtime as usual).
"""
import argparse
import json
import os
import statistics
import tempfile
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile

from kernel_dispatch.backends.cute import lazy_attention as cute
from kernel_dispatch.backends.cute.lazy_attention_fwd import forward as launcher_forward
from kernel_dispatch.benchmarks.timing import FLUSH_BYTES
from kernel_dispatch.ops.lazy_attention import lazy_attention

SLEEP_CYCLES = 400_000_000  # torch.cuda._sleep ahead of the host-time loop (about 0.2 s at 2 GHz)


def host_us(fn, calls: int = 50) -> float:
    """Mean host microseconds per call with the GPU busy (a long sleep queued first), no synchronisation."""
    fn()
    torch.cuda.synchronize()
    torch.cuda._sleep(SLEEP_CYCLES)
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    dt = (time.perf_counter() - t) / calls * 1e6
    torch.cuda.synchronize()
    return dt


def timelines(cases: dict, flush: torch.Tensor, rounds: int) -> dict:
    """Kernel timelines of ``rounds`` rounds, each running every case once after a flush (cases interleaved, so a
    change of the card's clock moves them alike): per case the medians of the gap from the flush's end to its first
    kernel, the span to its last kernel's end and its kernels' busy time (us), and the last round's kernels."""
    for fn in cases.values():
        for _ in range(3):
            fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(rounds):
            for fn in cases.values():
                flush.zero_()
                fn()
        torch.cuda.synchronize()
    path = tempfile.mktemp(suffix=".json")
    prof.export_chrome_trace(path)
    with open(path) as f:
        events = sorted((e for e in json.load(f)["traceEvents"] if e.get("cat") == "kernel"), key=lambda e: e["ts"])
    os.unlink(path)
    flushes = [i for i, e in enumerate(events) if e["dur"] > 20 and "Fill" in e["name"]]
    if len(flushes) != rounds * len(cases):
        raise SystemExit(f"found {len(flushes)} flushes in the kernel trace, expected {rounds * len(cases)}")
    runs = {name: {"gap": [], "span": [], "busy": [], "flush": [], "last": []} for name in cases}
    for n, (a, b) in enumerate(zip(flushes, flushes[1:] + [len(events)])):
        end, kernels = events[a]["ts"] + events[a]["dur"], events[a + 1:b]
        if not kernels:
            raise SystemExit(f"no kernel after flush {n} in the trace")
        r = runs[list(cases)[n % len(cases)]]
        r["gap"].append(kernels[0]["ts"] - end)
        r["span"].append(kernels[-1]["ts"] + kernels[-1]["dur"] - end)
        r["busy"].append(sum(k["dur"] for k in kernels))
        r["flush"].append(events[a]["dur"])
        r["last"] = [(k["name"][:48], round(k["dur"], 1), round(k["ts"] - end, 1)) for k in kernels]
    med = statistics.median
    return {name: {"flush_us": med(r["flush"]), "gap_us": med(r["gap"]), "span_us": med(r["span"]),
                   "busy_us": med(r["busy"]), "last": r["last"]} for name, r in runs.items()}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--step", choices=("fwd", "fwd_bwd"), default="fwd")
    p.add_argument("--shape", default="4x4096x128", help="BxLxD")
    p.add_argument("--W", type=int, default=512)
    p.add_argument("--rounds", type=int, default=20)
    a = p.parse_args()
    B, L, D = (int(x) for x in a.shape.split("x"))
    H, dev, dt = 16, torch.device("cuda"), torch.bfloat16
    g = torch.Generator(device=dev).manual_seed(0)
    q, k, v = (torch.randn(B, H, L, D, generator=g, device=dev).to(dt).requires_grad_() for _ in range(3))
    bias = (0.5 * torch.randn(H, a.W, generator=g, device=dev)).requires_grad_()
    tau = torch.full((H,), -1.0, device=dev).requires_grad_()
    scale = D ** -0.5
    kernels = cute._kernels(q, True)
    flush = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device=dev)

    def cudnn():
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)

    if a.step == "fwd":
        cases = {
            "front end (lazy_attention, backend='cute')": lambda: lazy_attention(q, k, v, bias, tau, backend="cute"),
            "launcher (lazy_attention_fwd.forward)": lambda: launcher_forward(
                kernels, q.detach(), k.detach(), v.detach(), bias.detach(), tau.detach(), scale, None, True),
            "cuDNN (plain causal attention)": cudnn,
        }
    else:
        do = torch.randn(B, H, L, D, generator=g, device=dev).to(dt)
        leaves = (q, k, v, bias, tau)
        cases = {
            "front end (lazy_attention, backend='cute')": lambda: torch.autograd.grad(
                lazy_attention(*leaves, backend="cute"), leaves, do),
            "cuDNN (plain causal attention)": lambda: torch.autograd.grad(cudnn(), (q, k, v), do),
        }
    print(torch.cuda.get_device_name(), torch.__version__, f"B={B} H={H} L={L} D={D} W={a.W}", flush=True)
    found = timelines(cases, flush, a.rounds)
    for name, t in found.items():
        host = host_us(cases[name])
        print(f"{name}: host {host:.1f} us per call; flush {t['flush_us']:.1f} us; flush end to first kernel "
              f"{t['gap_us']:.1f} us, to last kernel's end {t['span_us']:.1f} us; kernels busy {t['busy_us']:.1f} us")
        print("    kernels (us, at us):", ", ".join(f"{n} {d} at {at}" for n, d, at in t["last"]), flush=True)
    cudnn_span = found["cuDNN (plain causal attention)"]["span_us"]
    print("spans against cuDNN's:", ", ".join(f"{name.split(' (')[0]} {t['span_us'] / cudnn_span:.3f}x"
                                             for name, t in found.items()))


if __name__ == "__main__":
    main()
