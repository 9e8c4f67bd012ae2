"""TileLang kernel factory: the mHC pre layer input h_in[t, d] = sum_i h_pre[t, i] * x[t, i, d].

One CTA per (token, block of ROW_BLOCK features), 16-byte vectors of the n streams straight into
registers, fp32 math, h_in stored in x's dtype. Tokens run last to first: the GEMM kernel just
read the last ones, so the first reads here tend to hit L2 (and mhc_post, first to last, then
finds the last tokens read here).

Layout (contiguous): X [T, n, D] and HIn [T, D] in ``dtype``; HPre [T, n] fp32. T symbolic, D
static (a multiple of 8; the last feature block is masked).
"""
from __future__ import annotations

import functools

from ._build import import_tilelang
from ._mhc_common import N_STREAMS, feature_block


@functools.lru_cache(maxsize=None)
def build(D: int, dtype: str, threads: int = 128):
    """The apply ``T.prim_func`` for feature size ``D`` and ``dtype``. Parameters: X, HPre, HIn."""
    import_tilelang()
    import tilelang.language as T

    n, f32 = N_STREAMS, "float32"
    blk = feature_block(D)
    nt = T.dynamic("num_tokens")

    @T.prim_func
    def mhc_pre_apply(X: T.Tensor((nt, n, D), dtype), HPre: T.Tensor((nt, n), f32), HIn: T.Tensor((nt, D), dtype)):
        with T.Kernel(T.ceildiv(D, blk), nt, threads=threads) as (bd, tr):
            t = nt - 1 - tr
            hp = T.alloc_fragment((n,), f32)
            xl = T.alloc_fragment((n, blk), dtype)
            ol = T.alloc_fragment((blk,), dtype)
            T.copy(HPre[t, 0], hp)
            T.copy(X[t, 0, bd * blk], xl)
            for j in T.Parallel(blk):
                acc = T.alloc_var(f32)
                acc = 0.0
                for i in T.serial(n):
                    acc += hp[i] * xl[i, j]
                ol[j] = acc
            T.copy(ol, HIn[t, bd * blk])

    return mhc_pre_apply
