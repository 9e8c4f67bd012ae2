"""Lazy attention over a KV cache in plain PyTorch, forward only (SPEC section 5).

Layout: q [B, H, Lq, D]; k_cache, v_cache [B, Hkv, S, D] (H % Hkv == 0, any strides); bias [H, W] fp32;
tau [H] fp32; seqlens_k [B] int: n_b, the valid keys of row b, the Lq new ones included (Lq <= n_b <= S).
Query j of row b sits at absolute position p = n_b - Lq + j: it sees keys 0 .. p, i = p + 1, and the
bias applies at distance p - n < W. All math in float32 (float64 when q is float64).
"""
from __future__ import annotations

import torch

from ._common import compute_dtype


def forward(q, k_cache, v_cache, bias, tau, seqlens_k, scale: float):
    """O [B, H, Lq, D] in q's dtype, contiguous; one batch row at a time over its first n_b keys."""
    ct = compute_dtype(q)
    B, H, Lq, D = q.shape
    groups = H // k_cache.shape[1]
    W = bias.shape[1]
    dev = q.device
    out = torch.empty(B, H, Lq, D, dtype=ct, device=dev)
    bias_c = bias.to(ct)
    tau_c = tau.to(ct).view(H, 1, 1)
    for b, n_b in enumerate(seqlens_k.tolist()):
        k = k_cache[b, :, :n_b].to(ct).repeat_interleave(groups, dim=0)  # [H, n_b, D]
        v = v_cache[b, :, :n_b].to(ct).repeat_interleave(groups, dim=0)
        s = scale * (q[b].to(ct) @ k.transpose(-1, -2))  # [H, Lq, n_b]
        p = torch.arange(n_b - Lq, n_b, device=dev)[:, None]  # absolute query positions
        dist = p - torch.arange(n_b, device=dev)[None, :]
        near = (dist >= 0) & (dist < W)
        s = s + torch.where(near, bias_c[:, dist.clamp(0, W - 1)], torch.zeros((), dtype=ct, device=dev))
        visible = dist >= 0
        s = s.masked_fill(~visible, float("-inf"))
        prob = torch.exp(s - torch.logsumexp(s, dim=-1, keepdim=True))
        a = torch.relu(prob + tau_c / (p + 1).to(ct)) * visible  # re-mask: tau > 0 must not reach future keys
        out[b] = a @ v
    return out.to(q.dtype)
