"""mHC pre: the public function, its input contract and its autograd front end.

Custom ops ``kernel_dispatch::mhc_pre_fwd`` / ``mhc_pre_bwd`` work on tokens flattened to
x [T, n, D]; saved for backward: x, phi, alpha, bias, gamma and the fp32 residuals
z [T, M] (normalised mixing logits) and inv_rms [T].

With ``return_residual=True`` the autograd node also returns x itself (a view) for the residual
path into mhc_post; the gradient arriving there is added inside the backward kernel that writes
dx (backend ``backward(..., dx_acc=...)``) instead of by autograd in a separate pass over x.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Optional

import torch
from torch import Tensor

from .. import registry
from ..declaration import Capabilities, Fact, Operator, Tolerance, declare
from ._frontend import (PARAM_DTYPES, backend_pair, call_backward, call_op, check_float, check_positive_int,
                        check_same_device, check_shape, check_tensor, fmt_shape)

OP = "mhc_pre"


@dataclass(frozen=True)
class MHCCaps(Capabilities):
    """mHC limits (pre and post): stream counts n (None: any), D a multiple of ``d_multiple``, at most ``max_d``."""

    n_streams: tuple[int, ...] | None = None
    d_multiple: int = 1
    max_d: int | None = None

    def operator_reasons(self, meta: Mapping[str, Any]) -> list[str]:
        r = []
        n = meta.get("n")
        if n is not None and self.n_streams is not None and n not in self.n_streams:
            r.append(f"n {n} not in {{{', '.join(map(str, self.n_streams))}}}")
        d = meta.get("D")
        if d is not None and d % self.d_multiple:
            r.append(f"D {d} is not a multiple of {self.d_multiple}")
        if d is not None and self.max_d is not None and d > self.max_d:
            r.append(f"D {d} > {self.max_d}")
        return r

    def features(self) -> str:
        n = "any" if self.n_streams is None else "/".join(map(str, self.n_streams))
        return f"n {n}, " + ("D any" if self.d_multiple == 1 else f"D % {self.d_multiple} == 0")


def mhc_meta(x: Tensor, **_: Any) -> dict:
    """What the registry needs to know about a call (x [..., n, D]) to choose a backend."""
    return {"device": x.device.type, "dtype": x.dtype, "n": x.shape[-2], "D": x.shape[-1]}


INFO_FACTS = (Fact("n", "--n", 4, "mHC streams"), Fact("D", "--D", 4096, "mHC hidden size"))


def _ct(x: Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _fwd(x: Tensor, phi: Tensor, alpha: Tensor, bias: Tensor, gamma: Optional[Tensor], sinkhorn_iters: int,
         post_mult: float, norm_eps: float, pre_eps: float, sinkhorn_eps: float,
         backend: str) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(h_in [T, D], h_post [T, n], h_res [T, n, n], z [T, M], inv_rms [T]) for x [T, n, D]."""
    return tuple(registry.kernels(OP, backend).forward(x, phi, alpha, bias, gamma, sinkhorn_iters, post_mult,
                                                       norm_eps, pre_eps, sinkhorn_eps))


mhc_pre_fwd = torch.library.custom_op("kernel_dispatch::mhc_pre_fwd", _fwd, mutates_args=())


@mhc_pre_fwd.register_fake
def _(x, phi, alpha, bias, gamma, sinkhorn_iters, post_mult, norm_eps, pre_eps, sinkhorn_eps, backend):
    T, n, D = x.shape
    ct = _ct(x)
    return (x.new_empty(T, D), x.new_empty(T, n, dtype=ct), x.new_empty(T, n, n, dtype=ct),
            x.new_empty(T, phi.shape[0], dtype=ct), x.new_empty(T, dtype=ct))


