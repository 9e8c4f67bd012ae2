"""Lazy attention over packed documents in plain PyTorch (SPEC section 4), forward and closed-form backward.

Layout (FlashAttention's varlen layout): q [T, H, D]; k, v [T, Hkv, D]; cu_seqlens int32 [N + 1]
with document d at tokens cu_seqlens[d] .. cu_seqlens[d + 1] - 1; bias [H, W]; tau [H].
Each document is section 1 with B = 1: this module runs :mod:`.lazy_attention` on the documents,
one call per distinct document length (documents of equal length are one batch), so memory is
O(sum of L_d^2), never O(T^2). O is returned in q's dtype, LSE as [H, T] in float32 (float64 for
float64 q). dbias and dtau sum over documents.

:func:`forward_by_length` and :func:`backward_by_length` are that per-length driver for any module with the
dense signatures ``forward(q, k, v, bias, tau, scale, lengths, causal)`` and ``backward(do, q, k, v, bias, tau,
o, lse, scale, lengths, causal)`` (the TileLang backend runs its dense kernels through them). They read
cu_seqlens on the host.
"""
from __future__ import annotations

import torch

from . import lazy_attention as dense
from ._common import compute_dtype


def _groups(cu_seqlens: torch.Tensor) -> list[torch.Tensor]:
    """Token indices [B_L, L] (int64, on cu_seqlens' device) of the non-empty documents, one entry per length L."""
    cu = cu_seqlens.tolist()
    by_length: dict[int, list[int]] = {}
    for start, end in zip(cu[:-1], cu[1:]):
        if end > start:
            by_length.setdefault(end - start, []).append(start)
    dev = cu_seqlens.device
    return [torch.tensor(starts, device=dev)[:, None] + torch.arange(length, device=dev)[None, :]
            for length, starts in sorted(by_length.items())]


def _dense(t: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """Tokens idx [B, L] of t [T, heads, D] as the dense layout [B, heads, L, D]."""
    return t[idx].transpose(1, 2)


def forward_by_length(module, q, k, v, bias, tau, cu_seqlens, scale: float, causal: bool, lse_dtype: torch.dtype):
    """O [T, H, D] (q's dtype, contiguous) and LSE [H, T] (``lse_dtype``): ``module.forward`` once per distinct
    document length, on those documents as one dense batch [B_L, H, L, D] with lengths=None, in ascending length."""
    T, H, D = q.shape
    o = q.new_zeros(q.shape)
    lse = torch.zeros(H, T, dtype=lse_dtype, device=q.device)
    for idx in _groups(cu_seqlens):
        o_g, lse_g = module.forward(_dense(q, idx), _dense(k, idx), _dense(v, idx), bias, tau, scale, None, causal)
        o[idx] = o_g.transpose(1, 2)
        lse[:, idx] = lse_g.transpose(0, 1)
    return o, lse


def backward_by_length(module, do, q, k, v, bias, tau, o, lse, cu_seqlens, scale: float, causal: bool,
                       acc_dtype: torch.dtype):
    """(dq, dk, dv, dbias, dtau), contiguous, in the dtypes of (q, k, v, bias, tau): ``module.backward`` once per
    distinct document length, as :func:`forward_by_length` groups them; dbias and dtau sum over the lengths in
    ascending order in ``acc_dtype``, then are cast (the same inputs give the same bits)."""
    dq, dk, dv = q.new_zeros(q.shape), k.new_zeros(k.shape), v.new_zeros(v.shape)
    dbias = torch.zeros(bias.shape, dtype=acc_dtype, device=q.device)
    dtau = torch.zeros(tau.shape, dtype=acc_dtype, device=q.device)
    for idx in _groups(cu_seqlens):
        grads = module.backward(_dense(do, idx), _dense(q, idx), _dense(k, idx), _dense(v, idx), bias, tau,
                                _dense(o, idx), lse[:, idx].transpose(0, 1), scale, None, causal)
        for full, part in zip((dq, dk, dv), grads[:3]):
            full[idx] = part.transpose(1, 2)
        dbias += grads[3].to(acc_dtype)
        dtau += grads[4].to(acc_dtype)
    return dq, dk, dv, dbias.to(bias.dtype), dtau.to(tau.dtype)


def forward(q, k, v, bias, tau, cu_seqlens, max_seqlen: int, scale: float, causal: bool):
    """O [T, H, D] (q's dtype) and LSE [H, T] (float32, float64 for float64 q).

    ``max_seqlen`` is part of the shared signature; this implementation reads the lengths from cu_seqlens.
    """
    return forward_by_length(dense, q, k, v, bias, tau, cu_seqlens, scale, causal, compute_dtype(q))


def backward(do, q, k, v, bias, tau, o, lse, cu_seqlens, max_seqlen: int, scale: float, causal: bool):
    """(dq [T, H, D], dk, dv [T, Hkv, D], dbias [H, W], dtau [H]) in the dtypes of (q, k, v, bias, tau)."""
    return backward_by_length(dense, do, q, k, v, bias, tau, o, lse, cu_seqlens, scale, causal, compute_dtype(q))
