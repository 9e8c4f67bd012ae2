"""The mHC pre forward kernels (SPEC section 2): weights, split-K GEMM; mix and apply in _mhc_pre_fwd_apply.

Forward = 4 launches: ``fwd_weights`` (W = phi * gamma transposed to [n*D, WS]) -> ``gemm``
(x read once: h_mix partials and sum x^2 per K split) -> mix (fixed-order sum of the splits, z,
inv_rms, h_pre, h_post, Sinkhorn h_res) -> apply (x read again, streaming: h_in).

GEMM operand layout: Wt [n*D, WS] row k = stream k // D, feature k % D. For 16-bit x, WS = 2M:
columns 0..M-1 hold the bf16 hi piece of W[m, k] and M..2M-1 its bf16 lo piece, so ONE tensor
core product x @ Wt gives the hi and lo products of every row side by side (the ~17-bit scheme of
``_mhc_common`` (X_KIND), with hi and lo in separate fp32 accumulators, summed by the mix kernel;
fp16 x enters as its two exact bf16 pieces, two products).
For fp32 x, WS = M, fp32, TF32x3. Part [T, S, WS] (fp32) and Sq [T, S] (fp64: the squares of x
beyond 1.8e19 do not fit fp32) hold the per-split results.

``mhc_pre_weights_kernel`` (W in [M, n*D] as hi/lo planes) serves the backward.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ._autotune import autotune
from ._mhc_common import config_table, dot16, launch_class, split_bf16

WEIGHTS_BLOCK = 1024
FWD_WEIGHTS_BK = 64  # rows k of Wt per program of mhc_pre_fwd_weights_kernel

# BT tokens per program, BK features of one stream per chunk. Per x dtype (X_KIND) and n.
_C = triton.Config
# bf16 x feeds the tensor cores straight from the async-copy pipeline, and only this one config gives the right
# h_mix at T >= 1024 on Hopper (tests/test_triton_mhc_configs_gpu.py runs each shipped config alone on CUDA).
_GEMM_CONFIGS = {
    0: [_C({"BT": 256, "BK": 64}, num_warps=8, num_stages=3)],
    1: [_C({"BT": 128, "BK": 64}, num_warps=8, num_stages=3),
        _C({"BT": 64, "BK": 64}, num_warps=4, num_stages=4),
        _C({"BT": 128, "BK": 64}, num_warps=8, num_stages=4)],
    2: [_C({"BT": 64, "BK": 32}, num_warps=4, num_stages=4),
        _C({"BT": 128, "BK": 32}, num_warps=8, num_stages=4),
        _C({"BT": 64, "BK": 64}, num_warps=8, num_stages=3)],
}
_GEMM_CONFIGS_N8 = {  # Part is 2M = 160 columns wide (fp32 x: 80): smaller tiles against register spills
    0: [_C({"BT": 64, "BK": 64}, num_warps=8, num_stages=3), _C({"BT": 64, "BK": 32}, num_warps=8, num_stages=4)],
    1: [_C({"BT": 32, "BK": 32}, num_warps=4, num_stages=4), _C({"BT": 64, "BK": 16}, num_warps=8, num_stages=4)],
    2: [_C({"BT": 64, "BK": 64}, num_warps=8, num_stages=3), _C({"BT": 64, "BK": 32}, num_warps=8, num_stages=4)],
}
GEMM_INTERPRET_CONFIG = triton.Config({"BT": 16, "BK": 32}, num_warps=4, num_stages=1)
GEMM_REF_BT = 128  # the token block the launcher sizes the K splits for


def gemm_configs(x_kind: int, n: int) -> list:
    """The autotuned configs of :func:`mhc_pre_fwd_gemm_kernel` for x of ``x_kind`` and ``n`` streams."""
    return (_GEMM_CONFIGS if n <= 4 else _GEMM_CONFIGS_N8)[x_kind]


GEMM_CONFIGS = config_table(gemm_configs)


def gemm_width(m: int, x_kind: int) -> int:
    """WS: the columns of Wt and Part for M = ``m`` mixing rows (hi and lo side by side unless fp32 x)."""
    return m if x_kind == 2 else 2 * m


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


@triton.jit
def mhc_pre_fwd_weights_kernel(phi_ptr, gamma_ptr, w_ptr, ND,
                               HAS_GAMMA: tl.constexpr, SPLIT: tl.constexpr, M: tl.constexpr,
                               WS: tl.constexpr, WN: tl.constexpr, BK: tl.constexpr):
    """phi [M, ND], gamma [ND] fp32 -> Wt [ND, WS]: (hi | lo) bf16 of phi * gamma if SPLIT, else fp32."""
    k = tl.program_id(0) * BK + tl.arange(0, BK)
    c = tl.arange(0, WN)
    m = c % M
    mask = (k < ND)[:, None] & (c < WS)[None, :]
    w = tl.load(phi_ptr + m[None, :] * ND + k[:, None], mask=mask, other=0.0)
    if HAS_GAMMA:
        w = w * tl.load(gamma_ptr + k, mask=k < ND, other=0.0)[:, None]
    if SPLIT:
        hi = w.to(tl.bfloat16)
        lo = (w - hi.to(tl.float32)).to(tl.bfloat16)
        w = tl.where((c < M)[None, :], hi, lo)
    tl.store(w_ptr + k[:, None] * WS + c[None, :], w, mask=mask)


@triton.jit
def _dot_cat(x, w, acc, X_KIND: tl.constexpr):
    """acc + x @ w; x [BT, BK] in the activations' dtype, w a [BK, WN] tile of Wt (see module doc)."""
    if X_KIND == 2:
        acc = tl.dot(x, w, acc, input_precision="tf32x3")
    elif X_KIND == 0:
        acc = dot16(x, w, acc)
    else:  # fp16 x = hi + lo exactly in bf16
        x_hi, x_lo = split_bf16(x.to(tl.float32))
        acc = dot16(x_hi, w, acc)
        acc = dot16(x_lo, w, acc)
    return acc


