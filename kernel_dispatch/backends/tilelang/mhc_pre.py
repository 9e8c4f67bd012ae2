"""mHC pre on TileLang (SPEC section 2): forward and exact backward through every Sinkhorn step.

Same functions, signatures, outputs and residuals as ``kernel_dispatch/golden/mhc_pre.py``:
x [T, n, D] (n = 4, D a multiple of 8) fp16/bf16 with any strides (made contiguous here);
phi [M, n*D], alpha [3], bias [M], gamma [n*D] or None, fp32 (float64 parameters are computed in
fp32 and returned in their dtype). Residuals z [T, M] and inv_rms [T] fp32.

Forward, 4 kernels: weights (pg = phi * gamma as two bf16 pieces) -> gemm (x read once: h_mix
partials on bf16 wgmma, and sum x^2) -> mix (z, inv_rms, h_pre, h_post, Sinkhorn h_res) ->
apply (x read again: h_in). Backward, 5 kernels: dot (dh_pre = x . dh_in) -> bwd mix (Sinkhorn
recomputed and reversed; G = dh_mix in bf16 pieces, coef, dalpha/dbias partials) -> weights ->
dx (dx, and dphi partials per token split) -> param (dphi, dgamma). Every parameter gradient is
a fixed-order reduction: bitwise reproducible. fp16 x enters the GEMMs as two exact bf16 pieces.

Kernels are built once per shape class (D, dtype, hyper-parameters; T symbolic), in ``_build.kernel``.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

from . import (_build, _mhc_pre_apply_kernel, _mhc_pre_bwd_dot_kernel, _mhc_pre_bwd_dx_kernel,
               _mhc_pre_bwd_mix_kernel, _mhc_pre_bwd_param_kernel, _mhc_pre_gemm_kernel, _mhc_pre_mix_kernel,
               _mhc_pre_weights_kernel)
from ...golden.mhc_pre import check_dx_acc
from ._constants import constant
from ._mhc_common import N_STREAMS, bf16_pieces, check_streams, dense, sm_count, tl_dtype
from ._mhc_pre_bwd_dx_kernel import DxTiles
from ._mhc_pre_bwd_mix_kernel import AUX_COLS, GP_COLS, PG_DALPHA, PG_ROWS

F32 = torch.float32
M_ROWS = N_STREAMS * N_STREAMS + 2 * N_STREAMS
DX_CHUNK = 32       # features per CTA of the dx kernel
DX_CTAS_PER_SM = 2  # bf16 dx kernel: 2 CTAs per SM of 2 pipeline stages (else 1 CTA of 4 stages)
# dx pipeline stages by (x pieces P, CTAs per SM): fp16 x (P = 2) runs one CTA of 3 stages
DX_STAGES = {(1, 1): 4, (1, 2): 2, (2, 1): 3}


def dx_splits(D: int, slots: int) -> int:
    """Token splits of the dx kernel: the S in 1..8 whose last wave over ``slots`` resident CTAs is fullest."""
    nch = -(-D // DX_CHUNK)
    return max(range(1, 9), key=lambda s: (nch * s / (math.ceil(nch * s / slots) * slots), -s))


@dataclass(frozen=True)
class Splits:
    """How the kernels of one shape class split their work: ``gemm`` K splits of the forward GEMM, ``dx`` and
    ``dx_acc`` token splits of the dx kernel without and with dx_acc."""

    gemm: int
    dx: int
    dx_acc: int


def splits(D: int, dtype: torch.dtype, sms: int) -> Splits:
    """The :class:`Splits` for feature size ``D``, x ``dtype`` and ``sms`` multiprocessors."""
    ctas = DX_CTAS_PER_SM if dtype == torch.bfloat16 else 1
    # adding dx_acc: one CTA per SM (its tiles double the shared memory)
    return Splits(gemm=_mhc_pre_gemm_kernel.splits_and_block(N_STREAMS * D)[0], dx=dx_splits(D, sms * ctas),
                  dx_acc=dx_splits(D, sms))


def kernel_specs(D: int, dtype: torch.dtype, hp: tuple, sms: int) -> dict:
    """{stage: (factory, args)} of every kernel for feature size ``D``, x ``dtype``, hyper-parameters
    ``hp`` = (sinkhorn_iters, post_mult, norm_eps, pre_eps, sinkhorn_eps) and ``sms`` multiprocessors."""
    iters, post_mult, norm_eps, pre_eps, sk_eps = int(hp[0]), float(hp[1]), float(hp[2]), float(hp[3]), float(hp[4])
    M, K, dt = M_ROWS, N_STREAMS * D, tl_dtype(dtype)
    P = 1 if dtype == torch.bfloat16 else 2
    ctas = DX_CTAS_PER_SM if P == 1 else 1
    sp = splits(D, dtype, sms)
    dx_tiles = DxTiles(chunk=DX_CHUNK, tokens=64, stages=DX_STAGES[(P, ctas)])
    acc_tiles = DxTiles(chunk=DX_CHUNK, tokens=64, stages=3 if P == 1 else 2)
    return {
        "weights_fwd": (_mhc_pre_weights_kernel.build, (M, K, "fwd")),
        "gemm": (_mhc_pre_gemm_kernel.build, (K, M, P)),
        "mix": (_mhc_pre_mix_kernel.build, (D, sp.gemm, iters, post_mult, norm_eps, pre_eps, sk_eps)),
        "apply": (_mhc_pre_apply_kernel.build, (D, dt)),
        "dot": (_mhc_pre_bwd_dot_kernel.build, (D, dt)),
        "bwd_mix": (_mhc_pre_bwd_mix_kernel.build, (D, iters, post_mult, pre_eps, sk_eps)),
        "weights_bwd": (_mhc_pre_weights_kernel.build, (M, K, "bwd")),
        "dx": (_mhc_pre_bwd_dx_kernel.build, (D, dt, sp.dx, P, dx_tiles)),
        "param": (_mhc_pre_bwd_param_kernel.build, (M, D, sp.dx, DX_CHUNK)),
        "dx_acc": (_mhc_pre_bwd_dx_kernel.build, (D, dt, sp.dx_acc, P, acc_tiles, True)),
        "param_acc": (_mhc_pre_bwd_param_kernel.build, (M, D, sp.dx_acc, DX_CHUNK)),
    }


@functools.lru_cache(maxsize=None)
def _kernel_set(D: int, dtype: torch.dtype, hp: tuple, device: torch.device, ctas: int) -> tuple[dict, Splits]:
    """({stage: compiled kernel}, Splits) for one shape class on ``device``; ``ctas`` (DX_CTAS_PER_SM) is part of
    the key because the GPU checks switch it."""
    sms = sm_count(device.index)
    specs = kernel_specs(D, dtype, hp, sms)
    return {stage: _build.kernel(f, args, device) for stage, (f, args) in specs.items()}, splits(D, dtype, sms)


def _kernels(x, hp) -> tuple[dict, Splits]:
    """The compiled kernels (from ``_build.kernel``, the backend's one cache) and splits for x's shape class."""
    dev = x.device if x.device.index is not None else torch.device("cuda", torch.cuda.current_device())
    return _kernel_set(x.shape[2], x.dtype, tuple(hp), dev, DX_CTAS_PER_SM)


def _ones(K: int, device) -> torch.Tensor:
    return constant(("ones", K, device), lambda: torch.ones(K, dtype=F32, device=device))


def _check_params(x, phi, alpha, bias, gamma):
    T, n, D = check_streams("x", x)
    M, K = n * n + 2 * n, n * D
    for name, t, shape in (("phi", phi, (M, K)), ("alpha", alpha, (3,)), ("bias", bias, (M,)),
                           ("gamma", gamma, (K,))):
        if t is not None and tuple(t.shape) != shape:
            raise ValueError(f"{name}: expected shape {list(shape)}, got {list(t.shape)}")
    return T, n, D, M, K


def _acc_dummy(n: int, D: int, dtype, device) -> torch.Tensor:
    """The DXA argument of a dx kernel built without ``acc`` (never read)."""
    return constant(("acc", n, D, dtype, device), lambda: torch.zeros((1, n, D), dtype=dtype, device=device))


def _gamma32(gamma, K, device):
    return _ones(K, device) if gamma is None else dense(gamma, F32)


def forward(x, phi, alpha, bias, gamma, sinkhorn_iters: int, post_mult: float, norm_eps: float, pre_eps: float,
            sinkhorn_eps: float):
    """(h_in [T, D] x.dtype, h_post [T, n], h_res [T, n, n], z [T, M], inv_rms [T]), fp32 mixings."""
    T, n, D, M, K = _check_params(x, phi, alpha, bias, gamma)
    dev = x.device
    ks, sp = _kernels(x, (sinkhorn_iters, post_mult, norm_eps, pre_eps, sinkhorn_eps))
    xc = dense(x)
    w = torch.empty((_mhc_pre_weights_kernel.ROWS["fwd"], K), dtype=torch.bfloat16, device=dev)
    ks["weights_fwd"](dense(phi, F32), _gamma32(gamma, K, dev), w)

    xp = bf16_pieces(xc)
    P = xp.shape[1]
    part = torch.empty((sp.gemm, T, 2 * M), dtype=F32, device=dev)
    sq = torch.empty((sp.gemm, T), dtype=torch.float64, device=dev)
    ks["gemm"](xp.reshape(T, P * K), w, part, sq)

    z = torch.empty((T, M), dtype=F32, device=dev)
    inv_rms = torch.empty((T,), dtype=F32, device=dev)
    h_pre = torch.empty((T, n), dtype=F32, device=dev)
    h_post = torch.empty((T, n), dtype=F32, device=dev)
    h_res = torch.empty((T, n, n), dtype=F32, device=dev)
    ks["mix"](part, sq, dense(alpha, F32), dense(bias, F32), z, inv_rms, h_pre, h_post, h_res)

    h_in = torch.empty((T, D), dtype=x.dtype, device=dev)
    ks["apply"](xc, h_pre, h_in)
    return h_in, h_post, h_res, z, inv_rms


def backward(dh_in, dh_post, dh_res, x, phi, alpha, bias, gamma, z, inv_rms, sinkhorn_iters: int,
             post_mult: float, norm_eps: float, pre_eps: float, sinkhorn_eps: float, dx_acc=None):
    """(dx [T, n, D] x.dtype, dphi [M, n*D], dalpha [3], dbias [M], dgamma [n*D] or None).

    ``dx_acc`` None or [T, n, D] (x's dtype, any strides): added into dx inside the dx kernel.
    """
    T, n, D, M, K = _check_params(x, phi, alpha, bias, gamma)
    dev = x.device
    ks, sp = _kernels(x, (sinkhorn_iters, post_mult, norm_eps, pre_eps, sinkhorn_eps))
    xc = dense(x)
    g = dense(dh_in, x.dtype)
    dh_pre = torch.empty((T, n), dtype=F32, device=dev)
    ks["dot"](xc, g, dh_pre)

    gp = torch.empty((T, GP_COLS), dtype=torch.bfloat16, device=dev)
    aux = torch.empty((T, AUX_COLS), dtype=F32, device=dev)
    pg = torch.empty((PG_ROWS, -(-T // _mhc_pre_bwd_mix_kernel.TOKENS)), dtype=F32, device=dev)
    ks["bwd_mix"](dense(z, F32), dense(inv_rms, F32), dh_pre, dense(dh_post, F32), dense(dh_res, F32),
                     dense(alpha, F32), dense(bias, F32), gp, aux, pg)

    phi32, gamma32 = dense(phi, F32), _gamma32(gamma, K, dev)
    w = torch.empty((_mhc_pre_weights_kernel.ROWS["bwd"], K), dtype=torch.bfloat16, device=dev)
    ks["weights_bwd"](phi32, gamma32, w)

    dx_stage, param_stage = ("dx", "param") if dx_acc is None else ("dx_acc", "param_acc")
    if dx_acc is not None:
        check_dx_acc(dx_acc, x)
        xa = dense(dx_acc)
    else:
        xa = _acc_dummy(n, D, x.dtype, dev)
    S = sp.dx if dx_acc is None else sp.dx_acc
    xp = bf16_pieces(xc)
    dx = torch.empty((T, n, D), dtype=x.dtype, device=dev)
    part = torch.empty((S, GP_COLS, -(-D // DX_CHUNK), n * DX_CHUNK), dtype=F32, device=dev)
    ks[dx_stage](xp, g, gp, aux, w.view(w.shape[0], n, D), xa, dx, part)

    dphi = torch.empty((M, K), dtype=F32, device=dev)
    dgamma = torch.empty((K,), dtype=F32, device=dev)
    ks[param_stage](part, phi32, gamma32, dphi, dgamma)

    sums = pg.sum(1)  # a fixed-order reduction over the mix kernel's CTAs
    dbias, dalpha = sums[:M], sums[PG_DALPHA:PG_DALPHA + 3].clone()
    return (dx, dphi.to(phi.dtype), dalpha.to(alpha.dtype), dbias.to(bias.dtype),
            None if gamma is None else dgamma.to(gamma.dtype))
