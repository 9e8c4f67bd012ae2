"""The mHC pre backward ``grad`` kernel (SPEC section 2): dx, plus the dphi partials per token split.

dx[t, i, d] = (G @ W)[t, i*D + d] - coef[t, 0] (coef[t, 1] x[t, i, d]) + h_pre[t, i] dh_in[t, d] (+ dx_acc[t, i, d])
(coef[t, 1] = inv_rms; the RMS term's factors are kept apart, their product underflows at large RMS)
partial[s, m, i*D + d] = sum over split s's tokens t of G[t, m] x[t, i, d]

G = dh_mix [T, M] comes from the token kernel already as the GEMM operand ``gq``: for 16-bit x the
bf16 pieces side by side, [T, 2*MP] = [G_hi | G_lo] (zero padded), for fp32 x fp32 [T, MP].
A program owns a chunk of BK columns (BK // n features of every stream) and a token split. Its
slices of W = phi * gamma are loaded once and stay resident (stacked [W_hi; W_hi] and W_lo for
16-bit x); token blocks of x, dh_in, gq and the per-token terms stream through the pipeline.
Per token block, for 16-bit x, bf16 products on tensor cores, all of the same shape:
dx = [G_hi | G_lo] @ [W_hi; W_hi] + [G_hi | G_lo] @ [W_lo; 0] (the three leading terms, error
~2^-17; the elementwise terms are the initial accumulator) and
acc [2*MP, BK] += [G_hi | G_lo]^T @ x (fp16 x: x = x_hi + x_lo exactly, one more product), kept
in registers over the whole split; the two halves are added once at the end and written per
split. fp32 x uses TF32x3 products of the fp32 operands instead. dx is written once, in fp32
sums rounded once to x's dtype (dx_acc read and added in the same epilogue).
"""
from __future__ import annotations

import triton
import triton.language as tl

from ._autotune import autotune
from ._mhc_common import config_table, dot16, launch_class, split_bf16

_C = triton.Config
_GRAD_16BIT = [
    _C({"BT": 64, "BK": 128}, num_warps=4, num_stages=3), _C({"BT": 64, "BK": 64}, num_warps=4, num_stages=4),
    _C({"BT": 64, "BK": 128}, num_warps=8, num_stages=3), _C({"BT": 128, "BK": 128}, num_warps=8, num_stages=2)]
_GRAD_FP32 = [_C({"BT": 64, "BK": 64}, num_warps=4, num_stages=3), _C({"BT": 64, "BK": 128}, num_warps=8, num_stages=3),
              _C({"BT": 32, "BK": 128}, num_warps=4, num_stages=3)]
_GRAD_N8 = [_C({"BT": 64, "BK": 64}, num_warps=8, num_stages=2), _C({"BT": 32, "BK": 64}, num_warps=4, num_stages=2)]


def grad_configs(x_kind: int, n: int) -> list:
    """Autotuned configs of the grad kernel per x dtype (X_KIND) and n: token blocks of 64 so that
    both products run as sm_90 warpgroup MMAs where the row count allows."""
    if n > 4:
        return _GRAD_N8
    return _GRAD_FP32 if x_kind == 2 else _GRAD_16BIT


GRAD_CONFIGS = config_table(grad_configs)
GRAD_INTERPRET_CONFIG = triton.Config({"BT": 16, "BK": 64}, num_warps=4, num_stages=1)
GRAD_SPLIT_ALIGN = 128  # tokens per split are a multiple of this (every BT divides it)
GRAD_REF_COLUMNS = 128  # columns per program assumed when choosing the number of token splits


