"""How fast TileLang runs the two forward sweeps of *plain* causal softmax attention (no bias, no Elastic-Softmax)
at the target shape (bf16, B=4, H=16, L=4096, D=128), next to SDPA cuDNN and this package's lse and fwd kernels:
what a TileLang pass costs before any lazy-attention work (docs/lazy-attention-speed.md, "The toolchain ceiling").

Kernels written here, not shipped: fa_sync, the online-softmax forward with synchronous T.gemm (this package's
structure, 128 x 128 tiles, 2 consumer warpgroups); fa_ordered, the same body under T.Pipelined order/stage (the
QK^T of block k issued before the softmax of block k and the PV of block k - 1, the schedule TileLang's own
examples use); lse_only_128 / _256, the LSE sweep alone (one GEMM and the exponentials; 128 or 256 queries per CTA).
Times are medians of 5 interleaved rounds, each the median of 25 CUDA-event runs with L2 flushed (the package's
Timer).

  python scripts/prebuild_tilelang.py --ceiling            # CPU: these kernels and the package's, for sm_90a
  python -m kernel_dispatch.testing.tilelang_cache unpack  # GPU machine, with .devcache carried
  python scripts/gpu_ceiling_tilelang_attention.py         # GPU
"""
import math
import statistics

from kernel_dispatch.backends.tilelang._build import SM90A, compile_kernel, import_tilelang
from kernel_dispatch.backends.tilelang._lazy_attention_tiles import LOG2E, first_query


def build(kind, D=128, BM=128, BN=128, threads=256, stages=2, dtype="bfloat16"):
    import_tilelang()
    import tilelang.language as T
    f32 = "float32"
    B, H, L = T.dynamic("B, H, L")

    @T.prim_func
    def fa(Q: T.Tensor([B, H, L, D], dtype), K: T.Tensor([B, H, L, D], dtype), V: T.Tensor([B, H, L, D], dtype),
           O: T.Tensor([B, H, L, D], dtype), LSE: T.Tensor([B, H, L], f32), scale: T.float32):
        with T.Kernel(H, B, T.ceildiv(L, BM), threads=threads) as (by, bz, bx):
            Q_s = T.alloc_shared([BM, D], dtype)
            K_s = T.alloc_shared([BN, D], dtype)
            V_s = T.alloc_shared([BN, D], dtype)
            s = T.alloc_fragment([BM, BN], f32)
            p = T.alloc_fragment([BM, BN], dtype)
            acc = T.alloc_fragment([BM, D], f32)
            mx = T.alloc_fragment([BM], f32)
            mx_prev = T.alloc_fragment([BM], f32)
            rescale = T.alloc_fragment([BM], f32)
            bsum = T.alloc_fragment([BM], f32)
            den = T.alloc_fragment([BM], f32)
            m0 = first_query(bx, L, BM, True)  # the shipped kernels' causal order: longest rows first
            sc2 = scale * LOG2E
            T.copy(Q[bz, by, m0:m0 + BM, :], Q_s)
            T.fill(mx, -T.infinity(f32))
            T.fill(den, 0)
            T.clear(acc)
            n_blocks = T.ceildiv(m0 + BM, BN)
            # statements 1-2 (QK^T of block k), 11 and 13 (rescale, PV of block k - 1), then 3-10 (softmax of k)
            pip = dict(order=[-1, 0, 1, 4, 5, 6, 7, 8, 9, 10, 11, 2, -1, 3],
                       stage=[-1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, -1, 1]) if kind == "ordered" else {}
            for k in T.Pipelined(n_blocks, num_stages=stages, **pip):
                T.copy(K[bz, by, k * BN:(k + 1) * BN, :], K_s)                                   # 0
                for i, j in T.Parallel(BM, BN):                                                  # 1
                    s[i, j] = T.if_then_else(m0 + i >= k * BN + j, 0, -T.infinity(f32))
                T.gemm(Q_s, K_s, s, transpose_B=True, policy=T.GemmWarpPolicy.FullRow)          # 2
                T.copy(mx, mx_prev)                                                              # 3
                T.reduce_max(s, mx, dim=1, clear=False)                                          # 4
                for i in T.Parallel(BM):                                                         # 5
                    rescale[i] = T.exp2(mx_prev[i] * sc2 - mx[i] * sc2)
                for i, j in T.Parallel(BM, BN):                                                  # 6
                    s[i, j] = T.exp2(s[i, j] * sc2 - mx[i] * sc2)
                T.reduce_sum(s, bsum, dim=1)                                                     # 7
                for i in T.Parallel(BM):                                                         # 8
                    den[i] = den[i] * rescale[i] + bsum[i]
                T.copy(s, p)                                                                     # 9
                T.copy(mx, mx_prev)                                                              # 10 (redundant)
                for i, j in T.Parallel(BM, D):                                                   # 11
                    acc[i, j] = acc[i, j] * rescale[i]
                T.copy(V[bz, by, k * BN:(k + 1) * BN, :], V_s)                                   # 12
                T.gemm(p, V_s, acc, policy=T.GemmWarpPolicy.FullRow)                             # 13
            for i, j in T.Parallel(BM, D):
                acc[i, j] = acc[i, j] / den[i]
            for i in T.Parallel(BM):
                den[i] = T.log2(den[i]) / LOG2E + mx[i] * scale
            T.copy(den, LSE[bz, by, m0:m0 + BM])
            T.copy(acc, Q_s)
            T.copy(Q_s, O[bz, by, m0:m0 + BM, :])

    @T.prim_func
    def lse_only(Q: T.Tensor([B, H, L, D], dtype), K: T.Tensor([B, H, L, D], dtype), LSE: T.Tensor([B, H, L], f32),
                 scale: T.float32):
        with T.Kernel(H, B, T.ceildiv(L, BM), threads=threads) as (by, bz, bx):
            Q_s = T.alloc_shared([BM, D], dtype)
            K_s = T.alloc_shared([BN, D], dtype)
            s = T.alloc_fragment([BM, BN], f32)
            mx = T.alloc_fragment([BM], f32)
            mx_prev = T.alloc_fragment([BM], f32)
            bsum = T.alloc_fragment([BM], f32)
            den = T.alloc_fragment([BM], f32)
            m0 = first_query(bx, L, BM, True)  # the shipped kernels' causal order: longest rows first
            sc2 = scale * LOG2E
            T.copy(Q[bz, by, m0:m0 + BM, :], Q_s)
            T.fill(mx, -T.infinity(f32))
            T.fill(den, 0)
            for k in T.Pipelined(T.ceildiv(m0 + BM, BN), num_stages=stages):
                T.copy(K[bz, by, k * BN:(k + 1) * BN, :], K_s)
                T.gemm(Q_s, K_s, s, transpose_B=True, clear_accum=True, policy=T.GemmWarpPolicy.FullRow)
                if k * BN + BN > m0:
                    for i, j in T.Parallel(BM, BN):
                        s[i, j] = T.if_then_else(m0 + i >= k * BN + j, s[i, j], -T.infinity(f32))
                T.copy(mx, mx_prev)
                T.reduce_max(s, mx, dim=1, clear=False)
                for i, j in T.Parallel(BM, BN):
                    s[i, j] = T.exp2(s[i, j] * sc2 - mx[i] * sc2)
                T.reduce_sum(s, bsum, dim=1)
                for i in T.Parallel(BM):
                    den[i] = den[i] * T.exp2(mx_prev[i] * sc2 - mx[i] * sc2) + bsum[i]
            for i in T.Parallel(BM):
                den[i] = T.log2(den[i]) / LOG2E + mx[i] * scale
            T.copy(den, LSE[bz, by, m0:m0 + BM])

    return lse_only if kind == "lse" else fa


