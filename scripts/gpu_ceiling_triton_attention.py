"""How fast Triton (the GPU machine's version) runs the two forward sweeps of *plain* causal softmax attention (no
bias, no Elastic-Softmax) at B=4, H=16, L=4096, D=128 bf16, next to SDPA cuDNN: what a Triton pass costs before any
lazy-attention work (docs/lazy-attention-speed.md, "The toolchain ceiling"). The kernel (written here, not shipped) is
the online-softmax forward, causal blocks masked only on the diagonal; WITH_PV=False leaves the LSE sweep alone. Each
of eight tile configs is timed, then the best again in 5 rounds interleaved with cuDNN (the package's Timer: L2
flushed, CUDA events, median).

  python scripts/gpu_ceiling_triton_attention.py   # GPU, with the package importable (make install, or PYTHONPATH=.)
"""
import math, statistics
import torch, triton, triton.language as tl
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend

from kernel_dispatch.benchmarks.timing import Settings, Timer


@triton.jit
def _sweep(q, K, V, base, offs_m, offs_d, m_i, l_i, acc, lo, hi, qk_scale, D: tl.constexpr, BN: tl.constexpr,
           CAUSAL_MASK: tl.constexpr, WITH_PV: tl.constexpr):
    """Online softmax over key blocks [lo, hi); unmasked blocks fold the scale into the exponent's FMA."""
    for start_n in range(lo, hi, BN):
        offs_n = start_n + tl.arange(0, BN)
        k = tl.load(K + base + offs_n[:, None] * D + offs_d[None, :])
        s = tl.dot(q, tl.trans(k))
        if CAUSAL_MASK:
            s = tl.where(offs_m[:, None] >= offs_n[None, :], s * qk_scale, -float("inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            p = tl.math.exp2(s - m_new[:, None])
        else:
            m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
            p = tl.math.exp2(s * qk_scale - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        if WITH_PV:
            v = tl.load(V + base + offs_n[:, None] * D + offs_d[None, :])
            acc = acc * alpha[:, None]
            acc = tl.dot(p.to(v.dtype), v, acc)
        m_i = m_new
    return m_i, l_i, acc


@triton.jit
def fa_fwd(Q, K, V, O, LSE, L, qk_scale, D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, WITH_PV: tl.constexpr):
    pid_m = tl.num_programs(0) - 1 - tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    base = bh * L * D
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_d = tl.arange(0, D)
    q = tl.load(Q + base + offs_m[:, None] * D + offs_d[None, :])
    m_i = tl.full([BM], -float("inf"), tl.float32)
    l_i = tl.zeros([BM], tl.float32)
    acc = tl.zeros([BM, D], tl.float32)
    full = pid_m * BM  # key blocks before this need no mask (BN divides BM)
    m_i, l_i, acc = _sweep(q, K, V, base, offs_m, offs_d, m_i, l_i, acc, 0, full, qk_scale, D, BN, False, WITH_PV)
    m_i, l_i, acc = _sweep(q, K, V, base, offs_m, offs_d, m_i, l_i, acc, full, (pid_m + 1) * BM, qk_scale, D, BN,
                           True, WITH_PV)
    tl.store(LSE + bh * L + offs_m, m_i + tl.math.log2(l_i))
    if WITH_PV:
        tl.store(O + base + offs_m[:, None] * D + offs_d[None, :], (acc / l_i[:, None]).to(O.dtype.element_ty))


def main():
    dev = torch.device("cuda")
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__, flush=True)
    B, H, L, D = 4, 16, 4096, 128
    q, k, v = (torch.randn(B, H, L, D, device=dev, dtype=torch.bfloat16) for _ in range(3))
    o = torch.empty_like(q); lse = torch.empty(B * H, L, device=dev)
    qk_scale = 1 / math.sqrt(D) * 1.4426950408889634

    timer = Timer(dev, Settings(warmup=3, min_reps=25, max_reps=25))
    bench = lambda fn: timer.measure(fn)["median_ms"]  # noqa: E731  (L2 flushed, CUDA events, median)

    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        ref = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        cudnn = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)
        base = statistics.median(bench(cudnn) for _ in range(3))
    print(f"sdpa_cudnn {base:.4f} ms", flush=True)
    for with_pv in (True, False):
        best = None
        for BM, BN, warps, stages in [(128, 128, 8, 2), (128, 128, 8, 3), (128, 64, 8, 2), (128, 64, 8, 3),
                                      (128, 64, 4, 3), (128, 128, 4, 2), (64, 64, 4, 3), (64, 64, 4, 4)]:
            def fn(BM=BM, BN=BN, warps=warps, stages=stages):
                fa_fwd[(L // BM, B * H)](q, k, v, o, lse, L, qk_scale, D, BM, BN, with_pv, num_warps=warps,
                                         num_stages=stages)
            try:
                fn(); torch.cuda.synchronize()
                if with_pv:
                    err = (o.float() - ref.float()).abs().max().item()
                    assert err < 2e-2, err
                t = bench(fn)
            except Exception as e:
                print(f"  {BM}x{BN} w{warps} s{stages}: failed {type(e).__name__} {str(e)[:120]}", flush=True); continue
            print(f"  {'fa' if with_pv else 'lse'} {BM}x{BN} w{warps} s{stages}: {t:.4f} ms ({t / base:.2f}x)", flush=True)
            if best is None or t < best[0]:
                best = (t, (BM, BN, warps, stages))
        # the best again, interleaved with cuDNN
        BM, BN, warps, stages = best[1]
        fn = lambda: fa_fwd[(L // BM, B * H)](q, k, v, o, lse, L, qk_scale, D, BM, BN, with_pv, num_warps=warps,
                                               num_stages=stages)
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            r = [(bench(fn), bench(cudnn)) for _ in range(5)]
        t, c = statistics.median(x[0] for x in r), statistics.median(x[1] for x in r)
        print(f"{'plain FA forward' if with_pv else 'plain LSE sweep'} best {best[1]}: {t:.4f} ms vs cuDNN {c:.4f} "
              f"= {t / c:.2f}x", flush=True)


if __name__ == "__main__":
    main()