def _bwd(dh_in: Tensor, dh_post: Tensor, dh_res: Tensor, x: Tensor, phi: Tensor, alpha: Tensor, bias: Tensor,
         gamma: Optional[Tensor], z: Tensor, inv_rms: Tensor, sinkhorn_iters: int, post_mult: float,
         norm_eps: float, pre_eps: float, sinkhorn_eps: float, backend: str,
         dx_acc: Optional[Tensor] = None) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(dx, dphi, dalpha, dbias, dgamma); dgamma is an empty [0] tensor when gamma is None.

    ``dx_acc`` [T, n, D] (x's dtype) or None: the residual path's gradient of x, added into dx.
    """
    extra = {} if dx_acc is None else {"dx_acc": dx_acc}
    dx, dphi, dalpha, dbias, dgamma = registry.kernels(OP, backend).backward(
        dh_in, dh_post, dh_res, x, phi, alpha, bias, gamma, z, inv_rms, sinkhorn_iters, post_mult, norm_eps,
        pre_eps, sinkhorn_eps, **extra)
    if dgamma is None:
        dgamma = phi.new_empty(0)
    return dx, dphi, dalpha, dbias, dgamma


mhc_pre_bwd = torch.library.custom_op("kernel_dispatch::mhc_pre_bwd", _bwd, mutates_args=())


@mhc_pre_bwd.register_fake
def _(dh_in, dh_post, dh_res, x, phi, alpha, bias, gamma, z, inv_rms, *args):
    return (x.new_empty(x.shape), phi.new_empty(phi.shape), alpha.new_empty(alpha.shape), bias.new_empty(bias.shape),
            phi.new_empty(0) if gamma is None else gamma.new_empty(gamma.shape))


class MHCPreFunction(torch.autograd.Function):
    """Autograd node for mHC pre on flattened tokens x [T, n, D]; with ``residual`` it also returns x."""

    @staticmethod
    def forward(ctx, x, phi, alpha, bias, gamma, hp, fwd_backend, bwd_backend, residual=False):
        h_in, h_post, h_res, z, inv_rms = call_op(mhc_pre_fwd, _fwd, x, phi, alpha, bias, gamma, *hp, fwd_backend)
        ctx.save_for_backward(x, phi, alpha, bias, gamma, z, inv_rms)
        ctx.hp, ctx.bwd_backend = hp, bwd_backend
        ctx.mark_non_differentiable(z, inv_rms)
        ctx.set_materialize_grads(False)  # an unused x residual must not cost a zero-filled [T, n, D]
        if residual:
            return h_in, h_post, h_res, z, inv_rms, x.view_as(x)
        return h_in, h_post, h_res, z, inv_rms

    @staticmethod
    def backward(ctx, dh_in, dh_post, dh_res, _dz, _dinv, dx_res=None):
        x, phi, alpha, bias, gamma, z, inv_rms = ctx.saved_tensors
        T, n, D = x.shape
        ct = z.dtype
        dh_in = x.new_zeros(T, D) if dh_in is None else dh_in
        dh_post = z.new_zeros(T, n, dtype=ct) if dh_post is None else dh_post
        dh_res = z.new_zeros(T, n, n, dtype=ct) if dh_res is None else dh_res
        dx, dphi, dalpha, dbias, dgamma = call_backward(
            OP, ctx.bwd_backend, mhc_pre_bwd, _bwd, dh_in, dh_post, dh_res, x, phi, alpha, bias, gamma, z, inv_rms, *ctx.hp,
            ctx.bwd_backend, None if dx_res is None else dx_res.to(x.dtype))
        return dx, dphi, dalpha, dbias, (dgamma if gamma is not None else None), None, None, None, None


def validate(x, phi, alpha, bias, gamma, sinkhorn_iters, post_mult, norm_eps, pre_eps, sinkhorn_eps) -> None:
    """Raise TypeError/ValueError naming the argument for anything outside the contract."""
    check_tensor("x", x, min_ndim=2)
    n, D = x.shape[-2], x.shape[-1]
    if n == 0 or D == 0:
        raise ValueError(f"x: expected [..., n, D] with n, D >= 1, got {fmt_shape(x)}")
    if x.numel() == 0:
        raise ValueError(f"x: no tokens (T = 0) in shape {fmt_shape(x)}; expected at least one")
    M = n * n + 2 * n
    check_tensor("phi", phi, dtypes=PARAM_DTYPES, ndim=2)
    check_shape("phi", phi, (M, n * D), "[n*n + 2n, n*D]")
    check_tensor("alpha", alpha, dtypes=PARAM_DTYPES, ndim=1)
    check_shape("alpha", alpha, (3,), "[3]")
    check_tensor("bias", bias, dtypes=PARAM_DTYPES, ndim=1)
    check_shape("bias", bias, (M,), "[n*n + 2n]")
    if gamma is not None:
        check_tensor("gamma", gamma, dtypes=PARAM_DTYPES, ndim=1)
        check_shape("gamma", gamma, (n * D,), "[n*D]")
    check_positive_int("sinkhorn_iters", sinkhorn_iters)
    check_float("post_mult", post_mult)
    check_float("norm_eps", norm_eps, minimum=0, strict=True)  # 0 would divide an all-zero token by zero
    check_float("pre_eps", pre_eps, minimum=0)
    check_float("sinkhorn_eps", sinkhorn_eps, minimum=0)
    check_same_device(x=x, phi=phi, alpha=alpha, bias=bias, gamma=gamma)


def mhc_pre(x: Tensor, phi: Tensor, alpha: Tensor, bias: Tensor, gamma: Tensor | None = None, *,
            sinkhorn_iters: int = 20, post_mult: float = 2.0, norm_eps: float = 1e-6, pre_eps: float = 1e-6,
            sinkhorn_eps: float = 1e-6, backend: Any = None, return_residual: bool = False) -> tuple[Tensor, ...]:
    """mHC pre: the sublayer input and the post and res mixings of n residual streams.

    Args:
        x: [..., n, D] bf16/fp16/fp32, the streams of each token (any leading dims).
        phi: [M, n*D] fp32 with M = n*n + 2n; rows pre (n), post (n), res (n*n).
        alpha: [3] fp32 scales (pre, post, res). bias: [M] fp32.
        gamma: [n*D] fp32 RMSNorm weight, or None for ones.
        sinkhorn_iters, post_mult, norm_eps, pre_eps, sinkhorn_eps: see SPEC section 2.
        backend: a backend name or (forward, backward) pair; overrides every other choice.
        return_residual: also return x itself [..., n, D] (a view) to pass to ``mhc_post`` as its x:
            the two gradients of x are then summed inside the pre backward kernel, saving autograd's
            separate add over [T, n, D] (the values are identical either way).

    Returns:
        h_in [..., D] in x's dtype; h_post [..., n] fp32; h_res [..., n, n] fp32, [in, out] layout;
        with ``return_residual``, then x [..., n, D].

    Non-finite tensor values are not checked; they propagate as in the golden backend: a NaN or inf in x makes
    every output of its token non-finite and leaves every other token unchanged; a non-finite phi, alpha, bias or
    gamma reaches every token.
    """
    validate(x, phi, alpha, bias, gamma, sinkhorn_iters, post_mult, norm_eps, pre_eps, sinkhorn_eps)
    lead, (n, D) = x.shape[:-2], x.shape[-2:]
    T = math.prod(lead)
    fwd, bwd = backend_pair(OP, mhc_meta(x), backend)
    hp = (int(sinkhorn_iters), float(post_mult), float(norm_eps), float(pre_eps), float(sinkhorn_eps))
    if not isinstance(return_residual, bool):
        raise TypeError(f"return_residual: expected a bool, got {type(return_residual).__name__}")
    outs = MHCPreFunction.apply(x.reshape(T, n, D), phi, alpha, bias, gamma, hp, fwd, bwd, return_residual)
    h_in, h_post, h_res = outs[0].view(*lead, D), outs[1].view(*lead, n), outs[2].view(*lead, n, n)
    if return_residual:
        return h_in, h_post, h_res, outs[5].view(x.shape)
    return h_in, h_post, h_res


def _declaration() -> Operator:
    from . import mhc_cases as cases

    tol = {"h_in": (2, 64, 1), "h_post": (1, 64, 1), "h_res": (1, 256, 2),
           "dx": (4, 256, 2), "dphi": (2, 256, 2), "dalpha": (2, 256, 2), "dbias": (2, 256, 2), "dgamma": (2, 256, 2)}
    return Operator(
        name=OP, function=mhc_pre, capabilities=MHCCaps, selection_facts=mhc_meta, validate=validate,
        outputs=("h_in", "h_post", "h_res"),
        gradients={"x": "dx", "phi": "dphi", "alpha": "dalpha", "bias": "dbias", "gamma": "dgamma"},
        env_var="MHC_BACKEND", group="mhc", info_facts=INFO_FACTS,
        tolerances={k: Tolerance(*v) for k, v in tol.items()},
        cases=cases.CASES, make_inputs=cases.make_pre_inputs, bench="kernel_dispatch.ops.mhc_bench")


DECLARATION = declare(_declaration())
