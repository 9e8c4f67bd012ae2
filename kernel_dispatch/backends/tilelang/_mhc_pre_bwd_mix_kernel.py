"""TileLang kernel factory: the mHC pre backward through the mixings (SPEC section 2).

Per token, from the saved z and inv_rms and the upstream gradients: the Sinkhorn iterates are
recomputed (their inputs and sums kept in shared memory) and the exact gradient of the truncated
iteration runs back through every normalisation and the softmax; the sigmoids give d_pre and
d_post. Then dz = [a0 d_pre, a1 d_post, a2 d_res], G = dh_mix = dz * inv_rms and
coef = sum(dz * z) * inv_rms / (n*D) (so that dx = G @ pg - coef * (inv_rms * x) + h_pre * dh_in).

G leaves in bf16 pieces for the dx / dphi GEMMs: Gp [T, GP_COLS] = [G_hi, 0, G_lo, 0] in column
blocks of G_BLOCK (M = 24 values, then zeros), G = G_hi + G_lo up to 2^-17. Parameter-gradient
partials per CTA b (a fixed-order reduction over its tokens): PG[m, b] = sum d[., m] (dbias) and
PG[PG_DALPHA + g, b] = sum over the tokens and the rows of group g (pre, post, res) of d * z (dalpha).

Layout: Z [T, M], InvRms [T], DHPre [T, n], DHPost [T, n], DHRes [T, n, n], Alpha [3], Bias [M]
fp32 in; Gp [T, GP_COLS] bf16, Aux [T, AUX_COLS] fp32 (column AUX_COEF: coef, AUX_H_PRE + i: h_pre[i],
AUX_INV: inv_rms, the rest 0), PG [PG_ROWS, ceil(T/TOKENS)] fp32 out. T symbolic.
"""
from __future__ import annotations

import functools

from ._build import import_tilelang
from ._mhc_common import N_STREAMS

G_BLOCK = 32                # columns of one bf16 piece of G in Gp (M <= G_BLOCK)
GP_COLS = 2 * G_BLOCK       # Gp: [G_hi, 0, G_lo, 0]
AUX_COLS = 8                # Aux: coef, h_pre[0..n-1], inv_rms, 2 zeros
AUX_COEF, AUX_H_PRE, AUX_INV = 0, 1, 1 + N_STREAMS  # Aux columns of coef, of h_pre[0] and of inv_rms
PG_ROWS = 64                # PG: rows m < M the dbias sums, PG_DALPHA + g the dalpha sums of group g
PG_DALPHA = 32
TOKENS = 16                 # tokens per CTA


