"""TileLang kernel factory: the lazy attention backward's dQ (no atomics).

One CTA per (query block, head, batch) walks the visible key blocks, recomputes P, Mk and
dA = dO . V^T, forms dS = P (Mk dA - Delta) and accumulates dQ = scale * dS @ K in fp32
(SPEC section 1). Rows past lengths[b] get zeros.

Layout: Q, dO [B, H, L, D]; K, V [B, Hkv, L, D], contiguous fp16/bf16; Bias [H, W], Tau [H]
fp32; Lens [B] int32; LSE, Delta [B, H, LP] fp32 (LP >= L). Out: dQ [B, H, L, D] in q's dtype.
B, H, Hkv, L, LP, W are symbolic.
"""

import functools

from ._build import import_tilelang
from ._lazy_attention_tiles import (LOG2E, distance_table_macro, distance_table_size, first_query, is_free_tile,
                                    key_blocks, one_key_rows_macro, score_macro)


@functools.lru_cache(maxsize=None)
def build(head_dim: int, dtype: str, causal: bool, block_m: int = 128, block_n: int = 128, threads: int = 256,
          num_stages: int = 2):
    """The dQ ``T.prim_func``; parameters: Q, K, V, dO, Bias, Tau, Lens, LSE, Delta, dQ, scale."""
    import_tilelang()
    import tilelang.language as T

    D, BM, BN = head_dim, block_m, block_n
    f32 = "float32"
    B, H, Hkv, L, LP, W = T.dynamic("B, H, Hkv, L, LP, W")
    scores = score_macro(BM, BN, causal, transposed=False, mask_rows=True)
    fill_table = distance_table_macro(BM, BN, causal)
    one_key_rows = one_key_rows_macro(BM, BN, causal)

    @T.prim_func
    def lazy_attention_bwd_dq(
        Q: T.Tensor([B, H, L, D], dtype),
        K: T.Tensor([B, Hkv, L, D], dtype),
        V: T.Tensor([B, Hkv, L, D], dtype),
        dO: T.Tensor([B, H, L, D], dtype),
        Bias: T.Tensor([H, W], f32),
        Tau: T.Tensor([H], f32),
        Lens: T.Tensor([B], "int32"),
        LSE: T.Tensor([B, H, LP], f32),
        Delta: T.Tensor([B, H, LP], f32),
        dQ: T.Tensor([B, H, L, D], dtype),
        scale: T.float32,
    ):
        with T.Kernel(H, B, T.ceildiv(L, BM), threads=threads) as (by, bz, bx):
            Q_s = T.alloc_shared([BM, D], dtype)
            dO_s = T.alloc_shared([BM, D], dtype)
            K_s = T.alloc_shared([BN, D], dtype)
            V_s = T.alloc_shared([BN, D], dtype)
            s = T.alloc_fragment([BM, BN], f32)
            dp = T.alloc_fragment([BM, BN], f32)
            ds_cast = T.alloc_fragment([BM, BN], dtype)
            acc_dq = T.alloc_fragment([BM, D], f32)
            lse2 = T.alloc_fragment([BM], f32)
            thr = T.alloc_fragment([BM], f32)
            delta = T.alloc_fragment([BM], f32)
            tmp = T.alloc_fragment([BM], f32)

            table = T.alloc_shared([distance_table_size(BM, BN)], f32)  # log2-domain bias by distance
            m0 = first_query(bx, L, BM, causal)
            hk = by // (H // Hkv)
            lb = Lens[bz]
            tau = Tau[by]
            sc2 = scale * LOG2E
            n_blocks = key_blocks(m0, lb, BM, BN, causal)

            T.copy(Q[bz, by, m0:m0 + BM, :], Q_s)
            fill_table(table, Bias, by)
            T.copy(dO[bz, by, m0:m0 + BM, :], dO_s)
            T.copy(LSE[bz, by, m0:m0 + BM], lse2)
            T.copy(Delta[bz, by, m0:m0 + BM], delta)
            for i in T.Parallel(BM):
                lse2[i] = lse2[i] * LOG2E
                thr[i] = tau / T.Cast(f32, (m0 + i + 1) if causal else lb)
            T.clear(acc_dq)
            for k in T.Pipelined(n_blocks, num_stages=num_stages):
                T.copy(K[bz, hk, k * BN:(k + 1) * BN, :], K_s)
                T.copy(V[bz, hk, k * BN:(k + 1) * BN, :], V_s)
                T.gemm(Q_s, K_s, s, transpose_B=True, clear_accum=True, policy=T.GemmWarpPolicy.FullRow)
                T.gemm(dO_s, V_s, dp, transpose_B=True, clear_accum=True, policy=T.GemmWarpPolicy.FullRow)
                scores(s, m0, k * BN, lb, sc2, Bias, by, is_free_tile(m0, k * BN, BM, BN, lb, W, True), table)
                one_key_rows(s, lse2, m0, k * BN, lb, tmp)
                for i, j in T.Parallel(BM, BN):
                    ds_cast[i, j] = T.exp2(s[i, j] - lse2[i]) * (
                        T.if_then_else(T.And(s[i, j] > -T.infinity(f32), T.exp2(s[i, j] - lse2[i]) + thr[i] > 0),
                                       dp[i, j], T.float32(0)) - delta[i])
                T.gemm(ds_cast, K_s, acc_dq, policy=T.GemmWarpPolicy.FullRow)
            for i, j in T.Parallel(BM, D):
                acc_dq[i, j] = acc_dq[i, j] * scale
            T.copy(acc_dq, dQ[bz, by, m0:m0 + BM, :])

    return lazy_attention_bwd_dq
