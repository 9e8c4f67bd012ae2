"""TileLang kernel factory: mHC post backward (SPEC section 3).

For upstream g = d out: df[d] = sum_o h_post[o] g[o, d]; dx[i, d] = sum_o h_res[i, o] g[o, d];
dh_post[o] = sum_d f[d] g[o, d]; dh_res[i, o] = sum_d x[i, d] g[o, d]. One CTA per token walks
the feature dim in blocks of ROW_BLOCK (16-byte vectors into registers), writes df and dx, and
keeps the 20 per-token sums in registers; one fixed-order block reduction ends it, so dh_post
and dh_res are deterministic.

Layout (contiguous): G [T, n, D], X [T, n, D], DX [T, n, D], F [T, D], DF [T, D] in ``dtype``;
HPost, DHPost [T, n] and HRes, DHRes [T, n, n] fp32. T is symbolic, D static (multiple of 8).
"""
from __future__ import annotations

import functools

from ._build import import_tilelang
from ._mhc_common import N_STREAMS, feature_block


@functools.lru_cache(maxsize=None)
def build(D: int, dtype: str, threads: int = 128):
    """The backward ``T.prim_func`` for feature size ``D`` and ``dtype``.

    Parameters, in order: G, F, X, HPost, HRes, DF, DX, DHPost, DHRes.
    """
    import_tilelang()
    import tilelang.language as T

    n, f32 = N_STREAMS, "float32"
    blk = feature_block(D)
    nt = T.dynamic("num_tokens")

    @T.prim_func
    def mhc_post_bwd(G: T.Tensor((nt, n, D), dtype), F: T.Tensor((nt, D), dtype), X: T.Tensor((nt, n, D), dtype),
                     HPost: T.Tensor((nt, n), f32), HRes: T.Tensor((nt, n, n), f32), DF: T.Tensor((nt, D), dtype),
                     DX: T.Tensor((nt, n, D), dtype), DHPost: T.Tensor((nt, n), f32),
                     DHRes: T.Tensor((nt, n, n), f32)):
        with T.Kernel(nt, threads=threads) as t:
            hp = T.alloc_fragment((n,), f32)
            hr = T.alloc_fragment((n, n), f32)
            T.copy(HPost[t, 0], hp)
            T.copy(HRes[t, 0, 0], hr)
            red_p = T.alloc_reducer((n,), f32)
            red_r = T.alloc_reducer((n, n), f32)
            T.reducer_init(red_p)
            T.reducer_init(red_r)
            gl = T.alloc_fragment((n, blk), dtype)
            xl = T.alloc_fragment((n, blk), dtype)
            fl = T.alloc_fragment((blk,), dtype)
            dxl = T.alloc_fragment((n, blk), dtype)
            dfl = T.alloc_fragment((blk,), dtype)
            for bd in T.unroll(T.ceildiv(D, blk)):
                T.copy(G[t, 0, bd * blk], gl)
                T.copy(X[t, 0, bd * blk], xl)
                T.copy(F[t, bd * blk], fl)
                for j in T.Parallel(blk):
                    acc_f = T.alloc_var(f32)
                    acc_x = T.alloc_local((n,), f32)
                    acc_f = 0.0
                    for i in T.serial(n):
                        acc_x[i] = 0.0
                    for o in T.serial(n):
                        g = T.cast(gl[o, j], f32)
                        acc_f += hp[o] * g
                        T.reducer_update(red_p[o], fl[j] * g)
                        for i in T.serial(n):
                            acc_x[i] += hr[i, o] * g
                            T.reducer_update(red_r[i, o], xl[i, j] * g)
                    dfl[j] = acc_f
                    for i in T.serial(n):
                        dxl[i, j] = acc_x[i]
                T.copy(dfl, DF[t, bd * blk])
                T.copy(dxl, DX[t, 0, bd * blk])
            sp = T.alloc_fragment((n,), f32)
            sr = T.alloc_fragment((n, n), f32)
            T.finalize_reducer(red_p, sp, batch=n)
            T.finalize_reducer(red_r, sr, batch=n * n)
            T.copy(sp, DHPost[t, 0])
            T.copy(sr, DHRes[t, 0, 0])

    return mhc_post_bwd
