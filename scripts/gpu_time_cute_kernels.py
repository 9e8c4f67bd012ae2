"""Time the cute backend's lazy-attention kernels of several kernel stores against each other on one GPU.

    python scripts/gpu_time_cute_kernels.py old=STORE_A new=STORE_B [--shapes 4x4096x128,4x4096x64] [--rounds 8]

Each STORE is a directory of built kernels (``python -m kernel_dispatch.backends.cute.build --out DIR``, or
``scripts/build_cute_variants.py``); the runtime comes from ``KERNEL_DISPATCH_CUTE_RUNTIME`` (or the installed DSL).
Shapes are BxLxD with H = 16, bf16, causal, W = 512 (``--W``), tau = -1. The forward ("fwd") is lse_sm90 then
fwd_sm90 where the store has lse_sm90 (timed alone too, "lse"), else fwd_sm90 alone (a store of the one-kernel
forward). For each shape the script first runs the forward, dq_sm90 and dkdv_sm90 of every store once
(their outputs NaN-filled before) and says whether their outputs are bitwise equal to the first store's (else the
largest difference of each output, against its largest magnitude), then
times each kernel by CUDA events around ``--calls`` back-to-back launches (warm L2, launch overhead hidden), stores in
a shuffled order each round, with cuDNN's forward and forward+backward (plain causal attention) in the same rounds.
It prints the minimum and the median over the rounds of the per-launch mean. The stores' source hashes are not
checked: the kernels are loaded directly. "bwd" times dq_sm90 then dkdv_sm90 back to back, as the launcher runs them
(the second a dependent launch of the first). A persistent kernel gets one counter per store, which its last tile
claim sets back to zero, so no fill runs between lse_sm90 and fwd_sm90 (a store whose kernels leave their counter
set gets a zeroed one per call, and the script says so).
"""
import argparse
import json
import math
import os
import random
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

KERNELS = ("fwd_sm90", "dq_sm90", "dkdv_sm90")
OUTPUTS = ("o", "lse", "dq", "delta", "dk", "dv", "partial")
WRITTEN_BY = {"fwd": ("o", "lse"), "dq": ("dq", "delta"), "dkdv": ("dk", "dv", "partial"),
              "bwd": ("dq", "delta", "dk", "dv", "partial")}  # (the rest: unset)


def load_runtime():
    """tvm_ffi with ``libcute_dsl_runtime.so`` loaded, as the backend loads them (``KERNEL_DISPATCH_CUTE_RUNTIME``
    or the installed DSL)."""
    from kernel_dispatch.backends.cute import _store

    reason = _store.runtime_unavailable()
    if reason:
        sys.exit(f"cute runtime: {reason}")
    return _store._load_runtime()


def per_call_ms(fn, calls: int) -> float:
    """Mean ms of one call over ``calls`` back-to-back calls between two CUDA events (after one warm-up call)."""
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / calls


def sidecar_args(store: str, kernel: str, D: int) -> list[str]:
    """The argument descriptions in the sidecar of the store's ``kernel`` (bf16, causal, head dim D); [] if absent."""
    path = f"{store}/kd_lazy_attention_{kernel}_d{D}_bfloat16_causal.json"
    return json.load(open(path))["args"] if os.path.exists(path) else []


def persistent(store: str, kernel: str, D: int) -> bool:
    """Whether the store's ``kernel`` is persistent: its arguments name a counter."""
    return any("counter" in a for a in sidecar_args(store, kernel, D))


def dq_writes_partial(store: str, D: int) -> bool:
    """Whether the store's ``dq_sm90`` takes Partial (zeroing its dbias columns, the Rdiv block sums in its last
    column) instead of an Rdiv vector: its arguments name it."""
    return any(a.startswith("partial") for a in sidecar_args(store, "dq_sm90", D))


