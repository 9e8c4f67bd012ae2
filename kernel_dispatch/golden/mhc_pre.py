"""mHC pre in plain PyTorch: forward and closed-form backward through every Sinkhorn step (SPEC 2).

Layout: x [T, n, D] (tokens flattened by the front end); phi [M, n*D] with rows pre (n),
post (n), res (n*n); alpha [3]; bias [M]; gamma [n*D] or None. Residuals saved for the
backward: z [T, M] (the normalised mixing logits) and inv_rms [T], both float32 (float64
for float64 x).
"""
from __future__ import annotations

import torch

from ._common import compute_dtype


def _normalize(c: torch.Tensor, dim: int, eps: float) -> torch.Tensor:
    return c / (c.sum(dim, keepdim=True) + eps)


def _normalize_backward(dy: torch.Tensor, c: torch.Tensor, dim: int, eps: float) -> torch.Tensor:
    """Gradient of y = c / (sum_dim c + eps) with respect to c, given dy."""
    denom = c.sum(dim, keepdim=True) + eps
    y = c / denom
    return (dy - (dy * y).sum(dim, keepdim=True)) / denom


def sinkhorn(logits: torch.Tensor, iters: int, eps: float, keep: list | None = None) -> torch.Tensor:
    """softmax over the last dim, then alternating column/row normalisations; [..., n, n].

    When ``keep`` is a list, the input of every normalisation is appended to it as (c, dim).
    """
    c = torch.softmax(logits, dim=-1) + eps
    dims = [-2] + [-1, -2] * (iters - 1)
    for dim in dims:
        if keep is not None:
            keep.append((c, dim))
        c = _normalize(c, dim, eps)
    return c


def sinkhorn_backward(logits: torch.Tensor, dc: torch.Tensor, iters: int, eps: float) -> torch.Tensor:
    """Exact gradient of :func:`sinkhorn` (the truncated iteration) with respect to logits."""
    steps: list = []
    sinkhorn(logits, iters, eps, keep=steps)
    for c, dim in reversed(steps):
        dc = _normalize_backward(dc, c, dim, eps)
    p = torch.softmax(logits, dim=-1)
    return p * (dc - (dc * p).sum(-1, keepdim=True))


def _mixings(z, alpha, bias, n, post_mult, pre_eps):
    a = alpha.to(z.dtype)
    b = bias.to(z.dtype)
    s_pre = torch.sigmoid(a[0] * z[:, :n] + b[:n])
    s_post = torch.sigmoid(a[1] * z[:, n:2 * n] + b[n:2 * n])
    logits = (a[2] * z[:, 2 * n:] + b[2 * n:]).view(-1, n, n)
    return s_pre, s_pre + pre_eps, s_post, post_mult * s_post, logits


def _normalized_mix(x, phi, gamma, norm_eps: float, ct):
    """(xf [T, n*D], pg = phi * gamma [M, n*D], z [T, M], inv_rms [T]) in the compute dtype ``ct``."""
    T, n, D = x.shape
    xf = x.to(ct).reshape(T, n * D)
    pg = phi.to(ct) if gamma is None else phi.to(ct) * gamma.to(ct)
    inv_rms = torch.rsqrt(xf.square().mean(-1) + norm_eps)
    z = (xf @ pg.t()) * inv_rms[:, None]
    return xf, pg, z, inv_rms


def forward(x, phi, alpha, bias, gamma, sinkhorn_iters: int, post_mult: float, norm_eps: float,
            pre_eps: float, sinkhorn_eps: float):
    """(h_in [T, D] x.dtype, h_post [T, n], h_res [T, n, n], z [T, M], inv_rms [T]), fp32 or fp64."""
    ct = compute_dtype(x)
    T, n, D = x.shape
    xf, _, z, inv_rms = _normalized_mix(x, phi, gamma, norm_eps, ct)
    _, h_pre, _, h_post, logits = _mixings(z, alpha, bias, n, post_mult, pre_eps)
    h_res = sinkhorn(logits, sinkhorn_iters, sinkhorn_eps)
    h_in = (h_pre[:, :, None] * xf.view(T, n, D)).sum(1)
    return h_in.to(x.dtype), h_post, h_res, z, inv_rms


