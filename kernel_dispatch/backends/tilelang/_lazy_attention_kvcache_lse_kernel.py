"""TileLang kernel factory: pass 1 of lazy attention over a KV cache, the split's partial log-sum-exp.

One CTA per (split, batch row x kv head, row block) reads the split's K tiles once, forms the log2-domain scores
of its BM rows (scaled, biased within W, masked after each query and past the split), keeps their online max and
sum of exp2, and writes the partial LSE (log2) of each row to LsePart [NS, B * Hkv, RP]; with ``keep`` it also
writes the scores of the valid rows to Scores [B * Hkv, R, SP] fp32 for pass 2. Splits with no keys write
nothing. Layout: ``_lazy_attention_kvcache_tiles``; B, Hkv, H, R, S, W, NS, SP and lq are symbolic.
"""

import functools

from ._build import import_tilelang
from ._lazy_attention_kvcache_tiles import LOG2E, band_scores_macro, row_info_macro, split_range, tile_counts


@functools.lru_cache(maxsize=None)
def build(head_dim: int, dtype: str, keep: bool, block_m: int, block_n: int, threads: int, num_stages: int):
    """The pass-1 ``T.prim_func``; parameters in order: Q, K, Bias, Seqlens, Scores, LsePart, lq (int32),
    scale (fp32)."""
    import_tilelang()
    import tilelang.language as T

    D, BM, BN = head_dim, block_m, block_n
    f32 = "float32"
    B, Hkv, H, R, S, W, NS, BK, RP, SP, SB, SR = T.dynamic("B, Hkv, H, R, S, W, NS, BK, RP, SP, SB, SR")
    rows = row_info_macro(BM)
    band = band_scores_macro(BM, BN)

    @T.prim_func
    def lazy_attention_kvcache_lse(
        Q: T.Tensor([B, Hkv, R, D], dtype),
        K: T.Tensor([B, Hkv, S, D], dtype),
        Bias: T.Tensor([H, W], f32),
        Seqlens: T.Tensor([B], "int32"),
        Scores: T.Tensor([SB, SR, SP], f32),
        LsePart: T.Tensor([NS, BK, RP], f32),
        lq: T.int32,
        scale: T.float32,
    ):
        with T.Kernel(NS, BK, T.ceildiv(R, BM), threads=threads) as (bx, by, bz):
            Q_s = T.alloc_shared([BM, D], dtype)
            K_s = T.alloc_shared([BN, D], dtype)
            s = T.alloc_fragment([BM, BN], f32)
            pos = T.alloc_fragment([BM], "int32")
            head = T.alloc_fragment([BM], "int32")
            row_max = T.alloc_fragment([BM], f32)
            row_prev = T.alloc_fragment([BM], f32)
            m_use = T.alloc_fragment([BM], f32)
            row_sum = T.alloc_fragment([BM], f32)
            denom = T.alloc_fragment([BM], f32)

            b = by // Hkv
            hk = by % Hkv
            r0 = bz * BM
            n_b = Seqlens[b]
            lo, hi, _ = split_range(n_b, bx, NS, BN)
            _, free = tile_counts(lo, hi, n_b, lq, W, BN)
            # at least one tile, so that every TMA load issued (Q's) is waited for; a split without keys stores nothing
            n_tiles = T.max(T.ceildiv(hi - lo, BN), 1)
            sc2 = scale * LOG2E

            T.copy(Q[b, hk, r0:r0 + BM, :], Q_s)
            rows(pos, head, r0, R, lq, n_b, hk, H // Hkv)
            T.fill(row_max, -T.infinity(f32))
            T.fill(denom, 0)
            for t in T.Pipelined(n_tiles, num_stages=num_stages):
                n0 = lo + t * BN
                T.copy(K[b, hk, n0:n0 + BN, :], K_s)  # slots past n_b may hold anything: masked by index below
                T.gemm(Q_s, K_s, s, transpose_B=True, clear_accum=True, policy=T.GemmWarpPolicy.FullRow)
                if t < free:
                    for i, j in T.Parallel(BM, BN):
                        s[i, j] = s[i, j] * sc2
                else:
                    band(s, pos, head, n0, hi, sc2, Bias)
                if keep:  # a split's last tile ends past n_b (splits are whole tiles): no other split's keys
                    for i, j in T.Parallel(BM, BN):
                        if r0 + i < R:
                            Scores[by, r0 + i, n0 + j] = s[i, j]
                T.copy(row_max, row_prev)
                T.reduce_max(s, row_max, dim=1, clear=False)
                for i in T.Parallel(BM):  # rows with every score -inf so far keep (-inf, 0)
                    m_use[i] = T.if_then_else(row_max[i] == -T.infinity(f32), T.float32(0), row_max[i])
                for i, j in T.Parallel(BM, BN):
                    s[i, j] = T.exp2(s[i, j] - m_use[i])
                T.reduce_sum(s, row_sum, dim=1)
                for i in T.Parallel(BM):
                    denom[i] = denom[i] * T.exp2(row_prev[i] - m_use[i]) + row_sum[i]
            if lo < hi:
                for i in T.Parallel(BM):
                    LsePart[bx, by, r0 + i] = row_max[i] + T.log2(denom[i])

    return lazy_attention_kvcache_lse
