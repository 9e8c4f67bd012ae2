"""TileLang kernel factory: the lazy attention forward's first sweep, the row log-sum-exp.

One CTA per (query block, head, batch) walks the visible key blocks once and keeps the online
max and sum of exp of the biased, masked scores (SPEC section 1, S and LSE). Free key blocks
(no mask, no bias) skip the index work; band blocks read bias and causal mask from a table by distance
that the CTA fills once (``distance_table_macro``, the four row-major kernels alike).

Layout: Q [B, H, L, D], K [B, Hkv, L, D] contiguous, fp16/bf16; Bias [H, W] fp32; Lens [B]
int32 (L without padding). Out: LSE [B, H, L] fp32, natural log; rows past lengths[b] get the
log-sum-exp over the valid keys, as the golden backend does. B, H, Hkv, L, W are symbolic.
"""

import functools

from ._build import import_tilelang
from ._lazy_attention_tiles import (LOG2E, Tiles, distance_table_macro, distance_table_size, is_free_tile, key_end,
                                    lse_to_store, row_block, score_macro)

# 256 queries per CTA: four consumer warpgroups
CONFIGS = {64: Tiles(block_m=256, block_n=128, threads=512, num_stages=2),
           128: Tiles(block_m=256, block_n=128, threads=512, num_stages=2)}


@functools.lru_cache(maxsize=None)
def build(head_dim: int, dtype: str, causal: bool, tiles: Tiles):
    """The LSE ``T.prim_func``; parameters in order: Q, K, Bias, Lens, LSE, scale (fp32 scalar)."""
    import_tilelang()
    import tilelang.language as T

    D, BM, BN, threads, num_stages = head_dim, tiles.block_m, tiles.block_n, tiles.threads, tiles.num_stages
    f32 = "float32"
    B, H, Hkv, L, W = T.dynamic("B, H, Hkv, L, W")
    scores = score_macro(BM, BN, causal, transposed=False, mask_rows=False)
    fill_table = distance_table_macro(BM, BN, causal)

    @T.prim_func
    def lazy_attention_lse(
        Q: T.Tensor([B, H, L, D], dtype),
        K: T.Tensor([B, Hkv, L, D], dtype),
        Bias: T.Tensor([H, W], f32),
        Lens: T.Tensor([B], "int32"),
        LSE: T.Tensor([B, H, L], f32),
        scale: T.float32,
    ):
        with T.Kernel(H, B, T.ceildiv(L, BM), threads=threads) as (by, bz, bx):
            Q_s = T.alloc_shared([BM, D], dtype)
            K_s = T.alloc_shared([BN, D], dtype)
            s = T.alloc_fragment([BM, BN], f32)
            row_max = T.alloc_fragment([BM], f32)
            row_max_prev = T.alloc_fragment([BM], f32)
            row_sum = T.alloc_fragment([BM], f32)
            denom = T.alloc_fragment([BM], f32)

            table = T.alloc_shared([distance_table_size(BM, BN)], f32)  # log2-domain bias by distance
            m0, hk, lb = row_block(bx, by, bz, L, H, Hkv, Lens, BM, causal)
            sc2 = scale * LOG2E

            T.copy(Q[bz, by, m0:m0 + BM, :], Q_s)
            fill_table(table, Bias, by)
            T.fill(row_max, -T.infinity(f32))
            T.fill(denom, 0)
            for k in T.Pipelined(T.ceildiv(key_end(m0, lb, BM, causal), BN), num_stages=num_stages):
                T.copy(K[bz, hk, k * BN:(k + 1) * BN, :], K_s)
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
            T.copy(row_sum, LSE[bz, by, m0:m0 + BM])

    return lazy_attention_lse
