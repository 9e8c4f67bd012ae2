"""mHC pre on Triton (SPEC section 2): launchers; the kernels live in _mhc_pre_fwd / _mhc_pre_bwd.

Same functions, signatures, outputs and residuals as ``kernel_dispatch/golden/mhc_pre.py``:
x [T, n, D] fp16/bf16/fp32 with any strides; phi [M, n*D], alpha [3], bias [M], gamma [n*D] or
None (converted to contiguous fp32 here); residuals z [T, M] and inv_rms [T] fp32. The h_mix GEMM
and the two backward GEMMs run on tensor cores keeping about 17 bits of every fp32 operand (bf16
hi/lo splits; TF32x3 for fp32 x), so no TF32 tolerance is claimed. Parameter gradients are
reduced in a fixed order (per-block and per-split partials, summed by a kernel or torch.sum), so
they are bitwise reproducible.
"""
from __future__ import annotations

import torch
import triton

from ...golden.mhc_pre import check_dx_acc
from ._autotune import launch, size_class
from ._interpret import INTERPRET
from ._mhc_common import X_KINDS, check_streams, f32, narrow_strides, pow2_at_least
from ._mhc_common import empty as _empty
from ._mhc_pre_bwd import BT_TOKEN, PARAM_BC, PARAM_WARPS, mhc_pre_bwd_param_kernel, mhc_pre_bwd_token_kernel
from ._mhc_pre_bwd_grad import GRAD_REF_COLUMNS, GRAD_SPLIT_ALIGN, mhc_pre_bwd_grad_kernel
from ._mhc_pre_fwd import (FWD_WEIGHTS_BK, GEMM_REF_BT, WEIGHTS_BLOCK, gemm_width, mhc_pre_fwd_gemm_kernel,
                           mhc_pre_fwd_weights_kernel, mhc_pre_weights_kernel)
from ._mhc_pre_fwd_apply import MIX_BT, MIX_WARPS, mhc_pre_fwd_apply_kernel, mhc_pre_fwd_mix_kernel


def _check(name: str, t: torch.Tensor, shape: tuple) -> None:
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name}: expected shape {list(shape)}, got {list(t.shape)}")


def _prepare(x, phi, alpha, bias, gamma):
    """Checked sizes (T, n, D, M) and the parameters as contiguous fp32."""
    T, n, D = check_streams("x", x)
    M = n * n + 2 * n
    _check("phi", phi, (M, n * D))
    _check("alpha", alpha, (3,))
    _check("bias", bias, (M,))
    if gamma is not None:
        _check("gamma", gamma, (n * D,))
    return T, n, D, M, f32(phi), f32(alpha), f32(bias), None if gamma is None else f32(gamma)


def _weights(phi: torch.Tensor, gamma: torch.Tensor | None, x_kind: int) -> tuple[torch.Tensor, torch.Tensor]:
    """W = phi * gamma [M, n*D] as the GEMM operand of ``x_kind``: bf16 (hi, lo), or fp32 (W, W)."""
    split = x_kind != 2
    w = _empty(*phi.shape, dtype=torch.bfloat16 if split else torch.float32, device=phi.device)
    w_lo = _empty(*w.shape, dtype=w.dtype, device=w.device) if split else w
    mhc_pre_weights_kernel[(triton.cdiv(phi.numel(), WEIGHTS_BLOCK),)](
        phi, phi if gamma is None else gamma, w, w_lo, phi.numel(), phi.shape[1], HAS_GAMMA=gamma is not None,
        SPLIT=split, BLOCK=WEIGHTS_BLOCK)
    return w, w_lo


def _grad_splits(T: int, n: int, D: int, device: torch.device) -> tuple[int, int]:
    """(S, tokens per split) of the grad kernel: the S in 1..8 whose last wave of programs (chunks of
    GRAD_REF_COLUMNS columns, about 2 resident per SM) is fullest, fewest splits on a tie."""
    sms = 4 if INTERPRET else torch.cuda.get_device_properties(device).multi_processor_count
    align = mhc_pre_bwd_grad_kernel.configs[0].kwargs["BT"] if INTERPRET else GRAD_SPLIT_ALIGN
    chunks, slots = triton.cdiv(n * D, GRAD_REF_COLUMNS), 2 * sms
    best = max(range(1, 9), key=lambda s: (chunks * s / (triton.cdiv(chunks * s, slots) * slots), -s))
    s = max(1, min(best, triton.cdiv(T, align)))
    tps = triton.cdiv(triton.cdiv(T, s), align) * align
    return triton.cdiv(T, tps), tps


