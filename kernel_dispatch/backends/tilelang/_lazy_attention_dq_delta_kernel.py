"""TileLang kernel factory: the lazy attention backward's dQ together with its row pass (Delta, dtau terms).

dS = P (Mk dA - Delta) needs Delta[m] = sum_n P Mk dA, which is known only after the whole row. For any
row constant D0, dQ_m = sum_n P (Mk dA - D0) k_n - (Delta - D0) sum_n P k_n, so one sweep over the keys
accumulates, per query block,

    X = sum_n P (Mk dA - D0) k_n,   Y = sum_n P k_n,   Delta = sum_n P Mk dA,   R = sum_n Mk dA

with D0 = dO . O (the stored output, in q's dtype; the launcher's row sums), and ends with
dQ = scale (X - (Delta - D0) Y). That is
4 GEMMs and one exponential pass per tile where a separate row pass and dQ sweep take 5 and two. Delta and
Rdiv = R / i go out for the dK/dV kernel and dtau. Rows past lengths[b] get zeros.

Precision: Delta - D0 = -(tau/i) R + dO . (O_exact - O), so X and Y round terms of the size of the tau term
to q's dtype before they cancel, where the two-kernel form rounds dS itself. Within the rounding tolerance
everywhere (tests/tolerances.py). Rows with a single visible key, where dS is exactly 0 but X - (Delta - D0) Y
would leave a rounding of (tau dA) k, get dQ = 0 exactly.

Layout: Q, dO [B, H, L, D]; K, V [B, Hkv, L, D], contiguous fp16/bf16; Bias [H, W], Tau [H] fp32;
Lens [B] int32; LSE, D0 [B, H, LP] fp32 (LP >= L). Out: Delta, Rdiv [B, H, LP] fp32 (columns >= L untouched),
InvI [B, LP] fp32 (1/i of rows < L, written by the head-0 CTAs for the dK/dV kernel), dQ [B, H, L, D] in q's
dtype. B, H, Hkv, L, LP, W are symbolic. ``varlen``: packed documents (``_lazy_attention_layout``): Q, dO, dQ
[T, H, D], K, V [T, Hkv, D], Seqs [N + 1], the vectors [H, TP] and InvI [TP] (TP >= T); a block past its
document's end stores nothing, and in the one key tile crossing the document's end the next document's keys are
kept out of every product: their dA by a select, their K rows zeroed in a copy of the tile for the dQ GEMMs (a
NaN or inf there would otherwise reach this document's dQ through 0 * NaN).
"""

import functools

from ._build import import_tilelang
from ._lazy_attention_layout import Layout
from ._lazy_attention_tiles import (LOG2E, Tiles, distance_table_macro, distance_table_size, first_query,
                                    is_free_tile, is_one_key_row, key_blocks, lse2_of, mask_of, one_key_rows_macro,
                                    own_rows_macro, p_of, score_macro)

# 64-key tiles keep the two fp32 accumulators (X, Y) in registers
CONFIGS = {64: Tiles(block_m=128, block_n=64, threads=256, num_stages=3),
           128: Tiles(block_m=128, block_n=64, threads=256, num_stages=2)}