def time_shape(tvm_ffi, stores: dict, B: int, L: int, D: int, rounds: int, calls: int,
               kernels=("fwd", "dq", "dkdv"), W: int = 512):
    H = 16
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (torch.randn(B, H, L, D, device="cuda", generator=g).to(torch.bfloat16) for _ in range(4))
    bias = 0.1 * torch.randn(H, W, device="cuda", generator=g)
    tau = torch.full((H,), -1.0, device="cuda")
    lens = torch.full((B,), L, dtype=torch.int32, device="cuda")
    scale = 1 / math.sqrt(D)
    lse, delta, rdiv = (torch.empty(B, H, L, device="cuda") for _ in range(3))
    o, dq, dk, dv = (torch.empty_like(q) for _ in range(4))
    # (causal needs min(W, L) of the 2 min(W, L) - 1 dbias entries; the last column: dq_sm90's Rdiv block sums)
    partial = torch.zeros(B, H, L // 64, 2 * min(W, L), device="cuda")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    calls_of, counters_of, forward_of = {}, {}, {}
    for tag, d in stores.items():
        f = {n: tvm_ffi.load_module(f"{d}/kd_lazy_attention_{n}_d{D}_bfloat16_causal.so")[
            f"kd_lazy_attention_{n}_d{D}_bfloat16_causal"] for n in KERNELS}
        # a persistent kernel (its sidecar's arguments name a counter) takes a counter and the SM count too: one
        # zeroed counter per store and kernel, which the kernel's last tile claim sets back to zero (no fill between
        # lse_sm90 and fwd_sm90, as the launcher runs them)
        tail = {n: (torch.zeros(1, dtype=torch.int32, device="cuda"), sms) if persistent(d, n, D) else ()
                for n in ("fwd_sm90", "lse_sm90")}
        extra = {n: (lambda t=t: t) for n, t in tail.items()}
        counters_of[tag] = (tail, extra)
        fwd = (lambda f=f, x=extra: f["fwd_sm90"](q, k, v, bias, tau, lens, lse, o, *x["fwd_sm90"](), scale))
        lse_so = f"{d}/kd_lazy_attention_lse_sm90_d{D}_bfloat16_causal.so"
        if os.path.exists(lse_so):  # the forward in two kernels: lse_sm90, then fwd_sm90 from its LSE
            f["lse_sm90"] = tvm_ffi.load_module(lse_so)[f"kd_lazy_attention_lse_sm90_d{D}_bfloat16_causal"]
            fwd = (lambda f=f, x=extra: (f["lse_sm90"](q, k, bias, lens, lse, *x["lse_sm90"](), scale),
                                         f["fwd_sm90"](q, k, v, bias, tau, lens, lse, o, *x["fwd_sm90"](), scale)))
        forward_of[tag] = fwd
        calls_of[tag] = {
            "fwd": fwd,
            "dq": lambda f=f, r=partial if dq_writes_partial(d, D) else rdiv: f["dq_sm90"](
                q, k, v, do, lse, o, bias, tau, lens, dq, delta, r, scale),
            "dkdv": lambda f=f: f["dkdv_sm90"](q, k, v, do, lse, delta, bias, tau, lens, dk, dv, partial, L, scale),
        }
        calls_of[tag]["bwd"] = lambda c=calls_of[tag]: (c["dq"](), c["dkdv"]())  # as the launcher runs them
        if "lse_sm90" in f and "fwd" in kernels:  # its first kernel alone too
            calls_of[tag]["lse"] = lambda f=f, x=extra: f["lse_sm90"](q, k, bias, lens, lse, *x["lse_sm90"](), scale)
        calls_of[tag] = {n: fn for n, fn in calls_of[tag].items() if n in kernels or n == "lse"}
    outs = {}
    written = dict(zip(OUTPUTS, (o, lse, dq, delta, dk, dv, partial)))
    if "fwd" not in kernels:  # the backward kernels read O and the LSE: the first store's forward writes them once
        forward_of[next(iter(stores))]()
    for tag, c in calls_of.items():
        partial.zero_()
        for name in (n for k in kernels for n in WRITTEN_BY[k] if n != "partial"):
            written[name].fill_(float("nan"))  # an output a store's kernel fails to write shows as a difference
        for name in ("fwd", "lse", "dq", "bwd", "dkdv"):  # each reads what the one before wrote (Delta: dq)
            if name in c:
                c[name]()
        torch.cuda.synchronize()
        tail, extra = counters_of[tag]
        for n, t in tail.items():
            if t and t[0].item() != 0:  # kernels that leave their counter at the tile count: a zeroed one per call
                print(f"{tag}: {n} does not reset its counter; a zeroed counter per call", flush=True)
                extra[n] = lambda: (torch.zeros(1, dtype=torch.int32, device="cuda"), sms)
        outs[tag] = [t.clone() for t in (o, lse, dq, delta, dk, dv, partial[..., :-1])]  # (the dbias entries)
    first = next(iter(outs))
    for tag, got in outs.items():
        diffs = [f"{n} {(a.float() - b.float()).abs().max().item():.2e} of {b.float().abs().max().item():.1e}"
                 for n, a, b in zip(OUTPUTS, got, outs[first])
                 if any(n in WRITTEN_BY[k] for k in kernels) and not torch.equal(a, b)]
        print(f"B={B} L={L} D={D} {tag}: " + ("bitwise equal to " + first if not diffs else
                                              f"differs from {first}: " + ", ".join(diffs)), flush=True)
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))

    def cudnn_fwd():
        return F.scaled_dot_product_attention(qg, kg, vg, is_causal=True)

    def cudnn_fwd_bwd():
        return torch.autograd.grad(cudnn_fwd(), (qg, kg, vg), do)

    times = {tag: {n: [] for n in c} for tag, c in calls_of.items()}
    times["cudnn"] = {"fwd": [], "fwd+bwd": []}
    for r in range(rounds):
        order = list(calls_of.items())
        random.Random(r).shuffle(order)
        for tag, c in order:
            for n, fn in c.items():
                times[tag][n].append(per_call_ms(fn, calls))
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            times["cudnn"]["fwd"].append(per_call_ms(cudnn_fwd, calls))
            times["cudnn"]["fwd+bwd"].append(per_call_ms(cudnn_fwd_bwd, calls))
    base = next(iter(calls_of))
    for tag, t in times.items():
        cells = [f"{n} {min(v):.4f} (median {median(v):.4f})" for n, v in t.items()]
        total = f"  sum {sum(min(v) for v in t.values()):.4f}" if tag != "cudnn" else ""
        # paired within each round (the clock drifts between rounds): this store over the first, and over cuDNN
        pairs = [f"{n}/{base} {median([x / y for x, y in zip(v, times[base][n])]):.4f}"
                 for n, v in t.items() if tag not in (base, "cudnn")]
        pairs += [f"fwd/cudnn {median([x / y for x, y in zip(t['fwd'], times['cudnn']['fwd'])]):.3f}"
                  for _ in [0] if tag != "cudnn" and "fwd" in t]
        print(f"B={B} L={L} D={D} {tag:8s} " + "  ".join(cells) + total + ("  paired medians: " + "  ".join(pairs)
                                                                        if pairs else ""), flush=True)


