"""TileLang kernel factory: dh_pre[t, i] = sum_d x[t, i, d] * dh_in[t, d] (mHC pre backward).

One CTA per token walks the feature dim in blocks of ROW_BLOCK (16-byte vectors into registers),
keeps n running sums per thread and ends with one fixed-order block reduction (deterministic).
Tokens run last to first, so the first reads tend to hit what mhc_post's backward left in L2.

Layout (contiguous): X [T, n, D] and GIn [T, D] in ``dtype``; DHPre [T, n] fp32. T symbolic, D
static (a multiple of 8).
"""
from __future__ import annotations

import functools

from ._build import import_tilelang
from ._mhc_common import N_STREAMS, feature_block


@functools.lru_cache(maxsize=None)
def build(D: int, dtype: str, threads: int = 128):
    """The ``T.prim_func`` for feature size ``D`` and ``dtype``. Parameters: X, GIn, DHPre."""
    import_tilelang()
    import tilelang.language as T

    n, f32 = N_STREAMS, "float32"
    blk = feature_block(D)
    nt = T.dynamic("num_tokens")

    @T.prim_func
    def mhc_pre_bwd_dot(X: T.Tensor((nt, n, D), dtype), GIn: T.Tensor((nt, D), dtype), DHPre: T.Tensor((nt, n), f32)):
        with T.Kernel(nt, threads=threads) as tr:
            t = nt - 1 - tr
            red = T.alloc_reducer((n,), f32)
            T.reducer_init(red)
            xl = T.alloc_fragment((n, blk), dtype)
            gl = T.alloc_fragment((blk,), dtype)
            for bd in T.unroll(T.ceildiv(D, blk)):
                T.copy(X[t, 0, bd * blk], xl)
                T.copy(GIn[t, bd * blk], gl)
                for j in T.Parallel(blk):
                    g = T.cast(gl[j], f32)
                    for i in T.serial(n):
                        T.reducer_update(red[i], xl[i, j] * g)
            out = T.alloc_fragment((n,), f32)
            T.finalize_reducer(red, out, batch=n)
            T.copy(out, DHPre[t, 0])

    return mhc_pre_bwd_dot
