"""TileLang kernel factory: the mHC pre mixings from the GEMM partials (SPEC section 2).

Per token: h_mix = sum over splits of (hi + lo) partial products (fixed order), inv_rms =
rsqrt(sum x^2 / (n*D) + norm_eps), z = h_mix * inv_rms, then h_pre = sigmoid(a0 z_pre + b_pre) +
pre_eps, h_post = post_mult * sigmoid(a1 z_post + b_post) and h_res = sinkhorn(a2 z_res + b_res)
(softmax over the last dim + eps, a column normalisation, then ``iters - 1`` row/column pairs).
One CTA holds TB tokens; each token's n x n matrix is a slice of a [TB, n, n] fragment.

Layout: Part [S, T, 2M] (hi products, then lo products) fp32 and Sq [S, T] fp64 (from the GEMM kernel);
Alpha [3], Bias [M] fp32.
Outputs, fp32: Z [T, M], InvRms [T], HPre [T, n] (for the apply kernel), HPost [T, n],
HRes [T, n, n] ([in, out]). T symbolic.
"""
from __future__ import annotations

import functools

from ._build import import_tilelang
from ._mhc_common import N_STREAMS


@functools.lru_cache(maxsize=None)
def build(D: int, S: int, sinkhorn_iters: int, post_mult: float, norm_eps: float, pre_eps: float,
          sinkhorn_eps: float, TB: int = 32, threads: int = 128):
    """The mix ``T.prim_func`` for feature size ``D``, ``S`` GEMM splits and the SPEC hyper-parameters.

    Parameters, in order: Part, Sq, Alpha, Bias, Z, InvRms, HPre, HPost, HRes.
    """
    import_tilelang()
    import tilelang.language as T

    n, f32, f64 = N_STREAMS, "float32", "float64"
    M = n * n + 2 * n
    eps = sinkhorn_eps
    nt = T.dynamic("num_tokens")

    @T.prim_func
    def mhc_pre_mix(Part: T.Tensor((S, nt, 2 * M), f32), Sq: T.Tensor((S, nt), f64), Alpha: T.Tensor((3,), f32),
                    Bias: T.Tensor((M,), f32), Z: T.Tensor((nt, M), f32), InvRms: T.Tensor((nt,), f32),
                    HPre: T.Tensor((nt, n), f32), HPost: T.Tensor((nt, n), f32), HRes: T.Tensor((nt, n, n), f32)):
        with T.Kernel(T.ceildiv(nt, TB), threads=threads) as b:
            t0 = b * TB
            pp = T.alloc_shared((TB, 2 * M), f32)
            hm = T.alloc_fragment((TB, M), f32)
            sq_s = T.alloc_fragment((TB,), f64)
            sq = T.alloc_fragment((TB,), f64)
            inv = T.alloc_fragment((TB,), f32)
            z_sh = T.alloc_shared((TB, M), f32)
            T.clear(hm)
            T.clear(sq)
            for s in T.serial(S):
                T.copy(Part[s, t0:t0 + TB, :], pp)
                for i, m in T.Parallel(TB, M):
                    hm[i, m] += pp[i, m] + pp[i, M + m]
                T.copy(Sq[s, t0:t0 + TB], sq_s)
                for i in T.Parallel(TB):
                    sq[i] += sq_s[i]
            for i in T.Parallel(TB):
                inv[i] = T.cast(T.rsqrt(sq[i] / (n * D) + norm_eps), f32)  # fp64: no overflow where inv fits fp32
            for i, m in T.Parallel(TB, M):
                z_sh[i, m] = hm[i, m] * inv[i]
            T.copy(inv, InvRms[t0:t0 + TB])
            T.copy(z_sh, Z[t0:t0 + TB, :])

            for i, j in T.Parallel(TB, n):
                if t0 + i < nt:
                    HPre[t0 + i, j] = T.sigmoid(Alpha[0] * z_sh[i, j] + Bias[j]) + pre_eps
                    HPost[t0 + i, j] = post_mult * T.sigmoid(Alpha[1] * z_sh[i, n + j] + Bias[n + j])

            cm = T.alloc_fragment((TB, n, n), f32)
            row = T.alloc_fragment((TB, n), f32)
            col = T.alloc_fragment((TB, n), f32)
            for i, r, c in T.Parallel(TB, n, n):
                cm[i, r, c] = Alpha[2] * z_sh[i, 2 * n + r * n + c] + Bias[2 * n + r * n + c]
            T.reduce_max(cm, row, dim=2)
            for i, r, c in T.Parallel(TB, n, n):
                cm[i, r, c] = T.exp(cm[i, r, c] - row[i, r])
            T.reduce_sum(cm, row, dim=2)
            for i, r, c in T.Parallel(TB, n, n):
                cm[i, r, c] = cm[i, r, c] / row[i, r] + eps
            T.reduce_sum(cm, col, dim=1)
            for i, r, c in T.Parallel(TB, n, n):
                cm[i, r, c] = cm[i, r, c] / (col[i, c] + eps)
            for _ in T.serial(sinkhorn_iters - 1):
                T.reduce_sum(cm, row, dim=2)
                for i, r, c in T.Parallel(TB, n, n):
                    cm[i, r, c] = cm[i, r, c] / (row[i, r] + eps)
                T.reduce_sum(cm, col, dim=1)
                for i, r, c in T.Parallel(TB, n, n):
                    cm[i, r, c] = cm[i, r, c] / (col[i, c] + eps)
            T.copy(cm, HRes[t0:t0 + TB, :, :])

    return mhc_pre_mix