def median(values):
    """The middle value (upper middle for an even count)."""
    return sorted(values)[len(values) // 2]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("stores", nargs="+", help="TAG=DIR: a kernel store to time under the name TAG")
    p.add_argument("--shapes", default="4x4096x128,4x4096x64,2x16384x128", help="comma list of BxLxD")
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--calls", type=int, default=20, help="back-to-back launches per timing")
    p.add_argument("--W", type=int, default=512, help="bias length (distances with a learned bias)")
    p.add_argument("--kernels", default="fwd,dq,dkdv",
                   help="comma list of the kernels to time (fwd, dq, dkdv; bwd: dq then dkdv)")
    a = p.parse_args()
    if a.W < 1:
        p.error(f"--W: expected a bias length >= 1, got {a.W}")
    stores = {}
    for s in a.stores:
        tag, sep, d = s.partition("=")
        if not sep or not os.path.isdir(d):
            sys.exit(f"stores: expected TAG=DIR with an existing directory, got {s!r}")
        stores[tag] = d
    tvm_ffi = load_runtime()
    for shape in a.shapes.split(","):
        B, L, D = (int(x) for x in shape.split("x"))
        time_shape(tvm_ffi, stores, B, L, D, a.rounds, a.calls, tuple(a.kernels.split(",")), a.W)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
