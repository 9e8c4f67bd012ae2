"""The mHC pre forward after the GEMM (SPEC section 2): per-token mixings, then h_in.

``mix``: per block of tokens, h_mix = sum over K splits (fixed order) of (hi + lo) partial
products from the GEMM, inv_rms = 1 / sqrt(sum x^2 / (n*D) + norm_eps), z = h_mix * inv_rms,
h_pre = sigmoid(a0 z_pre + b_pre) + pre_eps, h_post = post_mult * sigmoid(a1 z_post + b_post),
h_res = Sinkhorn(a2 z_res + b_res) in registers. Each piece is loaded straight into the layout
its mixing needs ([BT, n] or [BT, n, n]), so z is stored without a round trip.

``apply``: h_in[t, d] = sum_i h_pre[t, i] x[t, i, d], one [BT, BH] tile per program, streaming;
token blocks run last to first (the GEMM just read the last ones; mhc_post, first to last, then
finds the first ones in L2).
"""
from __future__ import annotations

import triton
import triton.language as tl

from ._autotune import autotune
from ._mhc_common import sinkhorn

MIX_BT = 32
MIX_WARPS = 4

_C = triton.Config
APPLY_CONFIGS = [_C({"BT": 2, "BH": 1024}, num_warps=4, num_stages=1),
                 _C({"BT": 4, "BH": 1024}, num_warps=8, num_stages=1),
                 _C({"BT": 2, "BH": 2048}, num_warps=8, num_stages=1),
                 _C({"BT": 4, "BH": 512}, num_warps=4, num_stages=1),
                 _C({"BT": 8, "BH": 512}, num_warps=8, num_stages=1)]
APPLY_INTERPRET_CONFIG = triton.Config({"BT": 2, "BH": 128}, num_warps=4, num_stages=1)


@triton.jit
def _split_sum(ptrs, mask, M: tl.constexpr, SPLIT: tl.constexpr):
    """Part entries at ``ptrs``, plus their lo-product twins M columns on if SPLIT."""
    v = tl.load(ptrs, mask=mask, other=0.0)
    if SPLIT:
        v = v + tl.load(ptrs + M, mask=mask, other=0.0)
    return v


@triton.jit
def mhc_pre_fwd_mix_kernel(part_ptr, sq_ptr, alpha_ptr, bias_ptr, z_ptr, inv_ptr, h_pre_ptr, h_post_ptr, h_res_ptr,
                           T, S, ND, ITERS, post_mult, norm_eps, pre_eps, sk_eps,
                           SPLIT: tl.constexpr, N: tl.constexpr, M: tl.constexpr, WS: tl.constexpr,
                           BT: tl.constexpr):
    """Part [T, S, WS] fp32, Sq [T, S] fp64 -> z [T, M], inv_rms [T], h_pre [T, N], h_post [T, N], h_res [T, N, N] fp32."""
    t = tl.program_id(0) * BT + tl.arange(0, BT)
    tmask = t < T
    t64 = t.to(tl.int64)
    j = tl.arange(0, N)
    ij = j[:, None] * N + j[None, :]
    m2 = tmask[:, None]
    m3 = tmask[:, None, None]

    h_pre = tl.zeros([BT, N], tl.float32)
    h_post = tl.zeros([BT, N], tl.float32)
    h_res = tl.zeros([BT, N, N], tl.float32)
    sq = tl.zeros([BT], tl.float64)
    p = part_ptr + t64 * S * WS
    q = sq_ptr + t64 * S
    for _ in range(S):
        h_pre += _split_sum(p[:, None] + j[None, :], m2, M, SPLIT)
        h_post += _split_sum(p[:, None] + N + j[None, :], m2, M, SPLIT)
        h_res += _split_sum(p[:, None, None] + 2 * N + ij[None, :, :], m3, M, SPLIT)
        sq += tl.load(q, mask=tmask, other=0.0)
        p += WS
        q += 1
    inv = (1.0 / tl.sqrt(sq / ND + norm_eps)).to(tl.float32)  # in fp64: no overflow wherever inv is an fp32 number
    z_pre = h_pre * inv[:, None]
    z_post = h_post * inv[:, None]
    z_res = h_res * inv[:, None, None]
    tl.store(inv_ptr + t64, inv, mask=tmask)
    zrow = z_ptr + t64 * M
    tl.store(zrow[:, None] + j[None, :], z_pre, mask=m2)
    tl.store(zrow[:, None] + N + j[None, :], z_post, mask=m2)
    tl.store(zrow[:, None, None] + 2 * N + ij[None, :, :], z_res, mask=m3)

    a0 = tl.load(alpha_ptr)
    a1 = tl.load(alpha_ptr + 1)
    a2 = tl.load(alpha_ptr + 2)
    tn = t64[:, None] * N + j[None, :]
    tl.store(h_pre_ptr + tn, tl.sigmoid(a0 * z_pre + tl.load(bias_ptr + j)[None, :]) + pre_eps, mask=m2)
    tl.store(h_post_ptr + tn, post_mult * tl.sigmoid(a1 * z_post + tl.load(bias_ptr + N + j)[None, :]), mask=m2)
    h_res = sinkhorn(a2 * z_res + tl.load(bias_ptr + 2 * N + ij)[None, :, :], ITERS, sk_eps)
    tl.store(h_res_ptr + t64[:, None, None] * (N * N) + ij[None, :, :], h_res, mask=m3)


@autotune(APPLY_CONFIGS, APPLY_INTERPRET_CONFIG, key=["N", "D", "T_CLASS"])
@triton.jit
def mhc_pre_fwd_apply_kernel(x_ptr, h_pre_ptr, h_in_ptr, T, D, sxt, sxi, sxd,
                             N: tl.constexpr, BT: tl.constexpr, BH: tl.constexpr, T_CLASS):
    """x [T, N, D] strided, h_pre [T, N] fp32 -> h_in [T, D] contiguous in x's dtype (fp32 sum, one rounding).

    1-D grid over (token block, feature block), feature blocks of one token block adjacent.
    """
    n_db = tl.cdiv(D, BH)
    pid = tl.program_id(0)
    tb = tl.cdiv(T, BT) - 1 - pid // n_db
    t = tb * BT + tl.arange(0, BT)
    d = (pid % n_db) * BH + tl.arange(0, BH)
    tmask = t < T
    t64 = t.to(tl.int64)
    mask = tmask[:, None] & (d < D)[None, :]
    x_rows = x_ptr + t64[:, None] * sxt + d[None, :] * sxd
    h_in = tl.zeros([BT, BH], tl.float32)
    for i in tl.static_range(N):
        h_pre_i = tl.load(h_pre_ptr + t64 * N + i, mask=tmask, other=0.0)
        xi = tl.load(x_rows + i * sxi, mask=mask, other=0.0)
        h_in += h_pre_i[:, None] * xi.to(tl.float32)
    tl.store(h_in_ptr + t64[:, None] * D + d[None, :], h_in.to(h_in_ptr.dtype.element_ty), mask=mask)
