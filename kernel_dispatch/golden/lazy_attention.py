"""Lazy attention in plain PyTorch: dense scores, forward and closed-form backward (SPEC section 1).

Layout: q [B, H, L, D]; k, v [B, Hkv, L, D]; bias [H, W]; tau [H]; lengths [B] or None.
All math in float32 (float64 when q is float64); O is returned in q's dtype, LSE [B, H, L]
in the compute dtype.
"""
from __future__ import annotations

import torch

from ._common import compute_dtype


def _expand_kv(t: torch.Tensor, groups: int) -> torch.Tensor:
    return t if groups == 1 else t.repeat_interleave(groups, dim=1)


def _zero_padding(lengths, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """``tensors`` [B, *, L, D] with every position >= lengths[b] set to 0 (all of them when lengths is None): what
    padding holds, NaN included, then never reaches a valid row through a product with a masked zero."""
    if lengths is None:
        return tensors
    B, _, L, _ = tensors[0].shape
    pad = torch.arange(L, device=tensors[0].device)[None, :] >= lengths.to(tensors[0].device)[:, None]
    return tuple(t.masked_fill(pad.view(B, 1, L, 1), 0) for t in tensors)


def _scores(q, k, bias, scale, lengths, causal, ct):
    """Masked scores S [B, H, L, L], the validity mask, i [.., L, 1] and the valid-row mask."""
    B, H, L, _ = q.shape
    groups = H // k.shape[1]
    dev = q.device
    qf, kf = q.to(ct), _expand_kv(k.to(ct), groups)
    s = scale * (qf @ kf.transpose(-1, -2))
    m = torch.arange(L, device=dev)[:, None]
    n = torch.arange(L, device=dev)[None, :]
    dist = (m - n) if causal else (m - n).abs()
    W = bias.shape[1]
    near = (dist >= 0) & (dist < W)
    s = s + torch.where(near, bias.to(ct)[:, dist.clamp(0, W - 1)], torch.zeros((), dtype=ct, device=dev))
    valid = torch.ones(B, 1, L, L, dtype=torch.bool, device=dev)
    if causal:
        valid = valid & (n <= m)
    if lengths is not None:
        lens = lengths.to(dev).view(B, 1, 1, 1)
        valid = valid & (n < lens)
        row_valid = (m < lens)  # [B, 1, L, 1]
    else:
        row_valid = torch.ones(B, 1, L, 1, dtype=torch.bool, device=dev)
    if causal:
        i = (m + 1).to(ct).expand(L, 1).view(1, 1, L, 1)
    elif lengths is not None:
        i = lengths.to(dev, ct).view(B, 1, 1, 1)
    else:
        i = torch.full((1, 1, 1, 1), float(L), dtype=ct, device=dev)
    s = s.masked_fill(~valid, float("-inf"))
    return s, valid, i, row_valid


def forward(q, k, v, bias, tau, scale: float, lengths, causal: bool):
    """O [B, H, L, D] (q's dtype) and LSE [B, H, L] (float32, or float64 for float64 q)."""
    ct = compute_dtype(q)
    groups = q.shape[1] // k.shape[1]
    out_dtype = q.dtype
    q, k, v = _zero_padding(lengths, q, k, v)
    s, valid, i, row_valid = _scores(q, k, bias, scale, lengths, causal, ct)
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse[..., None])
    a = torch.relu(p + tau.to(ct).view(1, -1, 1, 1) / i) * valid
    o = torch.where(row_valid, a @ _expand_kv(v.to(ct), groups), 0)
    return o.to(out_dtype), lse


def backward(do, q, k, v, bias, tau, o, lse, scale: float, lengths, causal: bool):
    """(dq, dk, dv, dbias, dtau) in the dtypes of (q, k, v, bias, tau); see SPEC section 1.

    In grad mode (a backward run with create_graph=True) LSE is recomputed from the scores instead of read
    from ``lse``, so that the gradients are differentiable functions of the inputs (second-order gradients).
    """
    ct = compute_dtype(q)
    B, H, L, D = q.shape
    Hkv = k.shape[1]
    groups = H // Hkv
    dtypes = q.dtype, k.dtype, v.dtype
    do, q, k, v = _zero_padding(lengths, do, q, k, v)
    s, valid, i, row_valid = _scores(q, k, bias, scale, lengths, causal, ct)
    if torch.is_grad_enabled():
        lse = torch.logsumexp(s, dim=-1)
    p = torch.where(row_valid, torch.exp(s - lse.to(ct)[..., None]), 0)
    shifted = p + tau.to(ct).view(1, -1, 1, 1) / i
    mk = (shifted > 0) & valid
    a = torch.relu(shifted) * valid
    dof = do.to(ct)
    vf = _expand_kv(v.to(ct), groups)
    da = dof @ vf.transpose(-1, -2)
    dp = da * mk
    delta = (p * dp).sum(-1, keepdim=True)
    ds = p * (dp - delta)
    dq = scale * (ds @ _expand_kv(k.to(ct), groups))
    dk = scale * (ds.transpose(-1, -2) @ q.to(ct))
    dv = a.transpose(-1, -2) @ dof
    dk = dk.view(B, Hkv, groups, L, D).sum(2)
    dv = dv.view(B, Hkv, groups, L, D).sum(2)
    W = bias.shape[1]
    ds_h = ds.sum(0)  # [H, L, L]
    dbias = torch.zeros(H, W, dtype=ct, device=q.device)
    for t in range(min(W, L)):
        dbias[:, t] = torch.diagonal(ds_h, offset=-t, dim1=-2, dim2=-1).sum(-1)
        if not causal and t > 0:
            dbias[:, t] += torch.diagonal(ds_h, offset=t, dim1=-2, dim2=-1).sum(-1)
    dtau = ((dp.sum(-1, keepdim=True) / i).sum((0, 2, 3)))
    return dq.to(dtypes[0]), dk.to(dtypes[1]), dv.to(dtypes[2]), dbias.to(bias.dtype), dtau.to(tau.dtype)
