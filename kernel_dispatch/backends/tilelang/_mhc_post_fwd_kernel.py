"""TileLang kernel factory: mHC post forward (SPEC section 3).

out[t, o, d] = h_post[t, o] * f[t, d] + sum_i h_res[t, i, o] * x[t, i, d], fp32 math, stored in
x's dtype. One CTA per (token, block of ROW_BLOCK features): every thread loads 16-byte vectors
of f and of the n streams of x straight into registers and writes n 16-byte vectors of out.

Layout (contiguous): F [T, D], X [T, n, D], Out [T, n, D] in ``dtype``; HPost [T, n],
HRes [T, n, n] fp32 ([in, out]). T is symbolic; D is static (any multiple of 8: the last feature
block is masked).
"""
from __future__ import annotations

import functools

from ._build import import_tilelang
from ._mhc_common import N_STREAMS, feature_block


@functools.lru_cache(maxsize=None)
def build(D: int, dtype: str, threads: int = 128):
    """The forward ``T.prim_func`` for feature size ``D`` and ``dtype`` (float16/bfloat16/float32).

    Parameters, in order: F, X, HPost, HRes, Out.
    """
    import_tilelang()
    import tilelang.language as T

    n, f32 = N_STREAMS, "float32"
    blk = feature_block(D)
    nt = T.dynamic("num_tokens")

    @T.prim_func
    def mhc_post_fwd(F: T.Tensor((nt, D), dtype), X: T.Tensor((nt, n, D), dtype), HPost: T.Tensor((nt, n), f32),
                     HRes: T.Tensor((nt, n, n), f32), Out: T.Tensor((nt, n, D), dtype)):
        with T.Kernel(T.ceildiv(D, blk), nt, threads=threads) as (bd, t):
            hp = T.alloc_fragment((n,), f32)
            hr = T.alloc_fragment((n, n), f32)
            xl = T.alloc_fragment((n, blk), dtype)
            fl = T.alloc_fragment((blk,), dtype)
            ol = T.alloc_fragment((n, blk), dtype)
            T.copy(HPost[t, 0], hp)
            T.copy(HRes[t, 0, 0], hr)
            T.copy(X[t, 0, bd * blk], xl)
            T.copy(F[t, bd * blk], fl)
            for o, j in T.Parallel(n, blk):
                acc = T.alloc_var(f32)
                acc = hp[o] * fl[j]
                for i in T.serial(n):
                    acc += hr[i, o] * xl[i, j]
                ol[o, j] = acc
            T.copy(ol, Out[t, 0, bd * blk])

    return mhc_post_fwd
