"""Where the packed-document kernel loses against the fixed-length one at equal document lengths (GPU only).

bf16, H=16, D=128, W=512, tau=-1, causal, 4 documents of 4096 tokens: the Triton fixed-length kernels on
[B, H, L, D] contiguous inputs, the same kernels on the packed tensors viewed as [B, H, L, D] (strides of a
[T, H, D] tensor), and ``lazy_attention_varlen`` on the packed tensors; forward and forward+backward, median
ms by triton.testing.do_bench. Run: ``python scripts/gpu_probe_varlen_layout.py [--backends triton,tilelang]``.
"""
from __future__ import annotations

import argparse

import torch
import triton.testing

import kernel_dispatch as kd


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backends", default="triton")
    ap.add_argument("--docs", type=int, default=4)
    ap.add_argument("--L", type=int, default=4096)
    args = ap.parse_args()
    N, L, H, D, W = args.docs, args.L, 16, 128, 512
    T = N * L
    g = torch.Generator(device="cuda").manual_seed(0)
    dev, dt = "cuda", torch.bfloat16
    packed = [torch.randn(T, H, D, device=dev, dtype=dt, generator=g) for _ in range(3)]
    contiguous = [t.view(N, L, H, D).transpose(1, 2).contiguous() for t in packed]
    bias = (0.1 * torch.randn(H, W, device=dev, generator=g)).requires_grad_()
    tau = torch.full((H,), -1.0, device=dev, requires_grad=True)
    cu = torch.arange(0, T + 1, L, device=dev, dtype=torch.int32)

    def fixed(ts, backend, as_views=False):
        def run():
            q, k, v = [t.view(N, L, H, D).transpose(1, 2) for t in ts] if as_views else ts
            return kd.lazy_attention(q, k, v, bias, tau, causal=True, backend=backend)
        return run

    def varlen(backend):
        return lambda: kd.lazy_attention_varlen(*packed, bias, tau, cu, max_seqlen=L, causal=True, backend=backend)

    def fwd_bwd(fn, ts):
        leaves = [t.requires_grad_() for t in ts]

        def run():
            o = fn()
            torch.autograd.grad(o, leaves + [bias, tau], torch.ones_like(o))
        return run

    for backend in args.backends.split(","):
        for name, fn, ts in (("fixed, [B, H, L, D] contiguous", fixed(contiguous, backend), contiguous),
                             ("fixed, views of [T, H, D]", fixed(packed, backend, True), packed),
                             ("varlen, [T, H, D]", varlen(backend), packed)):
            with torch.no_grad():
                f = triton.testing.do_bench(fn, warmup=50, rep=300)
            fb = triton.testing.do_bench(fwd_bwd(fn, ts), warmup=20, rep=300)
            print(f"{backend:9s} {name:34s} fwd {f:.4f} ms  fwd+bwd {fb:.4f} ms", flush=True)


if __name__ == "__main__":
    main()
