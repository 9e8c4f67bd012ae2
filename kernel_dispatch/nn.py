"""nn.Module layers built on the operators: LazyAttention (RoPE, GQA) and the mHC wrapper.

Layout: activations are [B, L, dim] (batch, sequence, features); mHC residual streams are
[B, L, n, dim]. Learnable operator parameters (attention ``bias``/``tau``, mHC ``phi``/``alpha``/
``bias``/``gamma``) are fp32, as the operators require; activations may be bf16. The operators run
with autocast switched off so that, under ``torch.autocast``, they see the tensors' own dtypes and
their fp32 internal math is not recast (projections and MLPs still autocast).
"""
from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from .ops import lazy_attention, mhc_post, mhc_pre


def _no_autocast(x: Tensor):
    return torch.autocast(x.device.type, enabled=False)


def rotary_tables(length: int, head_dim: int, base: float, device: torch.device) -> tuple[Tensor, Tensor]:
    """cos, sin [length, head_dim // 2] fp32 for rotary embeddings (rotate-half convention)."""
    inv_freq = base ** (-torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim)
    angles = torch.arange(length, device=device, dtype=torch.float32)[:, None] * inv_freq[None, :]
    return angles.cos(), angles.sin()


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate x [B, H, L, D] by position: pairs (x[..., j], x[..., j + D/2]); fp32 math, x's dtype out."""
    half = x.shape[-1] // 2
    xf = x.float()
    x1, x2 = xf[..., :half], xf[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)


