"""TileLang kernel factory: the mHC pre GEMM h_mix = x @ (phi * gamma)^T and sum(x^2), split over K.

CTA (token block, K split s) streams its tiles of x and of W = [hi; lo] (bf16 pieces of
phi * gamma, see ``_mhc_pre_weights_kernel``) through a TMA pipeline into bf16 wgmma, and sums
x^2 from the same shared tiles. x is read once here; the partial products of the two pieces
and the partial sums of squares are written per split and reduced in a fixed order by the mix
kernel.

x may come in P bf16 pieces (P = 1 for bf16 x; P = 2 for fp16 x, split exactly as
x = hi + lo by the launcher), laid side by side: X [T, P*K], piece p in columns p*K .. p*K+K-1.

Layout: X [T, P*K] bf16, W [2M, K] bf16; Part [S, T, 2M] fp32 (columns m and M+m are the hi and
lo products of row m); Sq [S, T] fp64 (squares of bf16 x beyond 1.8e19 do not fit fp32). T symbolic; K = n*D
static, a multiple of S*BK.
"""
from __future__ import annotations

import functools

from ._build import import_tilelang


def splits_and_block(K: int) -> tuple[int, int]:
    """(S, BK): the K splits and the K tile for K = n*D (S*BK divides K)."""
    S = 2 if K >= 8192 else 1
    for BK in (64, 32):
        if K % (S * BK) == 0:
            return S, BK
    raise ValueError(f"K = n*D = {K}: expected a multiple of 32")


@functools.lru_cache(maxsize=None)
def build(K: int, M: int = 24, P: int = 1, BT: int = 128, stages: int = 4, threads: int = 256):
    """The GEMM ``T.prim_func`` for K = n*D columns, M mixing rows and P pieces of x.

    Parameters, in order: X, W, Part, Sq.
    """
    import_tilelang()
    import tilelang.language as T

    S, BK = splits_and_block(K)
    KS, N, f32, f64, bf = K // S, 2 * M, "float32", "float64", "bfloat16"
    nt = T.dynamic("num_tokens")

    @T.prim_func
    def mhc_pre_gemm(X: T.Tensor((nt, P * K), bf), W: T.Tensor((N, K), bf), Part: T.Tensor((S, nt, N), f32),
                     Sq: T.Tensor((S, nt), f64)):
        with T.Kernel(T.ceildiv(nt, BT), S, threads=threads) as (bt, s):
            acc = T.alloc_fragment((BT, N), f32)
            sq_acc = T.alloc_fragment((BT, BK), f64)
            sq_row = T.alloc_fragment((BT,), f64)
            xs0 = T.alloc_shared((BT, BK), bf)
            xs1 = T.alloc_shared((BT, BK), bf)
            ws = T.alloc_shared((N, BK), bf)
            xf = T.alloc_fragment((BT, BK), f32)
            T.clear(acc)
            T.clear(sq_acc)
            for kk in T.Pipelined(KS // BK, num_stages=stages):
                k0 = s * KS + kk * BK
                T.copy(X[bt * BT:(bt + 1) * BT, k0:k0 + BK], xs0)
                if P == 2:
                    T.copy(X[bt * BT:(bt + 1) * BT, K + k0:K + k0 + BK], xs1)
                T.copy(W[:, k0:k0 + BK], ws)
                T.gemm(xs0, ws, acc, transpose_B=True, policy=T.GemmWarpPolicy.FullRow)
                if P == 2:
                    T.gemm(xs1, ws, acc, transpose_B=True, policy=T.GemmWarpPolicy.FullRow)
                    for i, j in T.Parallel(BT, BK):
                        xf[i, j] = T.cast(xs0[i, j], f32) + T.cast(xs1[i, j], f32)
                else:
                    T.copy(xs0, xf)
                for i, j in T.Parallel(BT, BK):
                    sq_acc[i, j] += T.cast(xf[i, j], f64) * T.cast(xf[i, j], f64)
            T.reduce_sum(sq_acc, sq_row, dim=1)
            T.copy(acc, Part[s, bt * BT:(bt + 1) * BT, :])
            T.copy(sq_row, Sq[s, bt * BT:(bt + 1) * BT])

    return mhc_pre_gemm