@autotune(GEMM_CONFIGS, GEMM_INTERPRET_CONFIG, key=["N", "D", "X_KIND", "T_CLASS"], class_of=launch_class)
@triton.jit
def mhc_pre_fwd_gemm_kernel(x_ptr, w_ptr, part_ptr, sq_ptr, T, D, sxt, sxi, sxd,
                            X_KIND: tl.constexpr, N: tl.constexpr, WS: tl.constexpr, WN: tl.constexpr,
                            BT: tl.constexpr, BK: tl.constexpr, T_CLASS):
    """x [T, N, D] strided, Wt [N*D, WS] -> Part [T, S, WS] = x @ Wt (fp32) and Sq [T, S] = sum x^2 (fp64).

    Grid (token blocks, S): split s owns features [s*DS, (s+1)*DS) of every stream, DS a multiple
    of BK; its chunks run feature-major (the N streams of one feature range back to back).
    """
    s = tl.program_id(1)
    t = tl.program_id(0) * BT + tl.arange(0, BT)
    tmask = t < T
    t64 = t.to(tl.int64)
    ds = tl.cdiv(tl.cdiv(D, tl.num_programs(1)), BK) * BK
    d_lo = s * ds
    d_hi = tl.minimum(D, d_lo + ds)
    n_chunks = N * tl.cdiv(tl.maximum(d_hi - d_lo, 0), BK)
    kk = tl.arange(0, BK)
    c = tl.arange(0, WN)
    cmask = c < WS

    acc = tl.zeros([BT, WN], tl.float32)
    sq = tl.zeros([BT], tl.float64)  # x^2 of fp32 or bf16 x overflows fp32 from |x| ~ 1.8e19 up
    x_rows = x_ptr + t64[:, None] * sxt
    for j in range(n_chunks):
        i = j % N
        d = d_lo + (j // N) * BK + kk
        dmask = d < d_hi
        xt = tl.load(x_rows + i * sxi + d[None, :] * sxd, mask=tmask[:, None] & dmask[None, :], other=0.0)
        w = tl.load(w_ptr + (i * D + d)[:, None] * WS + c[None, :], mask=dmask[:, None] & cmask[None, :], other=0.0)
        acc = _dot_cat(xt, w, acc, X_KIND)
        xd = xt.to(tl.float64)
        sq += tl.sum(xd * xd, 1)
    row = t64 * tl.num_programs(1) + s
    tl.store(part_ptr + row[:, None] * WS + c[None, :], acc, mask=tmask[:, None] & cmask[None, :])
    tl.store(sq_ptr + row, sq, mask=tmask)
