"""mHC post: the public function, its input contract and its autograd front end.

Custom ops ``kernel_dispatch::mhc_post_fwd`` / ``mhc_post_bwd`` on flattened tokens;
saved for backward: f, x, h_post, h_res.
"""
from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from .. import registry
from ..declaration import Operator, Tolerance, declare
from ._frontend import (PARAM_DTYPES, backend_pair, call_backward, call_op, check_same_device, check_shape,
                        check_tensor, fmt_shape)
from .mhc_pre import INFO_FACTS, MHCCaps, mhc_meta

OP = "mhc_post"


def _fwd(f: Tensor, x: Tensor, h_post: Tensor, h_res: Tensor, backend: str) -> Tensor:
    """out [T, n, D] in x's dtype for f [T, D], x [T, n, D], h_post [T, n], h_res [T, n, n]."""
    return registry.kernels(OP, backend).forward(f, x, h_post, h_res)


mhc_post_fwd = torch.library.custom_op("kernel_dispatch::mhc_post_fwd", _fwd, mutates_args=())


@mhc_post_fwd.register_fake
def _(f, x, h_post, h_res, backend):
    return x.new_empty(x.shape)


def _bwd(g: Tensor, f: Tensor, x: Tensor, h_post: Tensor, h_res: Tensor,
         backend: str) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(df [T, D], dx [T, n, D], dh_post [T, n], dh_res [T, n, n]) for upstream g [T, n, D]."""
    return tuple(registry.kernels(OP, backend).backward(g, f, x, h_post, h_res))


mhc_post_bwd = torch.library.custom_op("kernel_dispatch::mhc_post_bwd", _bwd, mutates_args=())


@mhc_post_bwd.register_fake
def _(g, f, x, h_post, h_res, backend):
    return f.new_empty(f.shape), x.new_empty(x.shape), h_post.new_empty(h_post.shape), h_res.new_empty(h_res.shape)


class MHCPostFunction(torch.autograd.Function):
    """Autograd node for mHC post on flattened tokens."""

    @staticmethod
    def forward(ctx, f, x, h_post, h_res, fwd_backend, bwd_backend):
        ctx.save_for_backward(f, x, h_post, h_res)
        ctx.bwd_backend = bwd_backend
        return call_op(mhc_post_fwd, _fwd, f, x, h_post, h_res, fwd_backend)

    @staticmethod
    def backward(ctx, g):
        f, x, h_post, h_res = ctx.saved_tensors
        df, dx, dh_post, dh_res = call_backward(OP, ctx.bwd_backend, mhc_post_bwd, _bwd, g, f, x, h_post, h_res,
                                                ctx.bwd_backend)
        return df, dx, dh_post, dh_res, None, None


def validate(f, x, h_post, h_res) -> None:
    """Raise TypeError/ValueError naming the argument for anything outside the contract."""
    check_tensor("x", x, min_ndim=2)
    lead, n, D = tuple(x.shape[:-2]), x.shape[-2], x.shape[-1]
    if x.numel() == 0:
        raise ValueError(f"x: expected [..., n, D] with at least one token and n, D >= 1, got {fmt_shape(x)}")
    check_tensor("f", f)
    if f.dtype != x.dtype:
        raise TypeError(f"f: expected the dtype of x ({x.dtype}), got {f.dtype}")
    check_shape("f", f, lead + (D,), "[..., D] (x's leading dims)")
    check_tensor("h_post", h_post, dtypes=PARAM_DTYPES)
    check_shape("h_post", h_post, lead + (n,), "[..., n]")
    check_tensor("h_res", h_res, dtypes=PARAM_DTYPES)
    check_shape("h_res", h_res, lead + (n, n), "[..., n, n]")
    check_same_device(x=x, f=f, h_post=h_post, h_res=h_res)


def mhc_post(f: Tensor, x: Tensor, h_post: Tensor, h_res: Tensor, *, backend: Any = None) -> Tensor:
    """mHC post: out[o, d] = h_post[o] * f[d] + sum_i h_res[i, o] * x[i, d].

    Args:
        f: [..., D], the sublayer output, in x's dtype.
        x: [..., n, D] bf16/fp16/fp32, the streams that went into mhc_pre.
        h_post: [..., n] fp32. h_res: [..., n, n] fp32 in [in, out] layout.
        backend: a backend name or (forward, backward) pair; overrides every other choice.

    Returns:
        out [..., n, D] in x's dtype.

    Non-finite tensor values are not checked; they propagate as in the golden backend: out[..., o, d] is
    non-finite exactly where f[..., d], a stream x[..., i, d], h_post[..., o] or a weight h_res[..., i, o] is.
    """
    validate(f, x, h_post, h_res)
    lead, (n, D) = x.shape[:-2], x.shape[-2:]
    T = math.prod(lead)
    fwd, bwd = backend_pair(OP, mhc_meta(x), backend)
    out = MHCPostFunction.apply(f.reshape(T, D), x.reshape(T, n, D), h_post.reshape(T, n), h_res.reshape(T, n, n),
                                fwd, bwd)
    return out.view(*lead, n, D)


def _declaration() -> Operator:
    from . import mhc_cases as cases

    tol = {"out": (2, 16), "df": (2, 64), "dx": (2, 64), "dh_post": (2, 64), "dh_res": (2, 64)}
    return Operator(
        name=OP, function=mhc_post, capabilities=MHCCaps, selection_facts=mhc_meta, validate=validate,
        outputs=("out",), gradients={"f": "df", "x": "dx", "h_post": "dh_post", "h_res": "dh_res"},
        env_var="MHC_BACKEND", group="mhc", info_facts=INFO_FACTS,
        tolerances={k: Tolerance(*v) for k, v in tol.items()},
        cases=cases.CASES, make_inputs=cases.make_post_inputs)


DECLARATION = declare(_declaration())
