"""The mHC pre backward kernels (SPEC section 2), no float atomics. Besides the forward's weights
kernel and one torch.sum (of the per-block dbias/dalpha sums), three launches:

1. ``token``: one program per block of BT_TOKEN tokens. Streams x and dh_in once for
   dh_pre = x . dh_in, then per token: the sigmoid gradients, the Sinkhorn backward through every
   iteration (iterates stored going forward in a per-block fp32 scratch and read back in
   reverse), dlogits [T, M] (gradient of the pre-activation logits, before alpha), the RMS term
   coef [T], h_pre [T, n], and this block's partial sums of dbias and dalpha [M + 3].
2. ``grad``: program (column chunk, token split) streams x and dh_in again and writes
   dx = dh_mix @ (phi * gamma) - coef * x + h_pre * dh_in, while accumulating
   dh_mix^T @ x over its tokens into a per-split partial [S, M, n*D] (tensor cores, products as in
   _mhc_common: about 17 bits of every fp32 operand). W = phi * gamma comes from the forward's
   weights kernel.
3. ``param``: sums the partials over the splits in a fixed order; writes dphi and dgamma.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ._mhc_common import autotune, dot_ww, dot_wx, sinkhorn_bwd, split_for

BT_TOKEN = 8  # tokens per program of the token kernel (fixed: it sizes the scratch and the partials)
TOKEN_CONFIGS = [
    triton.Config({"BK": 256}, num_warps=4, num_stages=2),
    triton.Config({"BK": 512}, num_warps=4, num_stages=2),
    triton.Config({"BK": 512}, num_warps=8, num_stages=3),
    triton.Config({"BK": 1024}, num_warps=8, num_stages=2),
]
TOKEN_INTERPRET_CONFIG = triton.Config({"BK": 64}, num_warps=4, num_stages=1)

_C = triton.Config
_GRAD_16BIT = [
    _C({"BT": 16, "BK": 256}, num_warps=8, num_stages=3), _C({"BT": 32, "BK": 128}, num_warps=8, num_stages=3),
    _C({"BT": 16, "BK": 128}, num_warps=4, num_stages=3), _C({"BT": 32, "BK": 64}, num_warps=4, num_stages=3),
    _C({"BT": 64, "BK": 64}, num_warps=8, num_stages=3)]
_GRAD_FP32 = [_C({"BT": 16, "BK": 64}, num_warps=4, num_stages=3), _C({"BT": 32, "BK": 64}, num_warps=8, num_stages=3),
              _C({"BT": 16, "BK": 128}, num_warps=4, num_stages=3)]
_GRAD_N8 = [_C({"BT": 16, "BK": 64}, num_warps=4, num_stages=3), _C({"BT": 32, "BK": 64}, num_warps=8, num_stages=3)]


def grad_configs(x_kind: int, n: int) -> list:
    """Autotuned configs of the grad kernel: tiles whose sm_90 build needs no register spills
    (fp32 x at n = 8 excepted), per x dtype (X_KIND) and n."""
    if n > 4:
        return _GRAD_N8
    return _GRAD_FP32 if x_kind == 2 else _GRAD_16BIT


GRAD_INTERPRET_CONFIG = triton.Config({"BT": 16, "BK": 64}, num_warps=4, num_stages=1)
GRAD_SPLIT_ALIGN = 64  # tokens per split are a multiple of this (every BT divides it)

PARAM_BC, PARAM_WARPS = 128, 4


@autotune(TOKEN_CONFIGS, TOKEN_INTERPRET_CONFIG, key=["N", "D"])
@triton.jit
def mhc_pre_bwd_token_kernel(x_ptr, g_ptr, dhp_ptr, dhr_ptr, z_ptr, inv_ptr, alpha_ptr, bias_ptr,
                             dlog_ptr, coef_ptr, hpre_ptr, part_ptr, scr_ptr,
                             T, D, sxt, sxi, sxd, sgt, sgd, ITERS, post_mult, pre_eps, sk_eps,
                             N: tl.constexpr, M: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr):
    """x [T, N, D], dh_in (g) [T, D] strided; dh_post [T, N], dh_res [T, N, N], z [T, M], inv_rms [T]
    fp32 contiguous. Writes dlogits [T, M], coef [T], h_pre [T, N], partials [blocks, M + 3] (fp32)."""
    BD: tl.constexpr = BK // N
    blk = tl.program_id(0)
    t = blk * BT + tl.arange(0, BT)
    tmask = t < T
    t64 = t.to(tl.int64)
    j = tl.arange(0, N)
    ij = j[:, None] * N + j[None, :]
    dd = tl.arange(0, BD)

    dh_pre = tl.zeros([BT, N], tl.float32)
    for d0 in range(0, D, BD):
        d = d0 + dd
        mask = tmask[:, None] & (d < D)[None, :]
        gv = tl.load(g_ptr + t64[:, None] * sgt + d[None, :] * sgd, mask=mask, other=0.0).to(tl.float32)
        for i in tl.static_range(N):
            xi = tl.load(x_ptr + t64[:, None] * sxt + i * sxi + d[None, :] * sxd, mask=mask, other=0.0)
            dh_pre += tl.where(j[None, :] == i, tl.sum(xi.to(tl.float32) * gv, 1)[:, None], 0.0)

    zrow = z_ptr + t64 * M
    zpre = tl.load(zrow[:, None] + j[None, :], mask=tmask[:, None], other=0.0)
    zpost = tl.load(zrow[:, None] + N + j[None, :], mask=tmask[:, None], other=0.0)
    zres = tl.load(zrow[:, None, None] + 2 * N + ij[None, :, :], mask=tmask[:, None, None], other=0.0)
    inv = tl.load(inv_ptr + t64, mask=tmask, other=0.0)
    a0 = tl.load(alpha_ptr)
    a1 = tl.load(alpha_ptr + 1)
    a2 = tl.load(alpha_ptr + 2)
    s_pre = tl.sigmoid(a0 * zpre + tl.load(bias_ptr + j)[None, :])
    d_pre = tl.where(tmask[:, None], dh_pre * s_pre * (1.0 - s_pre), 0.0)
    s_post = tl.sigmoid(a1 * zpost + tl.load(bias_ptr + N + j)[None, :])
    dhp = tl.load(dhp_ptr + t64[:, None] * N + j[None, :], mask=tmask[:, None], other=0.0)
    d_post = tl.where(tmask[:, None], dhp * post_mult * s_post * (1.0 - s_post), 0.0)
    dhr = tl.load(dhr_ptr + t64[:, None, None] * (N * N) + ij[None, :, :], mask=tmask[:, None, None], other=0.0)
    logits = a2 * zres + tl.load(bias_ptr + 2 * N + ij)[None, :, :]
    scr = scr_ptr + blk.to(tl.int64) * ((2 * ITERS - 1) * (BT * N * N)) + (tl.arange(0, BT)[:, None, None] * (N * N)
                                                                           + ij[None, :, :])
    d_res = sinkhorn_bwd(logits, dhr, ITERS, sk_eps, scr, BT * N * N)
    d_res = tl.where(tmask[:, None, None], d_res, 0.0)

    drow = dlog_ptr + t64 * M
    tl.store(drow[:, None] + j[None, :], d_pre, mask=tmask[:, None])
    tl.store(drow[:, None] + N + j[None, :], d_post, mask=tmask[:, None])
    tl.store(drow[:, None, None] + 2 * N + ij[None, :, :], d_res, mask=tmask[:, None, None])
    za_pre = tl.sum(d_pre * zpre, 1)
    za_post = tl.sum(d_post * zpost, 1)
    za_res = tl.sum(tl.sum(d_res * zres, 2), 1)
    coef = (a0 * za_pre + a1 * za_post + a2 * za_res) * inv * inv / (N * D)
    tl.store(coef_ptr + t64, coef, mask=tmask)
    tl.store(hpre_ptr + t64[:, None] * N + j[None, :], s_pre + pre_eps, mask=tmask[:, None])

    prow = part_ptr + blk.to(tl.int64) * (M + 3)
    tl.store(prow + j, tl.sum(d_pre, 0))
    tl.store(prow + N + j, tl.sum(d_post, 0))
    tl.store(prow + 2 * N + ij, tl.sum(d_res, 0))
    tl.store(prow + M, tl.sum(za_pre, 0))
    tl.store(prow + M + 1, tl.sum(za_post, 0))
    tl.store(prow + M + 2, tl.sum(za_res, 0))


@autotune(grad_configs, GRAD_INTERPRET_CONFIG, key=["N", "D", "X_KIND"])
@triton.jit
def mhc_pre_bwd_grad_kernel(x_ptr, g_ptr, w_ptr, wlo_ptr, alpha_ptr, dlog_ptr, inv_ptr, coef_ptr, hpre_ptr,
                            dx_ptr, part_ptr, T, D, TPS, sxt, sxi, sxd, sgt, sgd,
                            X_KIND: tl.constexpr, N: tl.constexpr, M: tl.constexpr, MP: tl.constexpr,
                            BT: tl.constexpr, BK: tl.constexpr):
    """Grid (column chunks of BK // N per stream, token splits of TPS tokens); W as in the forward.

    Writes dx [T, N, D] (x's dtype, contiguous) and partial dh_mix^T @ x [S, M, N*D] fp32.
    """
    BD: tl.constexpr = BK // N
    ND = N * D
    k = tl.arange(0, BK)
    ki = k // BD
    d = tl.program_id(0) * BD + k % BD
    dmask = d < D
    col = ki * D + d
    m = tl.arange(0, MP)
    mmask = m < M
    w_off = m[:, None] * ND + col[None, :]
    w_mask = mmask[:, None] & dmask[None, :]
    w_hi = tl.load(w_ptr + w_off, mask=w_mask, other=0.0)
    if X_KIND == 2:
        w_lo = w_hi
    else:
        w_lo = tl.load(wlo_ptr + w_off, mask=w_mask, other=0.0)
    a_col = tl.load(alpha_ptr + tl.where(m < N, 0, tl.where(m < 2 * N, 1, 2)))

    acc = tl.zeros([MP, BK], tl.float32)
    s = tl.program_id(1)
    t_lo = s * TPS
    t_hi = tl.minimum(T, t_lo + TPS)
    x_cols = x_ptr + ki.to(tl.int64)[None, :] * sxi + d[None, :] * sxd
    for t0 in range(t_lo, t_hi, BT):
        t = t0 + tl.arange(0, BT)
        tmask = t < t_hi
        t64 = t.to(tl.int64)
        inv = tl.load(inv_ptr + t64, mask=tmask, other=0.0)
        dl = tl.load(dlog_ptr + t64[:, None] * M + m[None, :], mask=tmask[:, None] & mmask[None, :], other=0.0)
        d_hi, d_lo = split_for(dl * a_col[None, :] * inv[:, None], X_KIND)
        mask = tmask[:, None] & dmask[None, :]
        xk = tl.load(x_cols + t64[:, None] * sxt, mask=mask, other=0.0)
        acc = dot_wx(tl.trans(d_hi), tl.trans(d_lo), xk, acc, X_KIND)
        dx = dot_ww(d_hi, d_lo, w_hi, w_lo, tl.zeros([BT, BK], tl.float32), X_KIND)
        coef = tl.load(coef_ptr + t64, mask=tmask, other=0.0)
        dx -= coef[:, None] * xk.to(tl.float32)
        gk = tl.load(g_ptr + t64[:, None] * sgt + d[None, :] * sgd, mask=mask, other=0.0)
        hp = tl.load(hpre_ptr + t64[:, None] * N + ki[None, :], mask=mask, other=0.0)
        dx += hp * gk.to(tl.float32)
        tl.store(dx_ptr + t64[:, None] * ND + col[None, :], dx.to(dx_ptr.dtype.element_ty), mask=mask)
    tl.store(part_ptr + s.to(tl.int64) * (M * ND) + m[:, None] * ND + col[None, :], acc,
             mask=mmask[:, None] & dmask[None, :])


@triton.jit
def mhc_pre_bwd_param_kernel(part_ptr, phi_ptr, gamma_ptr, dphi_ptr, dgamma_ptr, S, ND,
                             HAS_GAMMA: tl.constexpr, M: tl.constexpr, MP: tl.constexpr, BC: tl.constexpr):
    """partials [S, M, ND] -> dphi [M, ND] (= sum * gamma) and dgamma [ND] (= sum_m sum * phi), fp32."""
    c = tl.program_id(0) * BC + tl.arange(0, BC)
    cmask = c < ND
    m = tl.arange(0, MP)
    mask = (m < M)[:, None] & cmask[None, :]
    off = m[:, None] * ND + c[None, :]
    gp = tl.zeros([MP, BC], tl.float32)
    for s in range(S):
        gp += tl.load(part_ptr + s * (M * ND) + off, mask=mask, other=0.0)
    if HAS_GAMMA:
        gamma = tl.load(gamma_ptr + c, mask=cmask, other=0.0)
        tl.store(dphi_ptr + off, gp * gamma[None, :], mask=mask)
        phi = tl.load(phi_ptr + off, mask=mask, other=0.0)
        tl.store(dgamma_ptr + c, tl.sum(gp * phi, 0), mask=cmask)
    else:
        tl.store(dphi_ptr + off, gp, mask=mask)
