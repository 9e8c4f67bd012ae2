"""Time FlashAttention-4's Hopper forward (plain causal softmax attention, two GEMM passes) beside cuDNN's and the
cute backend's two forward kernels, as a measure of what a CuTe DSL kernel reaches per pass on this card.

    python scripts/build_fa4_reference.py OUT        # on a CPU machine with flash-attn-4 and the DSL
    python scripts/gpu_time_fa4_reference.py OUT STORE [--shapes 4x4096x128,4x4096x64,2x16384x128] [--rounds 12]

OUT holds ``fa4_fwd_sm90_d{D}.so`` and ``fa4_fwd_sm90_d128_dv{DV}.so`` (``build_fa4_reference.py``; the second with
value width DV: its score GEMM and online softmax with almost no A V work, beside ``lse_sm90``), STORE the cute kernel
store; the runtime comes from ``KERNEL_DISPATCH_CUTE_RUNTIME``. Shapes are BxLxD with H = 16, bf16, causal; the cute
kernels get W = 512, tau = -1 (``gpu_time_cute_kernels.time_shape``'s inputs). Each FlashAttention-4 output is
checked against torch's SDPA first. Each round times every kernel by CUDA events around ``--calls`` back-to-back
launches (warm L2) in a shuffled order; the script prints minima, medians and the median over rounds of each time
over cuDNN's forward in the same round.
"""
import argparse
import math
import os
import random
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_time_cute_kernels import load_runtime, median, per_call_ms, persistent  # noqa: E402


def fa4_forward(tvm_ffi, out_dir: str, name: str, q, k, v, o, lse, scale: float):
    """A call of FlashAttention-4's compiled forward ``name`` on [B, L, H, D] tensors (its layout), writing o and
    lse [B, H, L]; its optional arguments (varlen, paging, windows, sink, block sparsity) are None."""
    fn = tvm_ffi.load_module(os.path.join(out_dir, f"{name}.so"))[name]
    rest = (None,) * 9 + ((None, None), None, None)  # the aux data is a tuple (tensors, scalars)
    return lambda: fn(q, k, v, o, lse, scale, *rest)


def time_shape(tvm_ffi, out_dir: str, store: str, B: int, L: int, D: int, rounds: int, calls: int,
               narrow_v: list, W: int = 512):
    H = 16
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(B, H, L, D, device="cuda", generator=g).to(torch.bfloat16) for _ in range(3))
    scale = 1 / math.sqrt(D)
    qf, kf, vf = (t.transpose(1, 2).contiguous() for t in (q, k, v))  # FlashAttention's [B, L, H, D]
    lse_fa = torch.empty(B, H, L, device="cuda")
    fa4 = {}
    for dv in [D] + narrow_v:  # value widths: D, and narrower ones (the score pass and its exponentials alone)
        name = f"fa4_fwd_sm90_d{D}" + (f"_dv{dv}" if dv != D else "")
        if not os.path.exists(os.path.join(out_dir, f"{name}.so")):
            continue
        vd = vf[..., :dv].contiguous()
        od = torch.empty(B, L, H, dv, dtype=q.dtype, device="cuda")
        fa4["fa4" if dv == D else f"fa4_dv{dv}"] = call = fa4_forward(tvm_ffi, out_dir, name, qf, kf, vd, od, lse_fa,
                                                                      scale)
        call()
        ref = F.scaled_dot_product_attention(q, k, v[..., :dv], is_causal=True)
        torch.cuda.synchronize()
        err = (od.transpose(1, 2).float() - ref.float()).abs().max().item()
        print(f"B={B} L={L} D={D}: {name} against torch's SDPA: max |diff| {err:.2e} (of {ref.abs().max().item():.2f})",
              flush=True)
        if not err < 2e-2:
            sys.exit(f"{name} does not match torch's SDPA; not timing it")

    bias = 0.1 * torch.randn(H, W, device="cuda", generator=g)
    tau = torch.full((H,), -1.0, device="cuda")
    lens = torch.full((B,), L, dtype=torch.int32, device="cuda")
    lse, o = torch.empty(B, H, L, device="cuda"), torch.empty_like(q)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    kd = {n: tvm_ffi.load_module(f"{store}/kd_lazy_attention_{n}_d{D}_bfloat16_causal.so")[
        f"kd_lazy_attention_{n}_d{D}_bfloat16_causal"] for n in ("lse_sm90", "fwd_sm90")}
    tail = {n: (torch.zeros(1, dtype=torch.int32, device="cuda"), sms) if persistent(store, n, D) else () for n in kd}
    cute_lse = lambda: kd["lse_sm90"](q, k, bias, lens, lse, *tail["lse_sm90"], scale)
    cute_o = lambda: kd["fwd_sm90"](q, k, v, bias, tau, lens, lse, o, *tail["fwd_sm90"], scale)

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    calls_of = {"cudnn": cudnn, **fa4, "cute_lse_sm90": cute_lse, "cute_fwd_sm90": cute_o,
                "cute_forward": lambda: (cute_lse(), cute_o())}
    times = {n: [] for n in calls_of}
    for r in range(rounds):
        order = list(calls_of.items())
        random.Random(r).shuffle(order)
        for n, fn in order:
            times[n].append(per_call_ms(fn, calls))
    for n, t in times.items():
        ratio = median([x / y for x, y in zip(t, times["cudnn"])])
        print(f"B={B} L={L} D={D} {n:14s} min {min(t):.4f} ms  median {median(t):.4f}  "
              f"of cuDNN's forward (paired median) {ratio:.4f}", flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("fa4_dir")
    p.add_argument("store")
    p.add_argument("--shapes", default="4x4096x128,4x4096x64,2x16384x128")
    p.add_argument("--rounds", type=int, default=12)
    p.add_argument("--calls", type=int, default=20)
    p.add_argument("--narrow-v", default="16,32", help="value widths of the FlashAttention-4 builds that time its "
                   "score pass with little A V work (fa4_fwd_sm90_d{D}_dv{DV}.so, where present)")
    a = p.parse_args()
    try:
        shapes = [tuple(int(x) for x in shape.split("x")) for shape in a.shapes.split(",")]
        narrow_v = [int(x) for x in a.narrow_v.split(",") if x]
    except ValueError:
        p.error(f"--shapes / --narrow-v: expected BxLxD items such as 4x4096x128 and integers, got {a.shapes!r}, "
                f"{a.narrow_v!r}")
    if any(len(s) != 3 or s[2] not in (64, 128) or min(s) < 1 for s in shapes):
        p.error(f"--shapes: expected BxLxD items with D 64 or 128 (the cute kernels' head dims), got {a.shapes!r}")
    if a.rounds < 1 or a.calls < 1:
        p.error("--rounds and --calls must be positive")
    if not torch.cuda.is_available():
        p.error("needs a CUDA device (Hopper)")
    for folder, what in ((a.fa4_dir, "fa4_dir"), (a.store, "store")):
        if not os.path.isdir(folder):
            p.error(f"{what}: expected a directory, got {folder!r}")
    tvm_ffi = load_runtime()
    print(torch.cuda.get_device_name(), torch.__version__, flush=True)
    for B, L, D in shapes:
        time_shape(tvm_ffi, a.fa4_dir, a.store, B, L, D, a.rounds, a.calls, narrow_v)


if __name__ == "__main__":
    main()
