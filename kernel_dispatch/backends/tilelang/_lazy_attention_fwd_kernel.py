"""TileLang kernel factory: the lazy attention forward's second sweep, O = relu(P + tau/i) @ V.

One CTA per (query block, head, batch). With the final LSE of each row (from the LSE kernel)
it recomputes the scores of every visible key block, forms P = exp(S - LSE) and
A = relu(P + tau / i), re-masked so that tau > 0 never reaches masked keys, and accumulates
O = A @ V in fp32 with no renormalisation (SPEC section 1). Rows past lengths[b] are zero;
fully padded query blocks skip the sweep.

Layout: Q [B, H, L, D], K/V [B, Hkv, L, D] contiguous, fp16/bf16; Bias [H, W], Tau [H] fp32;
Lens [B] int32; LSE [B, H, L] fp32 (natural log). Out: O [B, H, L, D] in q's dtype.
B, H, Hkv, L, W are symbolic. ``varlen``: packed documents, Q, K, V, O [T, heads, D], LSE [H, T], Seqs
[N + 1] (``_lazy_attention_layout``); a block past its document's end stores nothing, and the V rows of the one
key tile that crosses the document's end are zeroed (the next document's values, even NaN, never reach O).
"""

import functools

from ._build import import_tilelang
from ._lazy_attention_layout import Layout
from ._lazy_attention_tiles import (LOG2E, Tiles, distance_table_macro, distance_table_size, first_query,
                                    is_free_tile, key_blocks, lse2_of, one_key_rows_macro, own_rows_macro, p_of,
                                    score_macro)

CONFIGS = {64: Tiles(block_m=128, block_n=128, threads=256, num_stages=2),
           128: Tiles(block_m=128, block_n=128, threads=256, num_stages=2)}


@functools.lru_cache(maxsize=None)
def build(head_dim: int, dtype: str, causal: bool, tiles: Tiles, varlen: bool = False):
    """The output ``T.prim_func``; parameters in order: Q, K, V, Bias, Tau, Lens (Seqs), LSE, O, scale,
    max_seqlen (int32; read by the varlen grid only)."""
    import_tilelang()
    import tilelang.language as T

    D, BM, BN, threads, num_stages = head_dim, tiles.block_m, tiles.block_n, tiles.threads, tiles.num_stages
    f32 = "float32"
    lay = Layout.make(varlen, D)
    H, Hkv, W = lay.H, lay.Hkv, T.dynamic("W")
    scores = score_macro(BM, BN, causal, transposed=False, mask_rows=False)
    fill_table = distance_table_macro(BM, BN, causal)
    one_key_rows = one_key_rows_macro(BM, BN, causal)
    own_rows = own_rows_macro(BN, D, dtype)
    store_o = lay.store_rows_macro(BM)
    vt_shape = [BN, D] if varlen else [8, 8]

    @T.prim_func
    def lazy_attention_fwd(
        Q: T.Tensor(lay.rows_shape(H), dtype),
        K: T.Tensor(lay.rows_shape(Hkv), dtype),
        V: T.Tensor(lay.rows_shape(Hkv), dtype),
        Bias: T.Tensor([H, W], f32),
        Tau: T.Tensor([H], f32),
        Lens: T.Tensor(lay.seqs_shape(), "int32"),
        LSE: T.Tensor(lay.vec_shape(H), f32),
        O: T.Tensor(lay.rows_shape(H), dtype),
        scale: T.float32,
        max_seqlen: T.int32,
    ):
        with T.Kernel(H, lay.batch(), T.ceildiv(lay.span(max_seqlen), BM), threads=threads) as (by, bz, bx):
            Q_s = T.alloc_shared([BM, D], dtype)
            K_s = T.alloc_shared([BN, D], dtype)
            V_s = T.alloc_shared([BN, D], dtype)
            Vt_s = T.alloc_shared(vt_shape, dtype)  # varlen: the crossing tile's V with the next document's rows 0
            s = T.alloc_fragment([BM, BN], f32)
            a_cast = T.alloc_fragment([BM, BN], dtype)
            acc_o = T.alloc_fragment([BM, D], f32)
            lse2 = T.alloc_fragment([BM], f32)
            thr = T.alloc_fragment([BM], f32)
            tmp = T.alloc_fragment([BM], f32)

            table = T.alloc_shared([distance_table_size(BM, BN)], f32)  # log2-domain bias by distance
            m0, hk = first_query(bx, lay.span(max_seqlen), BM, causal), by // (H // Hkv)
            seq, lb = lay.sequence(bz, Lens)
            sc2 = scale * LOG2E
            n_blocks = key_blocks(m0, lb, BM, BN, causal)

            if lay.live(m0, lb):  # varlen: no loads, no stores past the document
                T.copy(lay.rows(Q, seq, by, m0, BM), Q_s)
                fill_table(table, Bias, by)
                T.copy(lay.vec(LSE, seq, by, m0, BM), lse2)
                for i in T.Parallel(BM):
                    # rows past the end (their LSE read as 0) get exp2(s - inf) = 0: no overflow from a large bias
                    lse2[i] = T.if_then_else(m0 + i < lay.row_end(lb), lse2_of(lse2[i]), T.infinity(f32))
                    thr[i] = Tau[by] / T.Cast(f32, (m0 + i + 1) if causal else lb)
                T.clear(acc_o)
                for k in T.Pipelined(n_blocks, num_stages=num_stages):
                    T.copy(lay.rows(K, seq, hk, k * BN, BN), K_s)
                    T.copy(lay.rows(V, seq, hk, k * BN, BN), V_s)
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
                    if varlen:
                        if (k + 1) * BN > lb:  # the tile crossing the document's end: the next document's V rows
                            own_rows(k * BN, lb, Vt_s, V_s)
                            T.gemm(a_cast, Vt_s, acc_o, policy=T.GemmWarpPolicy.FullRow)
                        else:
                            T.gemm(a_cast, V_s, acc_o, policy=T.GemmWarpPolicy.FullRow)
                    else:
                        T.gemm(a_cast, V_s, acc_o, policy=T.GemmWarpPolicy.FullRow)
                for i, j in T.Parallel(BM, D):
                    # T.max above drops NaN; a row whose LSE or tau/i is NaN (a NaN score, bias or tau) is NaN, as
                    # golden's relu makes it
                    nan = lse2[i] + thr[i]
                    acc_o[i, j] = T.if_then_else(m0 + i < lb, T.if_then_else(T.isnan(nan), nan, acc_o[i, j]),
                                                 T.float32(0))
                # Q is no longer read: its tile stages O for one TMA store (varlen: a store of the document's rows)
                T.copy(acc_o, Q_s)
                store_o(Q_s, O, seq, by, m0, lb)

    return lazy_attention_fwd