def check_dx_acc(dx_acc, x) -> None:
    """Every backend's check of ``backward(..., dx_acc=...)``: None, or [T, n, D] in x's dtype on x's device.

    Raises ValueError (shape) or TypeError (dtype, device) naming ``dx_acc``.
    """
    if dx_acc is None:
        return
    if tuple(dx_acc.shape) != tuple(x.shape):
        raise ValueError(f"dx_acc: expected shape {list(x.shape)} (x's), got {list(dx_acc.shape)}")
    if dx_acc.dtype != x.dtype or dx_acc.device != x.device:
        raise TypeError(f"dx_acc: expected {x.dtype} on {x.device} (x's), got {dx_acc.dtype} on {dx_acc.device}")


def backward(dh_in, dh_post, dh_res, x, phi, alpha, bias, gamma, z, inv_rms, sinkhorn_iters: int,
             post_mult: float, norm_eps: float, pre_eps: float, sinkhorn_eps: float, dx_acc=None):
    """(dx [T, n, D] x.dtype, dphi [M, n*D], dalpha [3], dbias [M], dgamma [n*D] or None).

    ``dx_acc`` (None, or [T, n, D] in x's dtype, any strides): a gradient of x from elsewhere (the
    residual path into mhc_post), added to dx before its one rounding to x's dtype.
    In grad mode (a backward run with create_graph=True) z and inv_rms are recomputed from x, phi and gamma
    instead of read from the residuals, so that the gradients are differentiable functions of the inputs.
    """
    check_dx_acc(dx_acc, x)
    ct = compute_dtype(x)
    T, n, D = x.shape
    if torch.is_grad_enabled():
        xf, pg, z, inv_rms = _normalized_mix(x, phi, gamma, norm_eps, ct)
    else:
        xf, pg = x.to(ct).reshape(T, n * D), (phi.to(ct) if gamma is None else phi.to(ct) * gamma.to(ct))
        z, inv_rms = z.to(ct), inv_rms.to(ct)
    s_pre, h_pre, s_post, _, logits = _mixings(z, alpha, bias, n, post_mult, pre_eps)
    g_in = dh_in.to(ct)
    dh_pre = (xf.view(T, n, D) * g_in[:, None, :]).sum(-1)
    d_pre = dh_pre * s_pre * (1 - s_pre)
    d_post = dh_post.to(ct) * post_mult * s_post * (1 - s_post)
    d_res = sinkhorn_backward(logits, dh_res.to(ct), sinkhorn_iters, sinkhorn_eps).reshape(T, n * n)
    zs = (z[:, :n], z[:, n:2 * n], z[:, 2 * n:])
    dalpha = torch.stack([(d * zz).sum() for d, zz in zip((d_pre, d_post, d_res), zs)])
    dbias = torch.cat([d_pre.sum(0), d_post.sum(0), d_res.sum(0)])
    a = alpha.to(ct)
    dz = torch.cat([d_pre * a[0], d_post * a[1], d_res * a[2]], dim=-1)
    dh_mix = dz * inv_rms[:, None]
    d_inv = (dz * z).sum(-1) / inv_rms
    dxf = dh_mix @ pg - (d_inv * inv_rms.pow(3) / (n * D))[:, None] * xf
    dx = dxf.view(T, n, D) + h_pre[:, :, None] * g_in[:, None, :]
    if dx_acc is not None:
        dx = dx + dx_acc.to(ct)
    grad_pg = dh_mix.t() @ xf
    dphi = grad_pg if gamma is None else grad_pg * gamma.to(ct)
    dgamma = None if gamma is None else (grad_pg * phi.to(ct)).sum(0).to(gamma.dtype)
    return dx.to(x.dtype), dphi.to(phi.dtype), dalpha.to(alpha.dtype), dbias.to(bias.dtype), dgamma