@functools.lru_cache(maxsize=None)
def build(head_dim: int, dtype: str, causal: bool, tiles: Tiles, varlen: bool = False):
    """The fused dQ + row-pass ``T.prim_func``; parameters: Q, K, V, dO, Bias, Tau, Lens (Seqs), LSE, D0, Delta,
    Rdiv, InvI, dQ, scale, max_seqlen (int32; read by the varlen grid only)."""
    import_tilelang()
    import tilelang.language as T

    D, BM, BN, threads, num_stages = head_dim, tiles.block_m, tiles.block_n, tiles.threads, tiles.num_stages
    f32 = "float32"
    lay = Layout.make(varlen, D)
    H, Hkv = lay.H, lay.Hkv
    LP, W = T.dynamic("LP, W")
    scores = score_macro(BM, BN, causal, transposed=False, mask_rows=True)
    fill_table = distance_table_macro(BM, BN, causal)
    one_key_rows = one_key_rows_macro(BM, BN, causal)
    own_rows = own_rows_macro(BN, D, dtype)
    store_vec = lay.store_vec_macro(BM)
    store_dq = lay.store_rows_macro(BM)
    store_inv = lay.store_inv_macro(BM)
    kt_shape = [BN, D] if varlen else [8, 8]

    @T.prim_func
    def lazy_attention_bwd_dq_delta(
        Q: T.Tensor(lay.rows_shape(H), dtype),
        K: T.Tensor(lay.rows_shape(Hkv), dtype),
        V: T.Tensor(lay.rows_shape(Hkv), dtype),
        dO: T.Tensor(lay.rows_shape(H), dtype),
        Bias: T.Tensor([H, W], f32),
        Tau: T.Tensor([H], f32),
        Lens: T.Tensor(lay.seqs_shape(), "int32"),
        LSE: T.Tensor(lay.vec_shape(H, LP), f32),
        D0: T.Tensor(lay.vec_shape(H, LP), f32),
        Delta: T.Tensor(lay.vec_shape(H, LP), f32),
        Rdiv: T.Tensor(lay.vec_shape(H, LP), f32),
        InvI: T.Tensor(lay.inv_shape(LP), f32),
        dQ: T.Tensor(lay.rows_shape(H), dtype),
        scale: T.float32,
        max_seqlen: T.int32,
    ):
        with T.Kernel(H, lay.batch(), T.ceildiv(lay.span(max_seqlen), BM), threads=threads) as (by, bz, bx):
            Q_s = T.alloc_shared([BM, D], dtype)
            dO_s = T.alloc_shared([BM, D], dtype)
            K_s = T.alloc_shared([BN, D], dtype)
            V_s = T.alloc_shared([BN, D], dtype)
            Kt_s = T.alloc_shared(kt_shape, dtype)  # varlen: the crossing tile's K with the next document's rows 0
            s = T.alloc_fragment([BM, BN], f32)
            dp = T.alloc_fragment([BM, BN], f32)
            g_cast = T.alloc_fragment([BM, BN], dtype)
            p_cast = T.alloc_fragment([BM, BN], dtype)
            acc_x = T.alloc_fragment([BM, D], f32)
            acc_y = T.alloc_fragment([BM, D], f32)
            lse2 = T.alloc_fragment([BM], f32)
            inv_i = T.alloc_fragment([BM], f32)
            thr = T.alloc_fragment([BM], f32)
            d0 = T.alloc_fragment([BM], f32)
            r_acc = T.alloc_fragment([BM], f32)
            d_acc = T.alloc_fragment([BM], f32)
            r_blk = T.alloc_fragment([BM], f32)
            d_blk = T.alloc_fragment([BM], f32)
            tmp = T.alloc_fragment([BM], f32)

            table = T.alloc_shared([distance_table_size(BM, BN)], f32)  # log2-domain bias by distance
            m0, hk = first_query(bx, lay.span(max_seqlen), BM, causal), by // (H // Hkv)
            seq, lb = lay.sequence(bz, Lens)
            sc2 = scale * LOG2E
            n_blocks = key_blocks(m0, lb, BM, BN, causal)

            if lay.live(m0, lb):  # varlen: no loads, no stores past the document
                T.copy(lay.rows(Q, seq, by, m0, BM), Q_s)
                fill_table(table, Bias, by)
                T.copy(lay.rows(dO, seq, by, m0, BM), dO_s)
                T.copy(lay.vec(LSE, seq, by, m0, BM), lse2)
                T.copy(lay.vec(D0, seq, by, m0, BM), d0)
                for i in T.Parallel(BM):
                    lse2[i] = lse2_of(lse2[i])
                    inv_i[i] = T.float32(1) / T.Cast(f32, (m0 + i + 1) if causal else lb)
                    # Tau[by] read here: a scalar bound before `if lay.live` is "used before definition" to TileLang
                    thr[i] = Tau[by] * inv_i[i]
                    d0[i] = T.if_then_else(T.isfinite(d0[i]), d0[i], T.float32(0))  # any row constant will do
                T.fill(r_acc, 0)
                T.fill(d_acc, 0)
                T.clear(acc_x)
                T.clear(acc_y)
                for k in T.Pipelined(n_blocks, num_stages=num_stages):
                    T.copy(lay.rows(K, seq, hk, k * BN, BN), K_s)
                    T.copy(lay.rows(V, seq, hk, k * BN, BN), V_s)
                    T.gemm(Q_s, K_s, s, transpose_B=True, clear_accum=True, policy=T.GemmWarpPolicy.FullRow)
                    T.gemm(dO_s, V_s, dp, transpose_B=True, clear_accum=True, policy=T.GemmWarpPolicy.FullRow)
                    if is_free_tile(m0, k * BN, BM, BN, lb, W, True):  # nothing to mask: scale folded into the FMA
                        for i, j in T.Parallel(BM, BN):
                            s[i, j] = p_of(s[i, j] * sc2 - lse2[i])
                            dp[i, j] = dp[i, j] * mask_of(s[i, j] + thr[i] > 0)
                    else:
                        scores(s, m0, k * BN, lb, sc2, Bias, by, table)
                        one_key_rows(s, lse2, m0, k * BN, lb, tmp)
                        for i, j in T.Parallel(BM, BN):
                            # Mk: a visible key (score > -inf, even if P underflows) with P + tau/i > 0
                            dp[i, j] = dp[i, j] * mask_of(T.And(s[i, j] > -T.infinity(f32),
                                                                p_of(s[i, j] - lse2[i]) + thr[i] > 0))
                            if varlen:  # the next document's keys: no dA (their V may hold anything)
                                dp[i, j] = T.if_then_else(k * BN + j < lb, dp[i, j], T.float32(0))
                            s[i, j] = p_of(s[i, j] - lse2[i])
                    T.reduce_sum(dp, r_blk, dim=1)
                    for i, j in T.Parallel(BM, BN):
                        g_cast[i, j] = s[i, j] * (dp[i, j] - d0[i])
                        p_cast[i, j] = s[i, j]
                        dp[i, j] = s[i, j] * dp[i, j]
                    T.reduce_sum(dp, d_blk, dim=1)
                    for i in T.Parallel(BM):
                        r_acc[i] = r_acc[i] + r_blk[i]
                        d_acc[i] = d_acc[i] + d_blk[i]
                    if varlen:
                        if (k + 1) * BN > lb:  # the tile crossing the document's end: the next document's K rows
                            own_rows(k * BN, lb, Kt_s, K_s)
                            T.gemm(g_cast, Kt_s, acc_x, policy=T.GemmWarpPolicy.FullRow)
                            T.gemm(p_cast, Kt_s, acc_y, policy=T.GemmWarpPolicy.FullRow)
                        else:
                            T.gemm(g_cast, K_s, acc_x, policy=T.GemmWarpPolicy.FullRow)
                            T.gemm(p_cast, K_s, acc_y, policy=T.GemmWarpPolicy.FullRow)
                    else:
                        T.gemm(g_cast, K_s, acc_x, policy=T.GemmWarpPolicy.FullRow)
                        T.gemm(p_cast, K_s, acc_y, policy=T.GemmWarpPolicy.FullRow)
                for i, j in T.Parallel(BM, D):
                    # a row with one visible key has dS = 0 exactly; X and (Delta - D0) Y would leave a rounding
                    # (unless the row is NaN)
                    one = T.And(is_one_key_row(m0 + i, lb, causal), T.isfinite(d_acc[i]))
                    acc_x[i, j] = T.if_then_else(one, T.float32(0),
                                                 (acc_x[i, j] - (d_acc[i] - d0[i]) * acc_y[i, j]) * scale)
                for i in T.Parallel(BM):
                    r_acc[i] = r_acc[i] * inv_i[i]
                store_vec(d_acc, Delta, seq, by, m0, lb)
                store_vec(r_acc, Rdiv, seq, by, m0, lb)
                if by == 0:  # one head writes 1/i for the dK/dV kernel (here, not before the sweep: TileLang would
                    # give that store to other threads than the ones holding inv_i)
                    store_inv(inv_i, InvI, seq, m0, lb)
                T.copy(acc_x, Q_s)  # Q is no longer read: its tile stages dQ for one TMA store (varlen: its rows)
                store_dq(Q_s, dQ, seq, by, m0, lb)

    return lazy_attention_bwd_dq_delta
