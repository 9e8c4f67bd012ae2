"""TileLang kernel factory: the lazy attention backward's dK, dV and dbias partials.

One CTA per (key block, kv head, batch) keeps K, V of its keys in shared memory and walks,
in a fixed order, every query head of its group and every query block that sees these keys
(one flattened pipelined loop), recomputing the tiles transposed ([keys, queries]):

    A^T = relu(P + tau/i)^T re-masked,   dV += A^T @ dO
    dS^T = (P (Mk dA - Delta))^T,        dK += dS^T @ Q     (times scale at the end)

so GQA heads sum into dK, dV without atomics. Tiles within the bias band also add their
diagonal sums of dS into Partial[b, h, key block, t] (t = distance); each distance is owned by
one thread slot and tiles come in a fixed order, so dbias = Partial.sum((0, 2)) is bitwise
reproducible.

Layout: Q, dO [B, H, L, D]; K, V [B, Hkv, L, D], contiguous fp16/bf16; Bias [H, W], Tau [H]
fp32; Lens [B] int32; LSE, Delta [B, H, LP] fp32 and InvI [B, LP] fp32 (1/i of each row),
LP >= L a multiple of ROW_ALIGN (``_lazy_attention_layout``; rows of the TMA-loaded vectors must be 16-byte aligned).
Out: dK, dV [B, Hkv, L, D] in k's dtype; Partial [B, H, NKB, WP] fp32, zero-initialised,
NKB = ceil(L / block_n), WP = min(W, L) (no distance reaches L). B, H, Hkv, L, LP, W, NKB, WP
are symbolic.

``varlen`` (packed documents, ``_lazy_attention_layout``): Q, dO [T, H, D], K, V, dK, dV [T, Hkv, D], Seqs
[N + 1], LSE, Delta [H, TP], InvI [TP] (TP >= T a multiple of ROW_ALIGN; a document starts at any token, so
each query block's rows are TMA-loaded from the aligned token before them, ``Layout.vec_tma``), grid (Hkv, N, key
blocks of max_seqlen); Partial [H, NR, WP] with NR = ceil(T / block_n) + N and WP = min(W, max_seqlen): key block k of
document d owns row floor(cu_seqlens[d] / block_n) + d + k (distinct for every (d, k)). A key block past its
document's end exits; dK, dV are stored for the document's keys only. The next document's rows, which the tiles
crossing a document's end read, never reach a product: their dS is selected to 0 (keys and queries alike), and
the crossing query tile's Q and dO rows are zeroed in copies for the two dK/dV GEMMs (0 * NaN is NaN).
"""

import functools

from ._build import import_tilelang
from ._lazy_attention_layout import Layout
from ._lazy_attention_tiles import (LOG2E, Tiles, is_free_tile, lse2_of, mask_of, one_key_probs_macro, own_rows_macro,
                                    p_of, relu, score_macro)

CONFIGS = {64: Tiles(block_m=64, block_n=128, threads=256, num_stages=2),
           128: Tiles(block_m=64, block_n=128, threads=256, num_stages=2)}


