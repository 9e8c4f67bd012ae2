"""mHC post on TileLang (SPEC section 3): one streaming pass forward, one backward.

Same functions, signatures and outputs as ``kernel_dispatch/golden/mhc_post.py``: f [T, D] and
x [T, n, D] (n = 4, D a multiple of 8) in fp16/bf16 with any strides (made contiguous here),
h_post [T, n] and h_res [T, n, n] ([in, out]) fp32. fp32 math; out and dx in x's dtype, df in
f's dtype, dh_post and dh_res in their inputs' dtypes. Kernels: ``_mhc_post_fwd_kernel`` and
``_mhc_post_bwd_kernel`` (T symbolic: one build per (D, dtype), in ``_build.kernel``).
"""
from __future__ import annotations

import functools

import torch

from . import _build, _mhc_post_bwd_kernel, _mhc_post_fwd_kernel
from ._mhc_common import check_streams, dense, tl_dtype


def _check(f, x, h_post, h_res):
    T, n, D = check_streams("x", x)
    if f.dtype != x.dtype or tuple(f.shape) != (T, D):
        raise ValueError(f"f: expected [{T}, {D}] in {x.dtype}, got {list(f.shape)} in {f.dtype}")
    if tuple(h_post.shape) != (T, n) or tuple(h_res.shape) != (T, n, n):
        raise ValueError(f"h_post, h_res: expected [{T}, {n}] and [{T}, {n}, {n}], got {list(h_post.shape)} and "
                         f"{list(h_res.shape)}")
    return T, n, D


def kernel_specs(D: int, dtype: torch.dtype) -> list:
    """The (factory, args) of every kernel forward and backward use for feature size ``D`` and ``dtype``."""
    return [(_mhc_post_fwd_kernel.build, (D, tl_dtype(dtype))), (_mhc_post_bwd_kernel.build, (D, tl_dtype(dtype)))]


@functools.lru_cache(maxsize=None)
def _kernel_pair(D: int, dtype: torch.dtype, device: torch.device) -> tuple:
    return tuple(_build.kernel(f, args, device) for f, args in kernel_specs(D, dtype))


def _kernels(x) -> tuple:
    """(forward kernel, backward kernel) for x's shape class (from ``_build.kernel``, the backend's one cache)."""
    dev = x.device if x.device.index is not None else torch.device("cuda", torch.cuda.current_device())
    return _kernel_pair(x.shape[2], x.dtype, dev)


def forward(f: torch.Tensor, x: torch.Tensor, h_post: torch.Tensor, h_res: torch.Tensor) -> torch.Tensor:
    """out [T, n, D] (x's dtype) = h_post[o] * f[d] + sum_i h_res[i, o] * x[i, d]."""
    T, n, D = _check(f, x, h_post, h_res)
    out = torch.empty((T, n, D), dtype=x.dtype, device=x.device)
    _kernels(x)[0](dense(f), dense(x), dense(h_post, torch.float32), dense(h_res, torch.float32), out)
    return out


def backward(g: torch.Tensor, f: torch.Tensor, x: torch.Tensor, h_post: torch.Tensor, h_res: torch.Tensor):
    """(df [T, D], dx [T, n, D], dh_post [T, n], dh_res [T, n, n]) for upstream g [T, n, D]."""
    T, n, D = _check(f, x, h_post, h_res)
    if tuple(g.shape) != (T, n, D):
        raise ValueError(f"g: expected [{T}, {n}, {D}], got {list(g.shape)}")
    dev = x.device
    df = torch.empty((T, D), dtype=f.dtype, device=dev)
    dx = torch.empty((T, n, D), dtype=x.dtype, device=dev)
    dhp = torch.empty((T, n), dtype=torch.float32, device=dev)
    dhr = torch.empty((T, n, n), dtype=torch.float32, device=dev)
    _kernels(x)[1](dense(g, x.dtype), dense(f), dense(x), dense(h_post, torch.float32), dense(h_res, torch.float32),
                   df, dx, dhp, dhr)
    return df, dx, dhp.to(h_post.dtype), dhr.to(h_res.dtype)
