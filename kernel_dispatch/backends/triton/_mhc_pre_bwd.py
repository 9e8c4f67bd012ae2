"""The mHC pre backward kernels (SPEC section 2), no float atomics. Besides the forward's weights
kernel and one torch.sum (of the per-block dbias/dalpha sums), three launches:

1. ``token``: one program per block of BT_TOKEN tokens. Streams x and dh_in once for
   dh_pre = x . dh_in (elementwise products accumulated in a register tile, reduced once after
   the loop), then per token: the sigmoid gradients, the Sinkhorn backward through every
   iteration (iterates stored going forward in a per-block fp32 scratch and read back in
   reverse), G = dh_mix [T, M] written as the grad kernel's GEMM operand ``gq`` (bf16 hi | lo
   pieces for 16-bit x, fp32 for fp32 x, zero padded), the RMS term coef [T, 2], h_pre [T, n], and
   this block's partial sums of dbias and dalpha [M + 3].
2. ``grad`` (_mhc_pre_bwd_grad): dx (plus an optional incoming dx_acc) and the per-split
   partials of G^T @ x [S, M, n*D].
3. ``param``: sums the partials over the splits in a fixed order; writes dphi and dgamma.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ._autotune import autotune
from ._mhc_common import sinkhorn_bwd

BT_TOKEN = 8  # tokens per program of the token kernel (fixed: it sizes the scratch and the partials)
TOKEN_CONFIGS = [
    triton.Config({"BK": 256}, num_warps=4, num_stages=2),
    triton.Config({"BK": 512}, num_warps=4, num_stages=2),
    triton.Config({"BK": 512}, num_warps=8, num_stages=3),
    triton.Config({"BK": 1024}, num_warps=8, num_stages=2),
]
TOKEN_INTERPRET_CONFIG = triton.Config({"BK": 64}, num_warps=4, num_stages=1)
PARAM_BC, PARAM_WARPS = 128, 4


@triton.jit
def _store_g(gq_ptr, t, c, mask, g, X_KIND: tl.constexpr, MP: tl.constexpr):
    """gq[t, c] = fp32 g (t, c, mask and g broadcast together): bf16 hi at column c and lo at
    c + MP for 16-bit x (X_KIND 0, 1), or g itself for fp32 x (rows of MP)."""
    if X_KIND == 2:
        tl.store(gq_ptr + t * MP + c, g, mask=mask)
    else:
        hi = g.to(tl.bfloat16)
        lo = (g - hi.to(tl.float32)).to(tl.bfloat16)
        tl.store(gq_ptr + t * (2 * MP) + c, hi, mask=mask)
        tl.store(gq_ptr + t * (2 * MP) + MP + c, lo, mask=mask)


@autotune(TOKEN_CONFIGS, TOKEN_INTERPRET_CONFIG, key=["N", "D", "X_KIND", "T_CLASS"])
@triton.jit
def mhc_pre_bwd_token_kernel(x_ptr, g_ptr, dhp_ptr, dhr_ptr, z_ptr, inv_ptr, alpha_ptr, bias_ptr,
                             gq_ptr, coef_ptr, hpre_ptr, part_ptr, scr_ptr,
                             T, D, sxt, sxi, sxd, sgt, sgd, ITERS, post_mult, pre_eps, sk_eps,
                             X_KIND: tl.constexpr, N: tl.constexpr, M: tl.constexpr, MP: tl.constexpr,
                             BT: tl.constexpr, BK: tl.constexpr, T_CLASS):
    """x [T, N, D], dh_in (g) [T, D] strided; dh_post [T, N], dh_res [T, N, N], z [T, M], inv_rms [T]
    fp32 contiguous. Writes gq (G = dh_mix: [T, 2*MP] bf16 [hi | lo] for 16-bit x, [T, MP] fp32 for
    fp32 x, zero padded), coef [T, 2] (see the grad kernel), h_pre [T, N], partials [blocks, M + 3] (fp32)."""
    BD: tl.constexpr = BK // N
    blk = tl.program_id(0)
    t = blk * BT + tl.arange(0, BT)
    tmask = t < T
    t64 = t.to(tl.int64)
    j = tl.arange(0, N)
    ij = j[:, None] * N + j[None, :]
    dd = tl.arange(0, BD)

    # x . dh_in: products summed elementwise over the chunks, reduced across threads once
    x_rows = x_ptr + t64[:, None, None] * sxt + j[None, :, None] * sxi
    prod = tl.zeros([BT, N, BD], tl.float32)
    for d0 in range(0, D, BD):
        d = d0 + dd
        mask = tmask[:, None] & (d < D)[None, :]
        gv = tl.load(g_ptr + t64[:, None] * sgt + d[None, :] * sgd, mask=mask, other=0.0).to(tl.float32)
        xv = tl.load(x_rows + d[None, None, :] * sxd, mask=mask[:, None, :], other=0.0)
        prod += xv.to(tl.float32) * gv[:, None, :]
    dh_pre = tl.sum(prod, 2)

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

    inv2 = inv[:, None]
    t2, t3 = t64[:, None], t64[:, None, None]
    _store_g(gq_ptr, t2, j[None, :], tmask[:, None], d_pre * a0 * inv2, X_KIND, MP)
    _store_g(gq_ptr, t2, N + j[None, :], tmask[:, None], d_post * a1 * inv2, X_KIND, MP)
    _store_g(gq_ptr, t3, 2 * N + ij[None, :, :], tmask[:, None, None], d_res * a2 * inv[:, None, None], X_KIND, MP)
    GR: tl.constexpr = MP if X_KIND == 2 else 2 * MP
    pad = tl.arange(0, GR)
    tl.store(gq_ptr + t64[:, None] * GR + pad[None, :], tl.zeros([BT, GR], gq_ptr.dtype.element_ty),
             mask=tmask[:, None] & ((pad % MP) >= M)[None, :])
    za_pre = tl.sum(d_pre * zpre, 1)
    za_post = tl.sum(d_post * zpost, 1)
    za_res = tl.sum(tl.sum(d_res * zres, 2), 1)
    # the RMS term (dz . z) inv^2 / (N*D) as two factors: inv^2 alone underflows once the RMS passes 2^63
    coef = (a0 * za_pre + a1 * za_post + a2 * za_res) * inv / (N * D)
    tl.store(coef_ptr + 2 * t64, coef, mask=tmask)
    tl.store(coef_ptr + 2 * t64 + 1, inv, mask=tmask)
    tl.store(hpre_ptr + t64[:, None] * N + j[None, :], s_pre + pre_eps, mask=tmask[:, None])

    prow = part_ptr + blk.to(tl.int64) * (M + 3)
    tl.store(prow + j, tl.sum(d_pre, 0))
    tl.store(prow + N + j, tl.sum(d_post, 0))
    tl.store(prow + 2 * N + ij, tl.sum(d_res, 0))
    tl.store(prow + M, tl.sum(za_pre, 0))
    tl.store(prow + M + 1, tl.sum(za_post, 0))
    tl.store(prow + M + 2, tl.sum(za_res, 0))


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
