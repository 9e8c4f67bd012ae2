"""nn.Module layers built on the operators: LazyAttention (RoPE, GQA, packed documents, a KV cache) and the mHC
wrapper.

Layout: activations are [B, L, dim] (batch, sequence, features), or [T, dim] for documents packed
one after another (see :class:`PackedDocuments`); mHC residual streams are [..., n, dim]. Learnable
operator parameters (attention ``bias``/``tau``, mHC ``phi``/``alpha``/``bias``/``gamma``) are fp32,
as the operators require; activations may be bf16. The operators run
with autocast switched off so that, under ``torch.autocast``, they see the tensors' own dtypes and
their fp32 internal math is not recast (projections and MLPs still autocast).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from .mhc_recompute import StreamRecompute
from .ops import lazy_attention, lazy_attention_with_kvcache, mhc_post, mhc_pre


def _no_autocast(x: Tensor):
    return torch.autocast(x.device.type, enabled=False)


def rotary_at(positions: Tensor, head_dim: int, base: float) -> tuple[Tensor, Tensor]:
    """cos, sin [len(positions), head_dim // 2] fp32 for rotary embeddings at the given integer positions."""
    inv_freq = base ** (-torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim)
    angles = positions.to(torch.float32)[:, None] * inv_freq[None, :]
    return angles.cos(), angles.sin()


def rotary_tables(length: int, head_dim: int, base: float, device: torch.device) -> tuple[Tensor, Tensor]:
    """cos, sin [length, head_dim // 2] fp32 for rotary embeddings (rotate-half convention)."""
    return rotary_at(torch.arange(length, device=device), head_dim, base)


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate x [..., D] by position: pairs (x[..., j], x[..., j + D/2]); fp32 math, x's dtype out.

    cos, sin broadcast against x[..., :D/2]: [L, D/2] for x [B, H, L, D], [T, 1, D/2] for x [T, H, D].
    """
    half = x.shape[-1] // 2
    xf = x.float()
    x1, x2 = xf[..., :half], xf[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)


@dataclass(frozen=True)
class PackedDocuments:
    """Where the documents of a packed [T, ...] input start and end, and each token's position in its document.

    ``cu_seqlens`` int32 [N + 1] (0 = cu[0] <= cu[1] <= ... <= cu[N] = T; document d holds tokens
    cu[d] .. cu[d+1] - 1; empty documents allowed), ``max_seqlen`` the longest document, ``positions``
    int64 [T] (0 at each document's first token). Build one per batch with :meth:`from_cu_seqlens` or
    :meth:`from_document_ids` and pass it to every layer: its checks read the device once.
    """

    cu_seqlens: Tensor
    max_seqlen: int
    positions: Tensor

    @classmethod
    def from_cu_seqlens(cls, cu_seqlens: Tensor, num_tokens: int, max_seqlen: int | None = None) -> PackedDocuments:
        """Check ``cu_seqlens`` (int32 [N + 1]) against ``num_tokens`` = T and derive the positions.

        ``max_seqlen``, if given, must be at least the longest document. Raises TypeError/ValueError
        naming ``cu_seqlens`` or ``max_seqlen``.
        """
        if not isinstance(cu_seqlens, Tensor) or cu_seqlens.dtype != torch.int32 or cu_seqlens.dim() != 1:
            got = f"{cu_seqlens.dtype} {list(cu_seqlens.shape)}" if isinstance(cu_seqlens, Tensor) else type(cu_seqlens)
            raise TypeError(f"cu_seqlens: expected an int32 tensor [N + 1], got {got}")
        if cu_seqlens.numel() < 2:
            raise ValueError(f"cu_seqlens: expected [N + 1] with N >= 1 documents, got {list(cu_seqlens.shape)}")
        lengths = cu_seqlens[1:] - cu_seqlens[:-1]
        first, last, shortest, longest = torch.stack([cu_seqlens[0], cu_seqlens[-1], lengths.min(),
                                                      lengths.max()]).tolist()  # one device-to-host read
        if first != 0 or last != num_tokens or shortest < 0:
            raise ValueError(f"cu_seqlens: expected 0 = cu[0] <= cu[1] <= ... <= cu[N] = T = {num_tokens}, got "
                             f"cu[0] = {first}, cu[N] = {last}, smallest step {shortest}")
        if max_seqlen is not None and (isinstance(max_seqlen, bool) or not isinstance(max_seqlen, int)
                                       or max_seqlen < longest):
            raise ValueError(f"max_seqlen: expected an int >= the longest document ({longest}), got {max_seqlen!r}")
        doc = torch.repeat_interleave(torch.arange(len(lengths), device=cu_seqlens.device), lengths,
                                      output_size=num_tokens)
        positions = torch.arange(num_tokens, device=cu_seqlens.device) - cu_seqlens[doc].long()
        return cls(cu_seqlens, longest if max_seqlen is None else max_seqlen, positions)

    @classmethod
    def from_document_ids(cls, document_ids: Tensor) -> PackedDocuments:
        """Documents from ids [T] (any integer dtype): each maximal run of one id is a document.

        Raises ValueError naming ``document_ids`` if an id comes back after another one (its tokens
        are not contiguous, which the packed layout cannot express).
        """
        if not isinstance(document_ids, Tensor) or document_ids.dim() != 1 or document_ids.is_floating_point():
            raise TypeError("document_ids: expected an integer tensor [T]")
        if document_ids.numel() == 0:
            raise ValueError("document_ids: expected at least one token, got shape [0]")
        runs, counts = torch.unique_consecutive(document_ids, return_counts=True)
        if len(runs) != len(torch.unique(runs)):
            raise ValueError("document_ids: expected the tokens of each document to be contiguous; an id appears "
                             "in two separate runs")
        cu = torch.zeros(len(counts) + 1, dtype=torch.int32, device=document_ids.device)
        cu[1:] = counts.cumsum(0)
        return cls.from_cu_seqlens(cu, document_ids.numel())


class KVCache:
    """The keys and values of every attention layer of a model, for ``batch`` rows of up to ``capacity`` tokens.

    k, v: [n_layers, batch, n_kv_heads, capacity, head_dim]; seqlens [batch] int32: the tokens each row holds.
    A forward pass with the cache appends its new tokens to every layer; :meth:`advance` then moves the rows'
    lengths on (in place, on the device: a CUDA graph replays it). :meth:`rows` views a slice of the rows (a
    prompt prefilled alone into its row of a batch).
    """

    def __init__(self, n_layers: int, batch: int, n_kv_heads: int, head_dim: int, capacity: int,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu"):
        if min(n_layers, batch, n_kv_heads, head_dim, capacity) < 1:
            raise ValueError("KVCache: n_layers, batch, n_kv_heads, head_dim and capacity must all be >= 1")
        shape = (n_layers, batch, n_kv_heads, capacity, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.seqlens = torch.zeros(batch, dtype=torch.int32, device=device)

    @classmethod
    def _view(cls, k: Tensor, v: Tensor, seqlens: Tensor) -> "KVCache":
        view = cls.__new__(cls)
        view.k, view.v, view.seqlens = k, v, seqlens
        return view

    @property
    def capacity(self) -> int:
        return self.k.shape[3]

    def layer(self, i: int) -> "KVCache":
        """Layer i's cache (k, v [1, batch, n_kv_heads, capacity, head_dim] views; the shared lengths)."""
        return self._view(self.k[i:i + 1], self.v[i:i + 1], self.seqlens)

    def rows(self, start: int, stop: int) -> "KVCache":
        """Rows start .. stop - 1 of every layer, as views into this cache."""
        return self._view(self.k[:, start:stop], self.v[:, start:stop], self.seqlens[start:stop])

    def advance(self, n: int | Tensor) -> None:
        """Count ``n`` more tokens in every row (in place)."""
        self.seqlens += n


class LazyAttention(nn.Module):
    """Causal self-attention through :func:`kernel_dispatch.lazy_attention`, or over packed documents
    through ``kernel_dispatch.ops.lazy_attention_varlen``.

    q/k/v/o projections without bias, rotary embeddings on q and k, grouped-query attention
    (``n_kv_heads`` divides ``n_heads``), a learnable distance bias [n_heads, max_bias_length]
    (fp32, zeros) and Elastic-Softmax offsets tau [n_heads] (fp32, ``tau_init``).
    Input and output: [B, L, dim], or [T, dim] with the documents' boundaries (see :meth:`forward`).
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

    def forward(self, x: Tensor, *, cu_seqlens: Tensor | None = None, max_seqlen: int | None = None,
                document_ids: Tensor | None = None, documents: PackedDocuments | None = None,
                cache: KVCache | None = None) -> Tensor:
        """x [B, L, dim] -> [B, L, dim]; or packed x [T, dim] -> [T, dim] with one of

        - ``cu_seqlens`` int32 [N + 1] (and optionally ``max_seqlen``, the longest document),
        - ``document_ids`` [T] (each run of one id is a document),
        - ``documents``: a :class:`PackedDocuments` built once for all layers.

        In the packed form no token attends to another document, and rotary positions, the bias
        distance and i = m + 1 count from each document's first token.

        With ``cache`` (this layer's :meth:`KVCache.layer`; inference, nothing may require grad), x [B, Lq, dim]
        holds each row's next Lq tokens, at positions seqlens[b] .. seqlens[b] + Lq - 1: their keys and values are
        appended to the cache and they attend over everything the row holds (the caller advances the lengths).
        """
        if cache is not None:
            return self._cached(x, cache)
        given = [name for name, v in (("cu_seqlens", cu_seqlens), ("document_ids", document_ids),
                                      ("documents", documents)) if v is not None]
        if len(given) > 1:
            raise ValueError(f"{given[1]}: give one of cu_seqlens, document_ids, documents; got {', '.join(given)}")
        if max_seqlen is not None and cu_seqlens is None:
            raise ValueError("max_seqlen: only meaningful with cu_seqlens")
        if given:
            return self._packed(x, cu_seqlens, max_seqlen, document_ids, documents)
        if x.dim() != 3:
            raise ValueError(f"x: expected [B, L, dim] (or [T, dim] with cu_seqlens), got {list(x.shape)}")
        B, L, _ = x.shape
        q = self.wq(x).view(B, L, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(B, L, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(B, L, self.n_kv_heads, self.head_dim).transpose(1, 2)
        cos, sin = rotary_tables(L, self.head_dim, self.rope_base, x.device)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        with _no_autocast(x):
            o = lazy_attention(q, k, v, self.bias, self.tau)
        return self.wo(o.transpose(1, 2).reshape(B, L, self.n_heads * self.head_dim))

    def _cached(self, x: Tensor, cache: KVCache) -> Tensor:
        if x.dim() != 3:
            raise ValueError(f"x: expected [B, Lq, dim] with a cache, got {list(x.shape)}")
        B, Lq, _ = x.shape
        q = self.wq(x).view(B, Lq, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(B, Lq, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(B, Lq, self.n_kv_heads, self.head_dim).transpose(1, 2)
        positions = cache.seqlens.long()[:, None] + torch.arange(Lq, device=x.device)  # [B, Lq]
        cos, sin = (t.view(B, 1, Lq, -1) for t in rotary_at(positions.flatten(), self.head_dim, self.rope_base))
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        with _no_autocast(x):
            o = lazy_attention_with_kvcache(q, cache.k[0], cache.v[0], self.bias, self.tau, cache.seqlens,
                                            k=k.to(cache.k.dtype), v=v.to(cache.v.dtype))
        return self.wo(o.transpose(1, 2).reshape(B, Lq, self.n_heads * self.head_dim))

    def _packed(self, x: Tensor, cu_seqlens, max_seqlen, document_ids, documents) -> Tensor:
        from .ops.lazy_attention_varlen import lazy_attention_varlen

        if x.dim() != 2:
            raise ValueError(f"x: expected packed tokens [T, dim] with cu_seqlens/document_ids/documents, "
                             f"got {list(x.shape)}")
        T = x.shape[0]
        if documents is None:
            documents = (PackedDocuments.from_document_ids(document_ids) if document_ids is not None
                         else PackedDocuments.from_cu_seqlens(cu_seqlens, T, max_seqlen))
        elif documents.positions.shape != (T,):
            raise ValueError(f"documents: its positions cover {documents.positions.shape[0]} tokens, x has {T}")
        if documents.cu_seqlens.device != x.device:
            raise ValueError(f"cu_seqlens: expected x's device {x.device}, got {documents.cu_seqlens.device}")
        q = self.wq(x).view(T, self.n_heads, self.head_dim)
        k = self.wk(x).view(T, self.n_kv_heads, self.head_dim)
        v = self.wv(x).view(T, self.n_kv_heads, self.head_dim)
        cos, sin = rotary_at(documents.positions, self.head_dim, self.rope_base)
        q, k = apply_rotary(q, cos[:, None], sin[:, None]), apply_rotary(k, cos[:, None], sin[:, None])
        with _no_autocast(x):
            o = lazy_attention_varlen(q, k, v, self.bias, self.tau, documents.cu_seqlens,
                                      max_seqlen=documents.max_seqlen)
        return self.wo(o.reshape(T, self.n_heads * self.head_dim))


class RMSNorm(nn.RMSNorm):
    """RMSNorm over the last dim computed in fp32 (fp32 weight), returned in the input's dtype."""

    def forward(self, x: Tensor) -> Tensor:
        return nn.functional.rms_norm(x.float(), self.normalized_shape, self.weight, self.eps).to(x.dtype)


class PreNorm(nn.Sequential):
    """``layer(norm(x), *args, **kwargs)``: a Sequential of two whose extra arguments reach the layer."""

    def __init__(self, norm: nn.Module, layer: nn.Module):
        super().__init__(norm, layer)

    def forward(self, x: Tensor, *args, **kwargs) -> Tensor:
        return self[1](self[0](x), *args, **kwargs)


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

    def pre(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """(h_in, h_post, h_res, x_res): :meth:`mixings` plus x itself for :meth:`post` (mhc_pre's residual
        output, through which the backward sums both gradients of x inside the pre backward kernel)."""
        with _no_autocast(x):
            return mhc_pre(x, self.phi, self.alpha, self.bias, self.gamma, sinkhorn_iters=self.sinkhorn_iters,
                           return_residual=True)

    def post(self, f: Tensor, x_res: Tensor, h_post: Tensor, h_res: Tensor) -> Tensor:
        """The new streams [..., n, dim]: h_post * f + h_res^T x (mhc_post), in x's dtype."""
        with _no_autocast(x_res):
            return mhc_post(f, x_res, h_post, h_res)

    def forward(self, x: Tensor, *args, recompute: StreamRecompute | None = None, **kwargs) -> Tensor:
        """x [..., n, dim] -> [..., n, dim] in x's dtype; ``args``/``kwargs`` go to the sublayer.

        ``recompute``: a :class:`kernel_dispatch.mhc_recompute.StreamRecompute` shared by consecutive
        wrappers: the input streams are then rebuilt in the backward instead of kept (same gradients,
        bitwise). Ignored outside autograd.
        """
        if recompute is not None and torch.is_grad_enabled():
            return recompute(self, x, *args, **kwargs)
        h_in, h_post, h_res, x_res = self.pre(x)
        f = self.sublayer(h_in, *args, **kwargs).to(x.dtype)
        return self.post(f, x_res, h_post, h_res)


def expand_streams(h: Tensor, n: int) -> Tensor:
    """[..., dim] -> [..., n, dim]: n contiguous copies (the mHC residual streams)."""
    return h.unsqueeze(-2).expand(*h.shape[:-1], n, h.shape[-1]).contiguous()


def collapse_streams(x: Tensor) -> Tensor:
    """[..., n, dim] -> [..., dim]: the mean of the streams (the plain residual stream at init)."""
    return x.mean(dim=-2)


__all__ = ["LazyAttention", "KVCache", "PackedDocuments", "RMSNorm", "PreNorm", "SwiGLU", "MHC", "StreamRecompute",
           "mhc_bias_init", "expand_streams", "collapse_streams", "rotary_tables", "rotary_at", "apply_rotary"]
