"""The mHC pre forward kernels (SPEC section 2).

``weights``: W = phi * gamma [M, n*D] once per call, as bf16 (hi, lo) planes for 16-bit x or fp32
for fp32 x (see the GEMM products in _mhc_common); both pre kernels read it.

``fwd``: one program per block of BT tokens. Pass 1 streams x once in chunks of BD = BK // n
columns of every stream and accumulates h_mix [BT, MP] = x @ W^T on tensor cores together with
sum(x^2). The epilogue writes z and inv_rms, reads z back in the [n] / [n, n] layouts the mixings
need (a block barrier makes the writes visible) and runs the Sinkhorn iteration in registers.
Pass 2 re-reads x in reverse chunk order, so that its first reads are the lines pass 1 touched
last (still in L2), and writes h_in = sum_i h_pre[i] x[i]; its tiles are [BT, BH] per stream
(h_pre recomputed from z per chunk), so no tile changes layout inside the loop.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ._mhc_common import autotune, dot_xw, sinkhorn

# BT tokens per program; BK columns of x per pass-1 chunk over all streams (BK // n of each
# stream); BH columns per pass-2 chunk. Tiles whose sm_90 build needs no register spills
# (fp32 x at n = 8 excepted) and fits shared memory, per x dtype (X_KIND) and n.
_C = triton.Config
_CONFIGS = {
    0: [_C({"BT": 64, "BK": 64, "BH": 64}, num_warps=4, num_stages=4),
        _C({"BT": 64, "BK": 128, "BH": 64}, num_warps=8, num_stages=3),
        _C({"BT": 32, "BK": 128, "BH": 128}, num_warps=4, num_stages=4),
        _C({"BT": 32, "BK": 256, "BH": 128}, num_warps=8, num_stages=3),
        _C({"BT": 16, "BK": 256, "BH": 128}, num_warps=4, num_stages=4),
        # one program per SM: the smallest set of x rows in flight, for pass 2 to find in L2
        _C({"BT": 16, "BK": 256, "BH": 128}, num_warps=8, num_stages=4),
        _C({"BT": 32, "BK": 256, "BH": 128}, num_warps=8, num_stages=4)],
    1: [_C({"BT": 64, "BK": 64, "BH": 64}, num_warps=8, num_stages=3),
        _C({"BT": 32, "BK": 64, "BH": 128}, num_warps=4, num_stages=3),
        _C({"BT": 16, "BK": 128, "BH": 128}, num_warps=4, num_stages=3),
        _C({"BT": 64, "BK": 64, "BH": 64}, num_warps=4, num_stages=4)],
    2: [_C({"BT": 64, "BK": 32, "BH": 64}, num_warps=4, num_stages=4),
        _C({"BT": 16, "BK": 64, "BH": 128}, num_warps=4, num_stages=4),
        _C({"BT": 64, "BK": 64, "BH": 64}, num_warps=8, num_stages=3)],
}
_CONFIGS_N8 = [_C({"BT": 16, "BK": 64, "BH": 128}, num_warps=4, num_stages=3),
               _C({"BT": 32, "BK": 64, "BH": 128}, num_warps=4, num_stages=3)]


def configs(x_kind: int, n: int) -> list:
    """The autotuned configs of :func:`mhc_pre_fwd_kernel` for x of ``x_kind`` and ``n`` streams."""
    return _CONFIGS[x_kind] if n <= 4 else _CONFIGS_N8


INTERPRET_CONFIG = triton.Config({"BT": 16, "BK": 64, "BH": 32}, num_warps=4, num_stages=1)
WEIGHTS_BLOCK = 1024


@triton.jit
def mhc_pre_weights_kernel(phi_ptr, gamma_ptr, w_ptr, wlo_ptr, total, ND,
                           HAS_GAMMA: tl.constexpr, SPLIT: tl.constexpr, BLOCK: tl.constexpr):
    """W = phi * gamma over [M, ND] (flat, ``total`` elements): bf16 hi/lo planes if SPLIT, else fp32."""
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = i < total
    w = tl.load(phi_ptr + i, mask=mask, other=0.0)
    if HAS_GAMMA:
        w = w * tl.load(gamma_ptr + i % ND, mask=mask, other=0.0)
    if SPLIT:
        hi = w.to(tl.bfloat16)
        tl.store(w_ptr + i, hi, mask=mask)
        tl.store(wlo_ptr + i, (w - hi.to(tl.float32)).to(tl.bfloat16), mask=mask)
    else:
        tl.store(w_ptr + i, w, mask=mask)


@autotune(configs, INTERPRET_CONFIG, key=["N", "D", "X_KIND"])
@triton.jit
def mhc_pre_fwd_kernel(x_ptr, w_ptr, wlo_ptr, alpha_ptr, bias_ptr,
                       h_in_ptr, h_post_ptr, h_res_ptr, z_ptr, inv_ptr,
                       T, D, sxt, sxi, sxd, ITERS, post_mult, norm_eps, pre_eps, sk_eps,
                       X_KIND: tl.constexpr, N: tl.constexpr, M: tl.constexpr, MP: tl.constexpr,
                       BT: tl.constexpr, BK: tl.constexpr, BH: tl.constexpr):
    """x [T, N, D] strided; W [M, N*D] (hi and lo planes, or fp32 in w_ptr), alpha [3], bias [M].

    Writes h_in [T, D] (x's dtype), h_post [T, N], h_res [T, N, N], z [T, M], inv_rms [T], fp32.
    """
    BD: tl.constexpr = BK // N
    ND = N * D
    t = tl.program_id(0) * BT + tl.arange(0, BT)
    tmask = t < T
    t64 = t.to(tl.int64)
    k = tl.arange(0, BK)  # chunk column k holds stream k // BD, offset k % BD
    ki = k // BD
    kd = k % BD
    m = tl.arange(0, MP)
    mmask = m < M

    acc = tl.zeros([BT, MP], tl.float32)
    sq = tl.zeros([BT, BK], tl.float32)
    x_rows = x_ptr + t64[:, None] * sxt + ki.to(tl.int64)[None, :] * sxi
    for d0 in range(0, D, BD):
        d = d0 + kd
        dmask = d < D
        xt = tl.load(x_rows + d[None, :] * sxd, mask=tmask[:, None] & dmask[None, :], other=0.0)
        w_off = m[None, :] * ND + (ki * D + d)[:, None]
        w_mask = dmask[:, None] & mmask[None, :]
        w_hi = tl.load(w_ptr + w_off, mask=w_mask, other=0.0)
        if X_KIND == 2:
            w_lo = w_hi
        else:
            w_lo = tl.load(wlo_ptr + w_off, mask=w_mask, other=0.0)
        acc = dot_xw(xt, w_hi, w_lo, acc, X_KIND)
        xf = xt.to(tl.float32)
        sq += xf * xf
    inv = 1.0 / tl.sqrt(tl.sum(sq, 1) / ND + norm_eps)
    tl.store(inv_ptr + t64, inv, mask=tmask)
    tl.store(z_ptr + t64[:, None] * M + m[None, :], acc * inv[:, None], mask=tmask[:, None] & mmask[None, :])
    tl.debug_barrier()

    j = tl.arange(0, N)
    zrow = z_ptr + t64 * M
    zpost = tl.load(zrow[:, None] + N + j[None, :], mask=tmask[:, None], other=0.0)
    ij = j[:, None] * N + j[None, :]
    zres = tl.load(zrow[:, None, None] + 2 * N + ij[None, :, :], mask=tmask[:, None, None], other=0.0)
    a0 = tl.load(alpha_ptr)
    a1 = tl.load(alpha_ptr + 1)
    a2 = tl.load(alpha_ptr + 2)
    h_post = post_mult * tl.sigmoid(a1 * zpost + tl.load(bias_ptr + N + j)[None, :])
    tl.store(h_post_ptr + t64[:, None] * N + j[None, :], h_post, mask=tmask[:, None])
    h_res = sinkhorn(a2 * zres + tl.load(bias_ptr + 2 * N + ij)[None, :, :], ITERS, sk_eps)
    tl.store(h_res_ptr + t64[:, None, None] * (N * N) + ij[None, :, :], h_res, mask=tmask[:, None, None])

    dd = tl.arange(0, BH)
    n_chunks = tl.cdiv(D, BH)
    for c in range(n_chunks):
        d = (n_chunks - 1 - c) * BH + dd
        mask = tmask[:, None] & (d < D)[None, :]
        h_in = tl.zeros([BT, BH], tl.float32)
        for i in tl.static_range(N):
            zi = tl.load(zrow + i, mask=tmask, other=0.0)
            h_pre_i = tl.sigmoid(a0 * zi + tl.load(bias_ptr + i)) + pre_eps
            xi = tl.load(x_ptr + t64[:, None] * sxt + i * sxi + d[None, :] * sxd, mask=mask, other=0.0)
            h_in += h_pre_i[:, None] * xi.to(tl.float32)
        tl.store(h_in_ptr + t64[:, None] * D + d[None, :], h_in.to(h_in_ptr.dtype.element_ty), mask=mask)
