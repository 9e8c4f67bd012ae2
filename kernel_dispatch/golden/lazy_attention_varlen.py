"""Lazy attention over packed documents in plain PyTorch: each document is golden lazy attention on its own.

Layout: q [T, H, D]; k, v [T, Hkv, D]; cu_seqlens [N + 1] int32. O [T, H, D] in q's dtype; LSE [H, T] in
the compute dtype (FlashAttention's varlen layout).
"""
from __future__ import annotations

import torch

from . import lazy_attention as dense
from ._common import compute_dtype


def _documents(cu_seqlens):
    cu = cu_seqlens.tolist()
    return [(a, b) for a, b in zip(cu, cu[1:]) if b > a]


def _doc(t, a, b):
    return t[a:b].transpose(0, 1)[None]  # [1, heads, L, D]


def forward(q, k, v, bias, tau, cu_seqlens, max_seqlen: int, scale: float, causal: bool):
    """O [T, H, D] (q's dtype) and LSE [H, T] (float32, or float64 for float64 q)."""
    o = torch.zeros(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.full((q.shape[1], q.shape[0]), float("-inf"), dtype=compute_dtype(q), device=q.device)
    for a, b in _documents(cu_seqlens):
        od, ld = dense.forward(_doc(q, a, b), _doc(k, a, b), _doc(v, a, b), bias, tau, scale, None, causal)
        o[a:b] = od[0].transpose(0, 1)
        lse[:, a:b] = ld[0]
    return o, lse


def backward(do, q, k, v, bias, tau, o, lse, cu_seqlens, max_seqlen: int, scale: float, causal: bool):
    """(dq, dk, dv, dbias, dtau); dbias and dtau sum over documents."""
    ct = compute_dtype(q)
    dq, dk, dv = (torch.zeros(t.shape, dtype=ct, device=t.device) for t in (q, k, v))
    dbias = torch.zeros(bias.shape, dtype=ct, device=q.device)
    dtau = torch.zeros(tau.shape, dtype=ct, device=q.device)
    for a, b in _documents(cu_seqlens):
        g = dense.backward(_doc(do, a, b), _doc(q, a, b), _doc(k, a, b), _doc(v, a, b), bias, tau,
                           _doc(o, a, b), lse[None, :, a:b], scale, None, causal)
        for acc, d in zip((dq, dk, dv), g[:3]):
            acc[a:b] = d[0].transpose(0, 1)
        dbias += g[3]
        dtau += g[4]
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), dbias.to(bias.dtype), dtau.to(tau.dtype)