@functools.lru_cache(maxsize=None)
def build(head_dim: int, dtype: str, causal: bool, tiles: Tiles, varlen: bool = False):
    """The dK/dV ``T.prim_func`` (block_m queries x block_n keys per tile); parameters: Q, K, V, dO,
    Bias, Tau, Lens (Seqs), LSE, Delta, InvI, dK, dV, Partial, scale, max_seqlen (int32; read by the varlen grid
    only)."""
    import_tilelang()
    import tilelang.language as T

    D, BM, BN, NS, num_stages = head_dim, tiles.block_m, tiles.block_n, tiles.threads, tiles.num_stages
    assert BM % 2 == 0, "block_m must be even"
    f32 = "float32"
    lay = Layout.make(varlen, D)
    H, Hkv = lay.H, lay.Hkv
    LP, W, NKB, WP = T.dynamic("LP, W, NKB, WP")
    scores = score_macro(BN, BM, causal, transposed=True, mask_rows=True)
    one_key_probs = one_key_probs_macro(BN, BM, causal)
    own_rows = own_rows_macro(BM, D, dtype, tiles=2)
    store_rows = lay.store_rows_macro(BN)
    part_shape = [H, NKB, WP] if varlen else [lay.B, H, NKB, WP]
    qt_shape = [BM, D] if varlen else [8, 8]

    @T.prim_func
    def lazy_attention_bwd_dkdv(
        Q: T.Tensor(lay.rows_shape(H), dtype),
        K: T.Tensor(lay.rows_shape(Hkv), dtype),
        V: T.Tensor(lay.rows_shape(Hkv), dtype),
        dO: T.Tensor(lay.rows_shape(H), dtype),
        Bias: T.Tensor([H, W], f32),
        Tau: T.Tensor([H], f32),
        Lens: T.Tensor(lay.seqs_shape(), "int32"),
        LSE: T.Tensor(lay.vec_shape(H, LP), f32),
        Delta: T.Tensor(lay.vec_shape(H, LP), f32),
        InvI: T.Tensor(lay.inv_shape(LP), f32),
        dK: T.Tensor(lay.rows_shape(Hkv), dtype),
        dV: T.Tensor(lay.rows_shape(Hkv), dtype),
        Partial: T.Tensor(part_shape, f32),
        scale: T.float32,
        max_seqlen: T.int32,
    ):
        with T.Kernel(Hkv, lay.batch(), T.ceildiv(lay.span(max_seqlen), BN), threads=NS) as (by, bz, bx):
            K_s = T.alloc_shared([BN, D], dtype)
            V_s = T.alloc_shared([BN, D], dtype)
            Q_s = T.alloc_shared([BM, D], dtype)
            dO_s = T.alloc_shared([BM, D], dtype)
            lse_s = T.alloc_shared([BM + lay.vec_pad()], f32)  # row j at j + off (``Layout.vec_tma``)
            delta_s = T.alloc_shared([BM + lay.vec_pad()], f32)
            inv_s = T.alloc_shared([BM + lay.vec_pad()], f32)
            ds_s = T.alloc_shared([BN, BM + 1], f32)  # padded: diagonal reads hit distinct banks
            sT = T.alloc_fragment([BN, BM], f32)
            dpT = T.alloc_fragment([BN, BM], f32)
            pT = T.alloc_fragment([BN, BM], f32)
            aT_cast = T.alloc_fragment([BN, BM], dtype)
            dsT_cast = T.alloc_fragment([BN, BM], dtype)
            acc_dk = T.alloc_fragment([BN, D], f32)
            acc_dv = T.alloc_fragment([BN, D], f32)
            diag = T.alloc_fragment([NS], f32)
            diag2 = T.alloc_fragment([NS], f32)
            prev = T.alloc_fragment([NS], f32)
            table = T.alloc_shared([BN + BM - 1], f32)  # the diagonals' bias of a band tile
            d0 = T.alloc_var(T.int32)
            hv = T.alloc_var(T.int32)
            m0v = T.alloc_var(T.int32)
            off = T.alloc_var(T.int32)
            lo = T.alloc_var(T.int32)
            hi = T.alloc_var(T.int32)
            t_lo = T.alloc_var(T.int32)
            t_hi = T.alloc_var(T.int32)
            t_base = T.alloc_var(T.int32)

            Qt_s = T.alloc_shared(qt_shape, dtype)  # varlen: the crossing query tile with the next document's rows 0
            dOt_s = T.alloc_shared(qt_shape, dtype)

            n0 = bx * BN  # key block slowest in the grid: causal, the blocks with the most queries start first
            groups = H // Hkv
            seq, lb = lay.sequence(bz, Lens)
            prow = T.floordiv(seq, BN) + bz + bx if varlen else bx  # this key block's row of Partial
            sc2 = scale * LOG2E
            q_lo = T.floordiv(n0, BM) if causal else 0  # first query block that sees these keys
            n_q = T.if_then_else(n0 < lb, T.max(T.ceildiv(lb, BM) - q_lo, 0), 0)
            n_q1 = T.max(n_q, 1)

            if lay.live(n0, lb):  # varlen: no loads, no stores past the document
                T.copy(lay.rows(K, seq, by, n0, BN), K_s)
                T.copy(lay.rows(V, seq, by, n0, BN), V_s)
                T.clear(acc_dk)
                T.clear(acc_dv)
                for it in T.Pipelined(groups * n_q, num_stages=num_stages):
                    h = by * groups + it // n_q1
                    m0 = (q_lo + it % n_q1) * BM
                    T.copy(lay.rows(Q, seq, h, m0, BM), Q_s)
                    T.copy(lay.rows(dO, seq, h, m0, BM), dO_s)
                    T.copy(lay.vec_tma(LSE, seq, h, m0, BM), lse_s)
                    T.copy(lay.vec_tma(Delta, seq, h, m0, BM), delta_s)
                    T.copy(lay.vec_tma(InvI, seq, None, m0, BM), inv_s)
                    # the head and query offset as scalars: per-element index math must not redo it // n_q1
                    hv = h
                    m0v = m0
                    off = lay.vec_offset(seq, m0v)
                    T.gemm(K_s, Q_s, sT, transpose_B=True, clear_accum=True, policy=T.GemmWarpPolicy.FullRow)
                    T.gemm(V_s, dO_s, dpT, transpose_B=True, clear_accum=True, policy=T.GemmWarpPolicy.FullRow)
                    tau = Tau[hv]
                    # Everything that uses shared scratch (the bias table, dS for the dbias sums) stays in the masked
                    # branch, so free tiles run without a CTA barrier and the two warpgroups drift apart
                    if is_free_tile(m0v, n0, BM, BN, lb, W, True):  # nothing to mask: scale folded into the FMA
                        for i, j in T.Parallel(BN, BM):
                            pT[i, j] = p_of(sT[i, j] * sc2 - lse2_of(lse_s[j + off]))
                            aT_cast[i, j] = relu(pT[i, j] + tau * inv_s[j + off])
                            dpT[i, j] = dpT[i, j] * mask_of(pT[i, j] + tau * inv_s[j + off] > 0)
                        for i, j in T.Parallel(BN, BM):
                            dsT_cast[i, j] = pT[i, j] * (dpT[i, j] - delta_s[j + off])  # dS
                    else:
                        scores(sT, m0v, n0, lb, sc2, Bias, hv, table)
                        for i, j in T.Parallel(BN, BM):
                            pT[i, j] = p_of(sT[i, j] - lse2_of(lse_s[j + off]))  # P; 0 where masked
                        one_key_probs(sT, pT, m0v, n0, lb)
                        for i, j in T.Parallel(BN, BM):
                            # Mk: a visible key (score > -inf, even if P underflows) with P + tau/i > 0
                            keep = T.And(sT[i, j] > -T.infinity(f32), pT[i, j] + tau * inv_s[j + off] > 0)
                            aT_cast[i, j] = T.if_then_else(sT[i, j] == -T.infinity(f32), T.float32(0),
                                                           relu(pT[i, j] + tau * inv_s[j + off]))
                            dpT[i, j] = dpT[i, j] * mask_of(keep)
                        for i, j in T.Parallel(BN, BM):
                            sT[i, j] = pT[i, j] * (dpT[i, j] - delta_s[j + off])  # dS, kept in fp32 for the dbias sums
                            if varlen:  # the next document's keys and queries: no dS (their rows may hold anything)
                                sT[i, j] = T.if_then_else(T.And(n0 + i < lb, m0v + j < lb), sT[i, j], T.float32(0))
                            dsT_cast[i, j] = sT[i, j]
                        # dbias: diagonal sums of dS over the distances t < W that this tile holds. Key row i,
                        # query column j lies at signed distance d0 + j - i; slot x owns t = t_base + c * NS + x
                        # in every tile, so each Partial entry is read and written by one thread, in tile order.
                        d0 = m0v - n0
                        lo = d0 - (BN - 1)
                        hi = d0 + (BM - 1)
                        if causal:
                            t_lo = T.max(lo, 0)
                            t_hi = T.min(T.min(hi, W - 1), WP - 1)
                        else:
                            t_lo = T.if_then_else(lo > 0, lo, T.if_then_else(hi < 0, -hi, 0))
                            t_hi = T.min(T.min(T.max(hi, -lo), W - 1), WP - 1)
                        t_base = T.floordiv(t_lo, NS) * NS
                        if t_lo <= t_hi:
                            T.copy(sT, ds_s[0:BN, 0:BM])
                            for c in T.serial(T.floordiv(t_hi - t_base, NS) + 1):
                                for x in T.Parallel(NS):
                                    # the earlier tiles' sum, loaded first so its latency hides behind the loop
                                    t_in = T.And(t_base + c * NS + x >= t_lo, t_base + c * NS + x <= t_hi)
                                    t_at = T.max(T.min(t_base + c * NS + x, WP - 1), 0)
                                    if varlen:
                                        prev[x] = T.if_then_else(t_in, Partial[hv, prow, t_at], T.float32(0))
                                    else:
                                        prev[x] = T.if_then_else(t_in, Partial[bz, hv, prow, t_at], T.float32(0))
                                    diag[x] = T.float32(0)
                                    diag2[x] = T.float32(0)
                                for jp in T.unroll(BM // 2):  # two accumulators: shorter dependency chains
                                    for x in T.Parallel(NS):
                                        t = t_base + c * NS + x
                                        i1 = d0 + 2 * jp - t
                                        diag[x] = diag[x] + T.if_then_else(
                                            T.And(i1 >= 0, i1 < BN),
                                            ds_s[T.max(T.min(i1, BN - 1), 0), 2 * jp], T.float32(0))
                                        diag2[x] = diag2[x] + T.if_then_else(
                                            T.And(i1 + 1 >= 0, i1 + 1 < BN),
                                            ds_s[T.max(T.min(i1 + 1, BN - 1), 0), 2 * jp + 1], T.float32(0))
                                        if not causal:  # the mirrored diagonal -t
                                            i2 = d0 + 2 * jp + t
                                            diag[x] = diag[x] + T.if_then_else(
                                                T.And(T.And(i2 >= 0, i2 < BN), t > 0),
                                                ds_s[T.max(T.min(i2, BN - 1), 0), 2 * jp], T.float32(0))
                                            diag2[x] = diag2[x] + T.if_then_else(
                                                T.And(T.And(i2 + 1 >= 0, i2 + 1 < BN), t > 0),
                                                ds_s[T.max(T.min(i2 + 1, BN - 1), 0), 2 * jp + 1], T.float32(0))
                                for x in T.Parallel(NS):
                                    if T.And(t_base + c * NS + x >= t_lo, t_base + c * NS + x <= t_hi):
                                        if varlen:
                                            Partial[hv, prow, t_base + c * NS + x] = prev[x] + (diag[x] + diag2[x])
                                        else:
                                            Partial[bz, hv, prow, t_base + c * NS + x] = prev[x] + (diag[x] + diag2[x])
                    if varlen:
                        if m0v + BM > lb:  # the query tile crossing the document's end: the next document's rows
                            own_rows(m0v, lb, Qt_s, Q_s, dOt_s, dO_s)
                            T.gemm(aT_cast, dOt_s, acc_dv, policy=T.GemmWarpPolicy.FullRow)
                            T.gemm(dsT_cast, Qt_s, acc_dk, policy=T.GemmWarpPolicy.FullRow)
                        else:
                            T.gemm(aT_cast, dO_s, acc_dv, policy=T.GemmWarpPolicy.FullRow)
                            T.gemm(dsT_cast, Q_s, acc_dk, policy=T.GemmWarpPolicy.FullRow)
                    else:
                        T.gemm(aT_cast, dO_s, acc_dv, policy=T.GemmWarpPolicy.FullRow)
                        T.gemm(dsT_cast, Q_s, acc_dk, policy=T.GemmWarpPolicy.FullRow)

                for i, j in T.Parallel(BN, D):
                    acc_dk[i, j] = acc_dk[i, j] * scale
                # K and V are no longer read: their tiles stage dK and dV for TMA stores (varlen: the document's rows)
                T.copy(acc_dk, K_s)
                T.copy(acc_dv, V_s)
                store_rows(K_s, dK, seq, by, n0, lb)
                store_rows(V_s, dV, seq, by, n0, lb)

    return lazy_attention_bwd_dkdv
