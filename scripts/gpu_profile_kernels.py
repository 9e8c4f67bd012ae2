"""Where the time goes: device time of every kernel in one training step of each benchmark shape.

On the GPU machine:  python3 scripts/gpu_profile_kernels.py [--backends triton,tilelang] [--ops mhc,attn]
  mhc:  the block pre -> identity -> post, T = 16384, n = 4, D = 4096, bf16, forward + backward;
  attn: lazy attention bf16 causal B=4, H=16, L=4096, D=128, W=512, tau=-1, forward + backward.
Each step runs twice (compile, autotune), then once under torch.profiler; the table lists every kernel
with its device time in microseconds, largest first, and the fraction of the step it takes.
"""
from __future__ import annotations

import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def mhc_step(backend, T=16384, D=4096):
    import torch

    import kernel_dispatch as kd
    g = torch.Generator(device="cpu").manual_seed(0)
    n, M = 4, 24
    x = torch.randn(T, n, D, generator=g).to(torch.bfloat16).cuda().requires_grad_()
    phi = (0.05 * torch.randn(M, n * D, generator=g)).cuda().requires_grad_()
    alpha = torch.tensor([0.8, 1.2, 0.9]).cuda().requires_grad_()
    bias = (0.3 * torch.randn(M, generator=g)).cuda().requires_grad_()
    gamma = (1 + 0.1 * torch.randn(n * D, generator=g)).cuda().requires_grad_()
    gout = torch.randn(T, n, D, generator=g).to(torch.bfloat16).cuda()

    def step():
        h_in, hp, hr, x_res = kd.mhc_pre(x, phi, alpha, bias, gamma, backend=backend, return_residual=True)
        out = kd.mhc_post(h_in, x_res, hp, hr, backend=backend)
        torch.autograd.grad(out, [x, phi, alpha, bias, gamma], gout)
    return step


def attn_step(backend, B=4, H=16, L=4096, D=128, W=512):
    import torch

    import kernel_dispatch as kd
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (torch.randn(B, H, L, D, device="cuda", generator=g, dtype=torch.bfloat16) for _ in range(4))
    leaves = [t.requires_grad_() for t in (q, k, v)]
    bias = (0.5 * torch.randn(H, W, device="cuda", generator=g)).requires_grad_()
    tau = torch.full((H,), -1.0, device="cuda", requires_grad=True)

    def step():
        o = kd.lazy_attention(*leaves, bias, tau, backend=backend)
        torch.autograd.grad(o, leaves + [bias, tau], do)
    return step


def kernel_rows(step):
    """[(device us, launches, kernel name)] of one call of ``step`` under the CUDA profiler, largest first."""
    import torch
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as prof_ctx
    with prof_ctx(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    rows = []
    for ev in prof.key_averages():
        t = getattr(ev, "device_time_total", None) or getattr(ev, "cuda_time_total", 0)
        if t > 0:
            rows.append((t, ev.count, ev.key))
    return sorted(rows, reverse=True)


def profile(name, step):
    import torch
    step()
    step()
    torch.cuda.synchronize()
    rows = kernel_rows(step)
    total = sum(r[0] for r in rows)
    print(f"\n== {name}: {total:.0f} us of kernels in one step", flush=True)
    for t, c, key in rows[:14]:
        print(f"  {t:9.1f} us {100 * t / total:5.1f}%  x{c:<3d} {key[:100]}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backends", default="triton,tilelang")
    ap.add_argument("--ops", default="mhc,attn")
    a = ap.parse_args()
    for op in a.ops.split(","):
        for b in a.backends.split(","):
            try:
                profile(f"{op} {b}", (mhc_step if op == "mhc" else attn_step)(b))
            except Exception as e:  # report and go on with the next
                print(f"== {op} {b}: failed {type(e).__name__}: {str(e)[-300:]}", flush=True)


if __name__ == "__main__":
    main()
