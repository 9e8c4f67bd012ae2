"""mHC post in plain PyTorch (SPEC section 3).

Layout: f [T, D]; x [T, n, D]; h_post [T, n]; h_res [T, n, n] in [in, out] layout.
fp32 math (fp64 for fp64 inputs); out and dx in x's dtype, df in f's dtype.
"""
from __future__ import annotations

import torch

from ._common import compute_dtype


def forward(f, x, h_post, h_res):
    """out [T, n, D] = h_post[o] * f[d] + sum_i h_res[i, o] * x[i, d], in x's dtype."""
    ct = compute_dtype(x)
    out = h_post.to(ct)[:, :, None] * f.to(ct)[:, None, :] + torch.einsum("tio,tid->tod", h_res.to(ct), x.to(ct))
    return out.to(x.dtype)


def backward(g, f, x, h_post, h_res):
    """(df [T, D], dx [T, n, D], dh_post [T, n], dh_res [T, n, n]) for upstream g [T, n, D]."""
    ct = compute_dtype(x)
    gf = g.to(ct)
    df = torch.einsum("to,tod->td", h_post.to(ct), gf)
    dx = torch.einsum("tio,tod->tid", h_res.to(ct), gf)
    dh_post = torch.einsum("td,tod->to", f.to(ct), gf)
    dh_res = torch.einsum("tid,tod->tio", x.to(ct), gf)
    return df.to(f.dtype), dx.to(x.dtype), dh_post.to(h_post.dtype), dh_res.to(h_res.dtype)