@autotune(GRAD_CONFIGS, GRAD_INTERPRET_CONFIG, key=["N", "D", "X_KIND", "HAS_ACC", "T_CLASS"], class_of=launch_class)
@triton.jit
def mhc_pre_bwd_grad_kernel(x_ptr, g_ptr, w_ptr, wlo_ptr, gq_ptr, coef_ptr, hpre_ptr, acc_ptr, dx_ptr, part_ptr,
                            T, D, TPS, sxt, sxi, sxd, sgt, sgd, sat, sai, sad,
                            X_KIND: tl.constexpr, HAS_ACC: tl.constexpr, N: tl.constexpr, M: tl.constexpr,
                            MP: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, T_CLASS):
    """Grid (column chunks of BK // N per stream, token splits of TPS tokens).

    x [T, N, D] and dh_in (g) [T, D] strided, x's dtype; W [M, N*D] as bf16 (hi, lo) planes, or fp32
    (both pointers the same) for fp32 x; gq as in the module docstring; coef [T, 2], h_pre [T, N] fp32;
    dx_acc (acc) [T, N, D] strided in x's dtype when HAS_ACC. Writes dx [T, N, D] (x's dtype,
    contiguous) and partial G^T @ x [S, M, N*D] fp32.
    """
    GR: tl.constexpr = MP if X_KIND == 2 else 2 * MP  # rows of the G operand (both bf16 pieces)
    BD: tl.constexpr = BK // N
    ND = N * D
    k = tl.arange(0, BK)
    ki = k // BD
    d = tl.program_id(0) * BD + k % BD
    dmask = d < D
    col = ki * D + d
    r = tl.arange(0, GR)
    m = tl.arange(0, MP)
    # [W_hi; W_hi] and [W_lo; 0] (or W for fp32 x): this chunk's columns, resident for the whole split
    wr = r % MP
    w_off = wr[:, None] * ND + col[None, :]
    w_a = tl.load(w_ptr + w_off, mask=(wr < M)[:, None] & dmask[None, :], other=0.0)
    if X_KIND != 2:
        w_l = tl.load(wlo_ptr + w_off, mask=(r < M)[:, None] & dmask[None, :], other=0.0)

    acc = tl.zeros([GR, BK], tl.float32)
    s = tl.program_id(1)
    t_lo = s * TPS
    t_hi = tl.minimum(T, t_lo + TPS)
    x_cols = x_ptr + ki.to(tl.int64)[None, :] * sxi + d[None, :] * sxd
    for t0 in range(t_lo, t_hi, BT):
        t = t0 + tl.arange(0, BT)
        tmask = t < t_hi
        t64 = t.to(tl.int64)
        mask = tmask[:, None] & dmask[None, :]
        # the elementwise terms first (their loads overlap the products), then the accumulator of dx
        gk = tl.load(g_ptr + t64[:, None] * sgt + d[None, :] * sgd, mask=mask, other=0.0)
        if HAS_ACC:
            da = tl.load(acc_ptr + t64[:, None] * sat + ki.to(tl.int64)[None, :] * sai + d[None, :] * sad, mask=mask,
                         other=0.0)
        coef = tl.load(coef_ptr + 2 * t64, mask=tmask, other=0.0)
        inv = tl.load(coef_ptr + 2 * t64 + 1, mask=tmask, other=0.0)
        hp = tl.zeros([BT, BK], tl.float32)
        for i in tl.static_range(N):
            hp = tl.where(ki[None, :] == i, tl.load(hpre_ptr + t64 * N + i, mask=tmask, other=0.0)[:, None], hp)
        gq = tl.load(gq_ptr + t64[:, None] * GR + r[None, :], mask=tmask[:, None], other=0.0)
        xk = tl.load(x_cols + t64[:, None] * sxt, mask=mask, other=0.0)
        dx = hp * gk.to(tl.float32) - (coef[:, None] * xk.to(tl.float32)) * inv[:, None]
        if HAS_ACC:
            dx += da.to(tl.float32)
        if X_KIND == 2:
            acc = tl.dot(tl.trans(gq), xk, acc, input_precision="tf32x3")
            dx = tl.dot(gq, w_a, dx, input_precision="tf32x3")
        else:
            if X_KIND == 0:
                acc = dot16(tl.trans(gq), xk, acc)
            else:
                x_hi, x_lo = split_bf16(xk.to(tl.float32))
                acc = dot16(tl.trans(gq), x_hi, acc)
                acc = dot16(tl.trans(gq), x_lo, acc)
            dx = dot16(gq, w_a, dx)
            dx = dot16(gq, w_l, dx)
        tl.store(dx_ptr + t64[:, None] * ND + col[None, :], dx.to(dx_ptr.dtype.element_ty), mask=mask)
    if X_KIND != 2:
        acc = tl.sum(tl.reshape(acc, (2, MP, BK)), 0)  # the G_hi and G_lo products
    tl.store(part_ptr + s.to(tl.int64) * (M * ND) + m[:, None] * ND + col[None, :], acc,
             mask=(m < M)[:, None] & dmask[None, :])
