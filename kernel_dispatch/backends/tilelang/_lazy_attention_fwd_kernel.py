"""TileLang kernel factory: the lazy attention forward's second sweep, O = relu(P + tau/i) @ V.

One CTA per (query block, head, batch). With the final LSE of each row (from the LSE kernel)
it recomputes the scores of every visible key block, forms P = exp(S - LSE) and
A = relu(P + tau / i), re-masked so that tau > 0 never reaches masked keys, and accumulates
O = A @ V in fp32 with no renormalisation (SPEC section 1). Rows past lengths[b] are zero;
fully padded query blocks skip the sweep.

Layout: Q [B, H, L, D], K/V [B, Hkv, L, D] contiguous, fp16/bf16; Bias [H, W], Tau [H] fp32;
Lens [B] int32; LSE [B, H, L] fp32 (natural log). Out: O [B, H, L, D] in q's dtype.
B, H, Hkv, L, W are symbolic.
"""

import functools

from ._build import import_tilelang
from ._lazy_attention_tiles import (LOG2E, Tiles, distance_table_macro, distance_table_size, is_free_tile,
                                    key_blocks, lse2_of, one_key_rows_macro, p_of, row_block, score_macro)

CONFIGS = {64: Tiles(block_m=128, block_n=128, threads=256, num_stages=2),
           128: Tiles(block_m=128, block_n=128, threads=256, num_stages=2)}


@functools.lru_cache(maxsize=None)
def build(head_dim: int, dtype: str, causal: bool, tiles: Tiles):
    """The output ``T.prim_func``; parameters in order: Q, K, V, Bias, Tau, Lens, LSE, O, scale."""
    import_tilelang()
    import tilelang.language as T

    D, BM, BN, threads, num_stages = head_dim, tiles.block_m, tiles.block_n, tiles.threads, tiles.num_stages
    f32 = "float32"
    B, H, Hkv, L, W = T.dynamic("B, H, Hkv, L, W")
    scores = score_macro(BM, BN, causal, transposed=False, mask_rows=False)
    fill_table = distance_table_macro(BM, BN, causal)
    one_key_rows = one_key_rows_macro(BM, BN, causal)

    @T.prim_func
    def lazy_attention_fwd(
        Q: T.Tensor([B, H, L, D], dtype),
        K: T.Tensor([B, Hkv, L, D], dtype),
        V: T.Tensor([B, Hkv, L, D], dtype),
        Bias: T.Tensor([H, W], f32),
        Tau: T.Tensor([H], f32),
        Lens: T.Tensor([B], "int32"),
        LSE: T.Tensor([B, H, L], f32),
        O: T.Tensor([B, H, L, D], dtype),
        scale: T.float32,
    ):
        with T.Kernel(H, B, T.ceildiv(L, BM), threads=threads) as (by, bz, bx):
            Q_s = T.alloc_shared([BM, D], dtype)
            K_s = T.alloc_shared([BN, D], dtype)
            V_s = T.alloc_shared([BN, D], dtype)
            s = T.alloc_fragment([BM, BN], f32)
            a_cast = T.alloc_fragment([BM, BN], dtype)
            acc_o = T.alloc_fragment([BM, D], f32)
            lse2 = T.alloc_fragment([BM], f32)
            thr = T.alloc_fragment([BM], f32)
            tmp = T.alloc_fragment([BM], f32)

            table = T.alloc_shared([distance_table_size(BM, BN)], f32)  # log2-domain bias by distance
            m0, hk, lb = row_block(bx, by, bz, L, H, Hkv, Lens, BM, causal)
            tau = Tau[by]
            sc2 = scale * LOG2E
            n_blocks = key_blocks(m0, lb, BM, BN, causal)

            T.copy(Q[bz, by, m0:m0 + BM, :], Q_s)
            fill_table(table, Bias, by)
            T.copy(LSE[bz, by, m0:m0 + BM], lse2)
            for i in T.Parallel(BM):
                # rows past L (their LSE read as 0) get exp2(s - inf) = 0: no overflow from a large bias
                lse2[i] = T.if_then_else(m0 + i < L, lse2_of(lse2[i]), T.infinity(f32))
                thr[i] = tau / T.Cast(f32, (m0 + i + 1) if causal else lb)
            T.clear(acc_o)
            for k in T.Pipelined(n_blocks, num_stages=num_stages):
                T.copy(K[bz, hk, k * BN:(k + 1) * BN, :], K_s)
                T.copy(V[bz, hk, k * BN:(k + 1) * BN, :], V_s)
                T.gemm(Q_s, K_s, s, transpose_B=True, clear_accum=True, policy=T.GemmWarpPolicy.FullRow)
                if is_free_tile(m0, k * BN, BM, BN, lb, W, False):
                    # nothing to mask: the scale folds into the exponent's FMA
                    for i, j in T.Parallel(BM, BN):
                        a_cast[i, j] = T.max(p_of(s[i, j] * sc2 - lse2[i]) + thr[i], T.float32(0))
                else:
                    scores(s, m0, k * BN, lb, sc2, Bias, by, table)
                    one_key_rows(s, lse2, m0, k * BN, lb, tmp)
                    for i, j in T.Parallel(BM, BN):  # re-masked: tau > 0 must not reach masked keys
                        a_cast[i, j] = T.if_then_else(s[i, j] > -T.infinity(f32),
                                                      T.max(p_of(s[i, j] - lse2[i]) + thr[i], T.float32(0)),
                                                      T.float32(0))
                T.gemm(a_cast, V_s, acc_o, policy=T.GemmWarpPolicy.FullRow)
            for i, j in T.Parallel(BM, D):
                # T.max above drops NaN; a row whose LSE or tau/i is NaN (a NaN score, bias or tau) is NaN, as
                # golden's relu makes it
                nan = lse2[i] + thr[i]
                acc_o[i, j] = T.if_then_else(m0 + i < lb, T.if_then_else(T.isnan(nan), nan, acc_o[i, j]), T.float32(0))
            # Q is no longer read: its tile stages O for one TMA store
            T.copy(acc_o, Q_s)
            T.copy(Q_s, O[bz, by, m0:m0 + BM, :])

    return lazy_attention_fwd
