"""TileLang kernel factory: the lazy attention forward's first sweep, the row log-sum-exp.

One CTA per (query block, head, batch) walks the visible key blocks once and keeps the online
max and sum of exp of the biased, masked scores (SPEC section 1, S and LSE). Free key blocks
(no mask, no bias) skip the index work; band blocks read bias and causal mask from a table by distance
that the CTA fills once (``distance_table_macro``, the four row-major kernels alike).

Layout: Q [B, H, L, D], K [B, Hkv, L, D] contiguous, fp16/bf16; Bias [H, W] fp32; Lens [B]
int32 (L without padding). Out: LSE [B, H, L] fp32, natural log; rows past lengths[b] get the
log-sum-exp over the valid keys, as the golden backend does. B, H, Hkv, L, W are symbolic.

``varlen`` (packed documents, SPEC section 4): Q [T, H, D], K [T, Hkv, D] with any token stride (the head and dim
strides of [T, heads, D] rows: D and 1); Seqs [N + 1] int32 cu_seqlens in place of Lens; LSE [H, T]; the grid's
query blocks cover ``max_seqlen``, so a CTA whose block starts past its document's end exits.
"""

import functools

from ._build import import_tilelang
from ._lazy_attention_layout import Layout
from ._lazy_attention_tiles import (LOG2E, Tiles, distance_table_macro, distance_table_size, first_query,
                                    is_free_tile, key_end, lse_to_store, score_macro)

# 256 queries per CTA: four consumer warpgroups
CONFIGS = {64: Tiles(block_m=256, block_n=128, threads=512, num_stages=2),
           128: Tiles(block_m=256, block_n=128, threads=512, num_stages=2)}


@functools.lru_cache(maxsize=None)
def build(head_dim: int, dtype: str, causal: bool, tiles: Tiles, varlen: bool = False):
    """The LSE ``T.prim_func``; parameters in order: Q, K, Bias, Lens (Seqs), LSE, scale (fp32 scalar), max_seqlen
    (int32 scalar; read by the varlen grid only)."""
    import_tilelang()
    import tilelang.language as T

    D, BM, BN, threads, num_stages = head_dim, tiles.block_m, tiles.block_n, tiles.threads, tiles.num_stages
    f32 = "float32"
    lay = Layout.make(varlen, D)
    H, Hkv, W = lay.H, lay.Hkv, T.dynamic("W")
    scores = score_macro(BM, BN, causal, transposed=False, mask_rows=False)
    fill_table = distance_table_macro(BM, BN, causal)
    store_lse = lay.store_vec_macro(BM)

    @T.prim_func
    def lazy_attention_lse(
        Q: T.Tensor(lay.rows_shape(H), dtype),
        K: T.Tensor(lay.rows_shape(Hkv), dtype),
        Bias: T.Tensor([H, W], f32),
        Lens: T.Tensor(lay.seqs_shape(), "int32"),
        LSE: T.Tensor(lay.vec_shape(H), f32),
        scale: T.float32,
        max_seqlen: T.int32,
    ):
        with T.Kernel(H, lay.batch(), T.ceildiv(lay.span(max_seqlen), BM), threads=threads) as (by, bz, bx):
            Q_s = T.alloc_shared([BM, D], dtype)
            K_s = T.alloc_shared([BN, D], dtype)
            s = T.alloc_fragment([BM, BN], f32)
            row_max = T.alloc_fragment([BM], f32)
            row_max_prev = T.alloc_fragment([BM], f32)
            row_sum = T.alloc_fragment([BM], f32)
            denom = T.alloc_fragment([BM], f32)

            table = T.alloc_shared([distance_table_size(BM, BN)], f32)  # log2-domain bias by distance
            m0, hk = first_query(bx, lay.span(max_seqlen), BM, causal), by // (H // Hkv)
            seq, lb = lay.sequence(bz, Lens)
            sc2 = scale * LOG2E
            # varlen: a block past its document's end sweeps nothing (fixed length: padding rows get the LSE over
            # the valid keys)
            n_blocks = T.if_then_else(m0 < lay.row_end(lb), T.ceildiv(key_end(m0, lb, BM, causal), BN), 0)

            if lay.live(m0, lb):  # varlen: no loads, no stores past the document
                T.copy(lay.rows(Q, seq, by, m0, BM), Q_s)
                fill_table(table, Bias, by)
                T.fill(row_max, -T.infinity(f32))
                T.fill(denom, 0)
                for k in T.Pipelined(n_blocks, num_stages=num_stages):
                    T.copy(lay.rows(K, seq, hk, k * BN, BN), K_s)
                    T.gemm(Q_s, K_s, s, transpose_B=True, clear_accum=True, policy=T.GemmWarpPolicy.FullRow)
                    T.copy(row_max, row_max_prev)
                    if T.And(is_free_tile(m0, k * BN, BM, BN, lb, W, False), sc2 > 0):
                        # the max of the raw products, scaled once per row; the scale folds into the exponent's FMA
                        T.reduce_max(s, row_sum, dim=1)
                        for i in T.Parallel(BM):
                            row_max[i] = T.max(row_max[i], row_sum[i] * sc2)
                        for i, j in T.Parallel(BM, BN):
                            s[i, j] = T.exp2(s[i, j] * sc2 - row_max[i])
                    else:
                        scores(s, m0, k * BN, lb, sc2, Bias, by, table)
                        T.reduce_max(s, row_max, dim=1, clear=False)
                        for i, j in T.Parallel(BM, BN):
                            s[i, j] = T.exp2(s[i, j] - row_max[i])
                    T.reduce_sum(s, row_sum, dim=1)
                    for i in T.Parallel(BM):
                        denom[i] = denom[i] * T.exp2(row_max_prev[i] - row_max[i]) + row_sum[i]
                for i in T.Parallel(BM):
                    row_sum[i] = lse_to_store(T.log2(denom[i]) + row_max[i])
                store_lse(row_sum, LSE, seq, by, m0, lb)

    return lazy_attention_lse