VARIANTS = {"fa_sync": ("sync", {}), "fa_ordered": ("ordered", {}), "lse_only_128": ("lse", {}),
            "lse_only_256": ("lse", {"BM": 256, "threads": 512})}


def build_variant(name):
    """The T.prim_func of variant ``name`` of VARIANTS (scripts/prebuild_tilelang.py --ceiling compiles these)."""
    kind, kw = VARIANTS[name]
    return build(kind, **kw)


def main():
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import sdpa_kernel, SDPBackend
    from kernel_dispatch.backends.tilelang import lazy_attention as tla
    from kernel_dispatch.ops import lazy_attention_bench as A
    from kernel_dispatch.benchmarks.timing import Settings, Timer
    dev = torch.device("cuda")
    print(torch.cuda.get_device_name(), torch.__version__, flush=True)
    B, H, L, D = 4, 16, 4096, 128
    q, k, v = (torch.randn(B, H, L, D, device=dev, dtype=torch.bfloat16) for _ in range(3))
    scale = 1 / math.sqrt(D)
    o = torch.empty_like(q); lse = torch.empty(B, H, L, device=dev)

    timer = Timer(dev, Settings(warmup=3, min_reps=25, max_reps=25))
    bench = lambda fn: timer.measure(fn)["median_ms"]  # noqa: E731  (L2 flushed, CUDA events, median)

    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        ref = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        cudnn = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)
        fns = {"sdpa_cudnn": cudnn}
    for n in VARIANTS:
        try:
            kern = compile_kernel(build_variant(n), dict(sorted(SM90A.items())))
        except Exception as e:
            print("FAILED", n, type(e).__name__, str(e)[:300]); continue
        if VARIANTS[n][0] == "lse":
            fns[n] = (lambda kern=kern: kern(q, k, lse, scale))
        else:
            fns[n] = (lambda kern=kern: kern(q, k, v, o, lse, scale))
            fns[n](); torch.cuda.synchronize()
            print(n, "max abs err vs cuDNN", (o.float() - ref.float()).abs().max().item(), flush=True)
    s = A.Shape(B, H, L, D, 512)
    t = A.make_inputs(s, torch.bfloat16, dev)
    bias, tau = t.bias.detach(), t.tau.detach()
    lens = torch.full((B,), L, dtype=torch.int32, device=dev)
    lse_k = tla._kernel("lse", q, True); fwd_k = tla._kernel("fwd", q, True)
    fns["ours_lse"] = lambda: lse_k(q, k, bias, lens, lse, scale)
    fns["ours_output"] = lambda: fwd_k(q, k, v, bias, tau, lens, lse, o, scale)
    fns["ours_forward"] = lambda: tla.forward(q, k, v, bias, tau, scale, None, True)
    res = {n: [] for n in fns}
    for _ in range(5):  # interleaved rounds
        for n, f in fns.items():
            res[n].append(bench(f))
    base = statistics.median(res["sdpa_cudnn"])
    for n, r in res.items():
        m = statistics.median(r)
        print(f"{n:14s} {m:.4f} ms  ({m / base:.2f}x cuDNN)  rounds {[round(x, 4) for x in r]}", flush=True)


if __name__ == "__main__":
    main()
