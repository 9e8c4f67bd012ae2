"""TileLang kernel factory: pass 2 of lazy attention over a KV cache, the split's share of O.

One CTA per (split, batch row x kv head, row block), the grid of pass 1. It combines the partial LSEs of the batch
row's non-empty splits into each row's final LSE, then sweeps the split's keys once more:
A = relu(exp2(S - LSE) + tau / i), re-masked after each query and past the split, and acc += A @ V in fp32 (no
renormalisation). With ``keep`` the scores come back from pass 1's Scores [B * Hkv, R, SP] (K is not read
again); without, they are recomputed from K. It writes O [B, Hkv, R, D] itself when ``direct`` (one split), else
its fp32 partial OPart [NS, B * Hkv, RP, D] (nothing for a split with no keys).

A V tile that reaches past the split's last key (only the last split's last tile: splits are whole tiles) is
copied with those rows zeroed before its GEMM: cache slots at or past n_b may hold anything, NaN included, and
0 * NaN would poison the row. Layout: ``_lazy_attention_kvcache_tiles``.
"""

import functools

from ._build import import_tilelang
from ._lazy_attention_kvcache_tiles import LOG2E, band_scores_macro, row_info_macro, split_range, tile_counts


@functools.lru_cache(maxsize=None)
def build(head_dim: int, dtype: str, keep: bool, direct: bool, block_m: int, block_n: int, threads: int,
          num_stages: int):
    """The pass-2 ``T.prim_func``; parameters in order: Q, K, V, Bias, Tau, Seqlens, Scores, LsePart, O, OPart,
    lq (int32), scale (fp32)."""
    import_tilelang()
    import tilelang.language as T

    D, BM, BN = head_dim, block_m, block_n
    LANES = 8  # partial LSEs of one row loaded together
    f32 = "float32"
    B, Hkv, H, R, S, W, NS, BK, RP, SB, SR, SP, PS, PB, PR = T.dynamic(
        "B, Hkv, H, R, S, W, NS, BK, RP, SB, SR, SP, PS, PB, PR")
    rows = row_info_macro(BM)
    band = band_scores_macro(BM, BN)

    @T.prim_func
    def lazy_attention_kvcache_out(
        Q: T.Tensor([B, Hkv, R, D], dtype),
        K: T.Tensor([B, Hkv, S, D], dtype),
        V: T.Tensor([B, Hkv, S, D], dtype),
        Bias: T.Tensor([H, W], f32),
        Tau: T.Tensor([H], f32),
        Seqlens: T.Tensor([B], "int32"),
        Scores: T.Tensor([SB, SR, SP], f32),
        LsePart: T.Tensor([NS, BK, RP], f32),
        O: T.Tensor([B, Hkv, R, D], dtype),
        OPart: T.Tensor([PS, PB, PR, D], f32),
        lq: T.int32,
        scale: T.float32,
    ):
        with T.Kernel(NS, BK, T.ceildiv(R, BM), threads=threads) as (bx, by, bz):
            Q_s = T.alloc_shared([BM, D], dtype)
            K_s = T.alloc_shared([BN, D], dtype)
            S_s = T.alloc_shared([BM, BN], f32)
            V_s = T.alloc_shared([BN, D], dtype)
            Vt_s = T.alloc_shared([BN, D], dtype)
            A_s = T.alloc_shared([BM, BN], dtype)  # A leaves the score fragment's layout for the P @ V operand's
            s = T.alloc_fragment([BM, BN], f32)
            a_cast = T.alloc_fragment([BM, BN], dtype)
            acc = T.alloc_fragment([BM, D], f32)
            pos = T.alloc_fragment([BM], "int32")
            head = T.alloc_fragment([BM], "int32")
            lse2 = T.alloc_fragment([BM], f32)
            lse_max = T.alloc_fragment([BM], f32)
            lse_sum = T.alloc_fragment([BM], f32)
            thr = T.alloc_fragment([BM], f32)

            b = by // Hkv
            hk = by % Hkv
            r0 = bz * BM
            n_b = Seqlens[b]
            lo, hi, chunk = split_range(n_b, bx, NS, BN)
            _, free = tile_counts(lo, hi, n_b, lq, W, BN)
            # at least one tile, so that every TMA load issued (Q's) is waited for; a split without keys stores nothing
            n_tiles = T.max(T.ceildiv(hi - lo, BN), 1)
            sc2 = scale * LOG2E

            if not keep:
                T.copy(Q[b, hk, r0:r0 + BM, :], Q_s)
            rows(pos, head, r0, R, lq, n_b, hk, H // Hkv)
            # the partial LSEs of the non-empty splits, LANES loads in flight per row (no tile reduction here: a
            # reduce before the warp-specialised loop gets the producer's threads, not the consumer's)
            n_used = T.ceildiv(n_b, chunk)
            T.fill(lse_max, -T.infinity(f32))
            T.fill(lse_sum, 0)
            for u in T.serial(T.ceildiv(n_used, LANES)):
                for l in T.unroll(LANES):
                    for i in T.Parallel(BM):
                        lse_max[i] = T.max(lse_max[i], T.if_then_else(u * LANES + l < n_used,
                                                                      LsePart[u * LANES + l, by, r0 + i],
                                                                      -T.infinity(f32)))
            for u in T.serial(T.ceildiv(n_used, LANES)):
                for l in T.unroll(LANES):
                    for i in T.Parallel(BM):
                        lse_sum[i] += T.if_then_else(u * LANES + l < n_used,
                                                     T.exp2(LsePart[u * LANES + l, by, r0 + i] - lse_max[i]),
                                                     T.float32(0))
            for i in T.Parallel(BM):
                lse2[i] = lse_max[i] + T.log2(lse_sum[i])
                thr[i] = Tau[head[i]] / T.Cast(f32, pos[i] + 1)
            T.clear(acc)
            for t in T.Pipelined(n_tiles, num_stages=num_stages):
                n0 = lo + t * BN
                if keep:
                    T.copy(Scores[by, r0:r0 + BM, n0:n0 + BN], S_s)
                else:
                    T.copy(K[b, hk, n0:n0 + BN, :], K_s)
                T.copy(V[b, hk, n0:n0 + BN, :], V_s)
                if keep:
                    T.copy(S_s, s)
                else:
                    T.gemm(Q_s, K_s, s, transpose_B=True, clear_accum=True, policy=T.GemmWarpPolicy.FullRow)
                if t < free:
                    if not keep:
                        for i, j in T.Parallel(BM, BN):
                            s[i, j] = s[i, j] * sc2
                    for i, j in T.Parallel(BM, BN):
                        x = T.exp2(s[i, j] - lse2[i]) + thr[i]
                        a_cast[i, j] = T.if_then_else(x < 0, T.float32(0), x)  # a relu that keeps a NaN
                else:
                    if not keep:
                        band(s, pos, head, n0, hi, sc2, Bias)
                    for i, j in T.Parallel(BM, BN):
                        # a row at position 0 has one visible key: P = exp2(S - S) = 1 exactly
                        x = T.exp2(s[i, j] - T.if_then_else(pos[i] == 0, s[i, j], lse2[i])) + thr[i]
                        a_cast[i, j] = T.if_then_else(T.And(n0 + j <= pos[i], n0 + j < hi),
                                                      T.if_then_else(x < 0, T.float32(0), x), T.float32(0))
                T.copy(a_cast, A_s)
                if n0 + BN <= hi:
                    T.gemm(A_s, V_s, acc, policy=T.GemmWarpPolicy.FullRow)
                else:
                    for i, d in T.Parallel(BN, D):
                        Vt_s[i, d] = T.if_then_else(n0 + i < hi, V_s[i, d], T.cast(0, dtype))
                    T.gemm(A_s, Vt_s, acc, policy=T.GemmWarpPolicy.FullRow)
            if direct:
                T.copy(acc, O[b, hk, r0:r0 + BM, :])
            elif lo < hi:
                T.copy(acc, OPart[bx, by, r0:r0 + BM, :])

    return lazy_attention_kvcache_out