class LazyAttention(nn.Module):
    """Causal self-attention through :func:`kernel_dispatch.lazy_attention`.

    q/k/v/o projections without bias, rotary embeddings on q and k, grouped-query attention
    (``n_kv_heads`` divides ``n_heads``), a learnable distance bias [n_heads, max_bias_length]
    (fp32, zeros) and Elastic-Softmax offsets tau [n_heads] (fp32, ``tau_init``).
    Input and output: [B, L, dim].
    """

    def __init__(self, dim: int, n_heads: int, n_kv_heads: int | None = None, head_dim: int | None = None,
                 max_bias_length: int = 256, rope_base: float = 10000.0, tau_init: float = -1.0):
        super().__init__()
        n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        if n_heads < 1 or n_kv_heads < 1 or n_heads % n_kv_heads:
            raise ValueError(f"n_kv_heads: expected a divisor of n_heads = {n_heads}, got {n_kv_heads}")
        head_dim = dim // n_heads if head_dim is None else head_dim
        if head_dim < 2 or head_dim % 2:
            raise ValueError(f"head_dim: expected an even number >= 2 (rotary pairs), got {head_dim}")
        if max_bias_length < 1:
            raise ValueError(f"max_bias_length: expected >= 1, got {max_bias_length}")
        self.n_heads, self.n_kv_heads, self.head_dim, self.rope_base = n_heads, n_kv_heads, head_dim, rope_base
        self.wq = nn.Linear(dim, n_heads * head_dim, bias=False)
        self.wk = nn.Linear(dim, n_kv_heads * head_dim, bias=False)
        self.wv = nn.Linear(dim, n_kv_heads * head_dim, bias=False)
        self.wo = nn.Linear(n_heads * head_dim, dim, bias=False)
        self.bias = nn.Parameter(torch.zeros(n_heads, max_bias_length, dtype=torch.float32))
        self.tau = nn.Parameter(torch.full((n_heads,), float(tau_init), dtype=torch.float32))

    def forward(self, x: Tensor) -> Tensor:
        """x [B, L, dim] -> [B, L, dim]."""
        B, L, _ = x.shape
        q = self.wq(x).view(B, L, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(B, L, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(B, L, self.n_kv_heads, self.head_dim).transpose(1, 2)
        cos, sin = rotary_tables(L, self.head_dim, self.rope_base, x.device)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        with _no_autocast(x):
            o = lazy_attention(q, k, v, self.bias, self.tau)
        return self.wo(o.transpose(1, 2).reshape(B, L, self.n_heads * self.head_dim))


class RMSNorm(nn.RMSNorm):
    """RMSNorm over the last dim computed in fp32 (fp32 weight), returned in the input's dtype."""

    def forward(self, x: Tensor) -> Tensor:
        return nn.functional.rms_norm(x.float(), self.normalized_shape, self.weight, self.eps).to(x.dtype)


class SwiGLU(nn.Module):
    """The MLP sublayer: w2(silu(w1 x) * w3 x); [B, L, dim] -> [B, L, dim]."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.w2(nn.functional.silu(self.w1(x)) * self.w3(x))


def mhc_bias_init(n: int, res_diag: float) -> Tensor:
    """The static mHC logits [n*n + 2n] fp32 at which a model starts as a plain residual network.

    pre: sigmoid = 1/n, so h_in is the mean of the streams; post: sigmoid = 1/2, so h_post = 1
    (post_mult 2) and every stream receives the sublayer output; res: ``res_diag`` on the diagonal,
    0 elsewhere, so h_res = I up to softmax leakage 1 / (exp(res_diag) + n - 1) off the diagonal.
    """
    p = min(1.0 / n, 0.98)
    pre = torch.full((n,), math.log(p / (1.0 - p)))
    post = torch.zeros(n)
    res = torch.eye(n) * res_diag
    return torch.cat([pre, post, res.flatten()]).float()


class MHC(nn.Module):
    """mHC around one sublayer: x [..., n, dim] -> mhc_post(sublayer(h_in), x, h_post, h_res).

    ``mhc_pre`` mixes the n streams into the sublayer input h_in [..., dim]; ``mhc_post`` writes
    h_post * sublayer(h_in) + h_res^T x back into the n streams. Parameters (fp32): phi
    [n*n + 2n, n*dim] ~ N(0, 1/(n*dim)), alpha [3] = ``alpha_init``, bias from
    :func:`mhc_bias_init`, gamma [n*dim] = 1. With a small alpha the fresh layer is close to
    x_o + sublayer(mean_i x_i) for every stream o, a plain residual connection.
    """

    def __init__(self, sublayer: nn.Module, dim: int, n_streams: int, sinkhorn_iters: int = 20,
                 alpha_init: float = 0.01, res_diag: float = 8.0):
        super().__init__()
        if n_streams < 1:
            raise ValueError(f"n_streams: expected >= 1, got {n_streams}")
        n, M = n_streams, n_streams * n_streams + 2 * n_streams
        self.sublayer, self.n_streams, self.sinkhorn_iters = sublayer, n, sinkhorn_iters
        self.phi = nn.Parameter(torch.randn(M, n * dim, dtype=torch.float32) / math.sqrt(n * dim))
        self.alpha = nn.Parameter(torch.full((3,), float(alpha_init), dtype=torch.float32))
        self.bias = nn.Parameter(mhc_bias_init(n, res_diag))
        self.gamma = nn.Parameter(torch.ones(n * dim, dtype=torch.float32))

    def mixings(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(h_in [..., dim] x.dtype, h_post [..., n] fp32, h_res [..., n, n] fp32 [in, out]) of x [..., n, dim]."""
        with _no_autocast(x):
            return mhc_pre(x, self.phi, self.alpha, self.bias, self.gamma, sinkhorn_iters=self.sinkhorn_iters)

    def forward(self, x: Tensor) -> Tensor:
        """x [..., n, dim] -> [..., n, dim] in x's dtype.

        x reaches mhc_post through mhc_pre's residual output, so the backward sums the two
        gradients of x inside the pre backward kernel (no separate pass over [..., n, dim]).
        """
        with _no_autocast(x):
            h_in, h_post, h_res, x_res = mhc_pre(x, self.phi, self.alpha, self.bias, self.gamma,
                                                 sinkhorn_iters=self.sinkhorn_iters, return_residual=True)
        f = self.sublayer(h_in).to(x.dtype)
        with _no_autocast(x):
            return mhc_post(f, x_res, h_post, h_res)


def expand_streams(h: Tensor, n: int) -> Tensor:
    """[..., dim] -> [..., n, dim]: n contiguous copies (the mHC residual streams)."""
    return h.unsqueeze(-2).expand(*h.shape[:-1], n, h.shape[-1]).contiguous()


def collapse_streams(x: Tensor) -> Tensor:
    """[..., n, dim] -> [..., dim]: the mean of the streams (the plain residual stream at init)."""
    return x.mean(dim=-2)


__all__ = ["LazyAttention", "RMSNorm", "SwiGLU", "MHC", "mhc_bias_init", "expand_streams", "collapse_streams",
           "rotary_tables", "apply_rotary"]