@functools.lru_cache(maxsize=None)
def build(D: int, sinkhorn_iters: int, post_mult: float, pre_eps: float, sinkhorn_eps: float, TB: int = TOKENS,
          threads: int = 128):
    """The backward-mix ``T.prim_func`` for feature size ``D`` and the SPEC hyper-parameters.

    Parameters, in order: Z, InvRms, DHPre, DHPost, DHRes, Alpha, Bias, Gp, Aux, PG.
    """
    import_tilelang()
    import tilelang.language as T

    n, f32, bf = N_STREAMS, "float32", "bfloat16"
    M = n * n + 2 * n
    R, eps = sinkhorn_iters, sinkhorn_eps
    NS = 2 * R - 1  # normalisation steps: column, then (row, column) R - 1 times
    nt = T.dynamic("num_tokens")

    @T.prim_func
    def mhc_pre_bwd_mix(Z: T.Tensor((nt, M), f32), InvRms: T.Tensor((nt,), f32), DHPre: T.Tensor((nt, n), f32),
                        DHPost: T.Tensor((nt, n), f32), DHRes: T.Tensor((nt, n, n), f32), Alpha: T.Tensor((3,), f32),
                        Bias: T.Tensor((M,), f32), Gp: T.Tensor((nt, GP_COLS), bf), Aux: T.Tensor((nt, AUX_COLS), f32),
                        PG: T.Tensor((PG_ROWS, T.ceildiv(nt, TB)), f32)):
        with T.Kernel(T.ceildiv(nt, TB), threads=threads) as b:
            t0 = b * TB
            z_sh = T.alloc_shared((TB, M), f32)
            inv_sh = T.alloc_shared((TB,), f32)
            dhp_sh = T.alloc_shared((TB, 2 * n), f32)
            xin = T.alloc_shared((NS + 1, TB, n, n), f32)   # [0]: softmax; [k + 1]: input of step k
            ssum = T.alloc_shared((NS, TB, n), f32)          # the sum step k divides by (without eps)
            d_sh = T.alloc_shared((TB, M), f32)              # d loss / d (pre-activation), unscaled by alpha
            g_sh = T.alloc_shared((TB, G_BLOCK), f32)
            T.copy(Z[t0:t0 + TB, :], z_sh)
            T.copy(InvRms[t0:t0 + TB], inv_sh)
            for i, j in T.Parallel(TB, n):
                dhp_sh[i, j] = T.if_then_else(t0 + i < nt, DHPre[t0 + i, j], 0.0)
                dhp_sh[i, n + j] = T.if_then_else(t0 + i < nt, DHPost[t0 + i, j], 0.0)

            cm = T.alloc_fragment((TB, n, n), f32)
            gr = T.alloc_fragment((TB, n, n), f32)
            tmp = T.alloc_fragment((TB, n, n), f32)
            rs = T.alloc_fragment((TB, n), f32)      # sums over the last dim (rows), [i, r]
            cs = T.alloc_fragment((TB, n), f32)      # sums over dim 1 (columns), [i, c]
            rs2 = T.alloc_fragment((TB, n), f32)
            cs2 = T.alloc_fragment((TB, n), f32)
            # forward recompute, keeping every step's input
            for i, r, c in T.Parallel(TB, n, n):
                cm[i, r, c] = Alpha[2] * z_sh[i, 2 * n + r * n + c] + Bias[2 * n + r * n + c]
            T.reduce_max(cm, rs, dim=2)
            for i, r, c in T.Parallel(TB, n, n):
                cm[i, r, c] = T.exp(cm[i, r, c] - rs[i, r])
            T.reduce_sum(cm, rs, dim=2)
            for i, r, c in T.Parallel(TB, n, n):
                cm[i, r, c] = cm[i, r, c] / rs[i, r]
            T.copy(cm, xin[0, :, :, :])
            for i, r, c in T.Parallel(TB, n, n):
                cm[i, r, c] = cm[i, r, c] + eps
            for k in T.serial(NS):
                T.copy(cm, xin[k + 1, :, :, :])
                if k % 2 == 0:
                    T.reduce_sum(cm, cs, dim=1)
                    T.copy(cs, ssum[k, :, :])
                    for i, r, c in T.Parallel(TB, n, n):
                        cm[i, r, c] = cm[i, r, c] / (cs[i, c] + eps)
                else:
                    T.reduce_sum(cm, rs, dim=2)
                    T.copy(rs, ssum[k, :, :])
                    for i, r, c in T.Parallel(TB, n, n):
                        cm[i, r, c] = cm[i, r, c] / (rs[i, r] + eps)

            # backward, last step first: y = c / (s + eps)  =>  dc = (dy - sum(dy * c) / (s + eps)) / (s + eps)
            T.copy(DHRes[t0:t0 + TB, :, :], gr)
            for kk in T.serial(NS):
                k = NS - 1 - kk
                T.copy(xin[k + 1, :, :, :], cm)
                for i, r, c in T.Parallel(TB, n, n):
                    tmp[i, r, c] = gr[i, r, c] * cm[i, r, c]
                if k % 2 == 0:
                    T.copy(ssum[k, :, :], cs)
                    T.reduce_sum(tmp, cs2, dim=1)
                    for i, r, c in T.Parallel(TB, n, n):
                        gr[i, r, c] = (gr[i, r, c] - cs2[i, c] / (cs[i, c] + eps)) / (cs[i, c] + eps)
                else:
                    T.copy(ssum[k, :, :], rs)
                    T.reduce_sum(tmp, rs2, dim=2)
                    for i, r, c in T.Parallel(TB, n, n):
                        gr[i, r, c] = (gr[i, r, c] - rs2[i, r] / (rs[i, r] + eps)) / (rs[i, r] + eps)
            T.copy(xin[0, :, :, :], cm)
            for i, r, c in T.Parallel(TB, n, n):
                tmp[i, r, c] = gr[i, r, c] * cm[i, r, c]
            T.reduce_sum(tmp, rs2, dim=2)
            for i, r, c in T.Parallel(TB, n, n):
                d_sh[i, 2 * n + r * n + c] = (gr[i, r, c] - rs2[i, r]) * cm[i, r, c]

            # the sigmoids of pre and post
            for i, j in T.Parallel(TB, n):
                sp = T.sigmoid(Alpha[0] * z_sh[i, j] + Bias[j])
                so = T.sigmoid(Alpha[1] * z_sh[i, n + j] + Bias[n + j])
                d_sh[i, j] = dhp_sh[i, j] * sp * (1.0 - sp)
                d_sh[i, n + j] = dhp_sh[i, n + j] * post_mult * so * (1.0 - so)
                if t0 + i < nt:
                    Aux[t0 + i, AUX_H_PRE + j] = sp + pre_eps

            # G, coef, and the parameter partials
            dzz = T.alloc_fragment((TB, G_BLOCK), f32)
            coef = T.alloc_fragment((TB,), f32)
            for i, m in T.Parallel(TB, G_BLOCK):
                a = T.if_then_else(m < n, Alpha[0], T.if_then_else(m < 2 * n, Alpha[1], Alpha[2]))
                mm = T.min(m, M - 1)
                dzz[i, m] = T.if_then_else(m < M, d_sh[i, mm] * a * z_sh[i, mm], 0.0)
            T.reduce_sum(dzz, coef, dim=1)
            for i, m in T.Parallel(TB, G_BLOCK):
                g_sh[i, m] = T.if_then_else(m < M, d_sh[i, T.min(m, M - 1)] * inv_sh[i], 0.0)
                g_sh[i, m] = g_sh[i, m] * T.if_then_else(m < n, Alpha[0], T.if_then_else(m < 2 * n, Alpha[1], Alpha[2]))
            for i in T.Parallel(TB):
                if t0 + i < nt:
                    # the RMS term's factors apart: inv_rms^2 alone underflows once the RMS passes 2^63
                    Aux[t0 + i, AUX_COEF] = coef[i] * inv_sh[i] / (n * D)
                    Aux[t0 + i, AUX_INV] = inv_sh[i]
                    Aux[t0 + i, AUX_H_PRE + n + 1] = 0.0
                    Aux[t0 + i, AUX_H_PRE + n + 2] = 0.0
            for i, c in T.Parallel(TB, GP_COLS):
                v = g_sh[i, c % G_BLOCK]
                hi = T.cast(v, bf)
                if t0 + i < nt:
                    Gp[t0 + i, c] = T.if_then_else(c // G_BLOCK == 1, T.cast(v - T.cast(hi, f32), bf), hi)

            dsum = T.alloc_fragment((TB, PG_ROWS), f32)
            col = T.alloc_fragment((PG_ROWS,), f32)
            for i, c in T.Parallel(TB, PG_ROWS):
                # column m < M: d[., m] (dbias); columns PG_DALPHA + 0, 1, 2: sum of d * z over the pre, post,
                # res rows
                lo = T.if_then_else(c == PG_DALPHA, 0, T.if_then_else(c == PG_DALPHA + 1, n, 2 * n))
                cnt = T.if_then_else(c == PG_DALPHA + 2, n * n,
                                     T.if_then_else(T.And(c >= PG_DALPHA, c < PG_DALPHA + 2), n, 0))
                acc = T.alloc_var(f32)
                acc = 0.0
                for q in T.serial(n * n):
                    if q < cnt:
                        acc += d_sh[i, lo + q] * z_sh[i, lo + q]
                dsum[i, c] = T.if_then_else(c < M, d_sh[i, T.min(c, M - 1)], acc)
            T.reduce_sum(dsum, col, dim=0)
            for q in T.Parallel(PG_ROWS):
                PG[q, b] = col[q]

    return mhc_pre_bwd_mix