def _fwd_splits(T: int, D: int, device) -> int:
    """S, the K splits of the forward GEMM: about 2 programs per SM at GEMM_REF_BT tokens a block, at most 8,
    each split at least 128 features of every stream."""
    sms = 4 if INTERPRET else torch.cuda.get_device_properties(device).multi_processor_count
    return max(1, min(round(2 * sms / triton.cdiv(T, GEMM_REF_BT)), D // 128, 8))


def forward(x, phi, alpha, bias, gamma, sinkhorn_iters: int, post_mult: float, norm_eps: float,
            pre_eps: float, sinkhorn_eps: float):
    """(h_in [T, D] x.dtype, h_post [T, n], h_res [T, n, n], z [T, M], inv_rms [T]) for x [T, n, D]; fp32.

    Four launches (see _mhc_pre_fwd): Wt = phi * gamma transposed, the split-K GEMM (x read once),
    the per-token mix (fixed-order sum of the splits), the streaming apply (x read again).
    """
    T, n, D, M, phi, alpha, bias, gamma = _prepare(x, phi, alpha, bias, gamma)
    x = narrow_strides(x)
    dev, f = x.device, torch.float32
    kind = X_KINDS[x.dtype]
    ws = gemm_width(M, kind)
    wn = pow2_at_least(ws, 16)
    wt = _empty(n * D, ws, dtype=torch.float32 if kind == 2 else torch.bfloat16, device=dev)
    mhc_pre_fwd_weights_kernel[(triton.cdiv(n * D, FWD_WEIGHTS_BK),)](
        phi, phi if gamma is None else gamma, wt, n * D, HAS_GAMMA=gamma is not None, SPLIT=kind != 2, M=M, WS=ws,
        WN=wn, BK=FWD_WEIGHTS_BK)

    splits = _fwd_splits(T, D, dev)
    part = _empty(T, splits, ws, dtype=f, device=dev)
    sq = _empty(T, splits, dtype=torch.float64, device=dev)
    launch(mhc_pre_fwd_gemm_kernel, lambda meta: (triton.cdiv(T, meta["BT"]), splits),
           x, wt, part, sq, T, D, *x.stride(), X_KIND=kind, N=n, WS=ws, WN=wn, T_CLASS=size_class(T))

    h_pre = _empty(T, n, dtype=f, device=dev)
    h_post = _empty(T, n, dtype=f, device=dev)
    h_res = _empty(T, n, n, dtype=f, device=dev)
    z = _empty(T, M, dtype=f, device=dev)
    inv_rms = _empty(T, dtype=f, device=dev)
    mhc_pre_fwd_mix_kernel[(triton.cdiv(T, MIX_BT),)](
        part, sq, alpha, bias, z, inv_rms, h_pre, h_post, h_res, T, splits, n * D, int(sinkhorn_iters),
        float(post_mult), float(norm_eps), float(pre_eps), float(sinkhorn_eps), SPLIT=kind != 2, N=n, M=M, WS=ws,
        BT=MIX_BT, num_warps=MIX_WARPS)

    h_in = _empty(T, D, dtype=x.dtype, device=dev)
    launch(mhc_pre_fwd_apply_kernel, lambda meta: (triton.cdiv(T, meta["BT"]) * triton.cdiv(D, meta["BH"]),),
           x, h_pre, h_in, T, D, *x.stride(), N=n, T_CLASS=size_class(T))
    return h_in, h_post, h_res, z, inv_rms


def backward(dh_in, dh_post, dh_res, x, phi, alpha, bias, gamma, z, inv_rms, sinkhorn_iters: int,
             post_mult: float, norm_eps: float, pre_eps: float, sinkhorn_eps: float, dx_acc=None):
    """(dx [T, n, D] x.dtype, dphi [M, n*D], dalpha [3], dbias [M], dgamma [n*D] or None), contiguous.

    dh_in [T, D] (any dtype and strides), dh_post [T, n], dh_res [T, n, n]; z [T, M] and inv_rms [T]
    from :func:`forward`. ``dx_acc``: None, or [T, n, D] in x's dtype with any strides, a gradient of
    x from elsewhere, added to dx in fp32 inside the grad kernel before dx's one rounding.
    Parameter gradients come back in the dtypes of phi, alpha, bias, gamma.
    """
    T, n, D, M, phi32, alpha32, bias32, gamma32 = _prepare(x, phi, alpha, bias, gamma)
    _check("dh_in", dh_in, (T, D))
    _check("dh_post", dh_post, (T, n))
    _check("dh_res", dh_res, (T, n, n))
    _check("z", z, (T, M))
    _check("inv_rms", inv_rms, (T,))
    if dx_acc is not None:
        check_dx_acc(dx_acc, x)
        dx_acc = narrow_strides(dx_acc)
    x, dh_in = narrow_strides(x), narrow_strides(dh_in)
    iters = int(sinkhorn_iters)
    dev, f = x.device, torch.float32
    has_gamma = gamma is not None
    kind = X_KINDS[x.dtype]
    mp = pow2_at_least(M, 16)

    blocks = triton.cdiv(T, BT_TOKEN)
    gq = _empty(T, mp, dtype=f, device=dev) if kind == 2 else _empty(T, 2 * mp, dtype=torch.bfloat16, device=dev)
    coef = _empty(T, 2, dtype=f, device=dev)
    h_pre = _empty(T, n, dtype=f, device=dev)
    block_sums = _empty(blocks, M + 3, dtype=f, device=dev)
    scratch = _empty(blocks * (2 * iters - 1) * BT_TOKEN * n * n, dtype=f, device=dev)
    launch(mhc_pre_bwd_token_kernel, (blocks,),
           x, dh_in, f32(dh_post), f32(dh_res), f32(z), f32(inv_rms), alpha32, bias32, gq, coef, h_pre, block_sums,
           scratch, T, D, *x.stride(), *dh_in.stride(), iters, float(post_mult), float(pre_eps), float(sinkhorn_eps),
           X_KIND=kind, N=n, M=M, MP=mp, BT=BT_TOKEN, T_CLASS=size_class(T))

    splits, tps = _grad_splits(T, n, D, dev)
    dx = _empty(T, n, D, dtype=x.dtype, device=dev)
    partial = _empty(splits, M, n * D, dtype=f, device=dev)
    w, w_lo = _weights(phi32, gamma32, kind)
    acc = dx if dx_acc is None else dx_acc
    launch(mhc_pre_bwd_grad_kernel, lambda meta: (triton.cdiv(D, meta["BK"] // n), splits),
           x, dh_in, w, w_lo, gq, coef, h_pre, acc, dx, partial, T, D, tps,
           *x.stride(), *dh_in.stride(), *acc.stride(), X_KIND=kind, HAS_ACC=dx_acc is not None, N=n, M=M, MP=mp,
           T_CLASS=size_class(T))

    dphi = _empty(M, n * D, dtype=f, device=dev)
    dgamma = _empty(n * D, dtype=f, device=dev) if has_gamma else dphi
    mhc_pre_bwd_param_kernel[(triton.cdiv(n * D, PARAM_BC),)](
        partial, phi32, phi32 if gamma32 is None else gamma32, dphi, dgamma, splits, n * D,
        HAS_GAMMA=has_gamma, M=M, MP=mp, BC=PARAM_BC, num_warps=PARAM_WARPS)

    sums = block_sums.sum(0)
    dbias, dalpha = sums[:M].clone(), sums[M:].clone()
    return (dx, dphi.to(phi.dtype), dalpha.to(alpha.dtype), dbias.to(bias.dtype),
            dgamma.to(gamma.dtype) if has_gamma else None)
