"""Lazy attention as a transformers attention implementation.

:func:`lazy_attention_forward` is registered in transformers' ``AttentionInterface`` under
:data:`ATTN_IMPLEMENTATION`, beside its mask function (``transformers_mask.lazy_attention_mask``). Every
attention module that calls ``ALL_ATTENTION_FUNCTIONS`` (Llama, Qwen3, Mistral and the other decoder
models written the same way) reaches it with q [B, H, Lq, D] and k, v [B, Hkv, Lkv, D] (Lkv includes
what a cache holds) and the row layout of the forward; the module carries the learnable bias [H, W] and
tau [H] in a child ``lazy_attention`` (:class:`LazyAttentionParameters`). Which operator runs:

- packed documents (position_ids that restart, or ``cu_seq_lens_q``): ``kd.lazy_attention_varlen``;
- no cached tokens (training, a prompt's prefill): ``kd.lazy_attention``, padded rows shifted so that
  each row's tokens start at slot 0 (``lengths`` masks the rest);
- cached tokens (``generate()`` with a dynamic or static cache): ``kd.lazy_attention_with_kvcache``
  with the new queries bottom-right aligned over each row's valid keys; with gradients enabled,
  ``kd.lazy_attention`` over the whole row instead (that operator is forward only).
"""
from __future__ import annotations

import dataclasses
import math
import weakref
from typing import Any, Mapping

import torch
from torch import Tensor, nn

from .. import ops
from .transformers_mask import SUPPORTED, LazyAttentionUnsupportedError, RowLayout

ATTN_IMPLEMENTATION = "kernel_dispatch_lazy"
PARAMS = "lazy_attention"  # the child module of each attention module that holds bias and tau
OPERATORS = ("lazy_attention", "lazy_attention_varlen", "lazy_attention_with_kvcache")


class LazyAttentionParameters(nn.Module):
    """The learnable lazy-attention parameters of one attention module.

    bias: [H, W] fp32, added to the score of a query and a key at causal distance t < W (zeros at start).
    tau: [H] fp32, the Elastic-Softmax offset (``tau_init`` at start).
    backend: the kernel-dispatch backend choice for this module's calls (None: the usual selection),
        a name, a (forward, backward) pair, or a mapping from operator name to either.

    ``model.to(torch.bfloat16)`` (or ``.half()``) leaves bias and tau in fp32, as the operators require;
    devices follow the model, and float64 (a float64 reference model) is kept.
    """

    def __init__(self, num_heads: int, window: int, tau_init: float, device: Any = None,
                 backend: Any = None) -> None:
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(num_heads, window, dtype=torch.float32, device=device))
        self.tau = nn.Parameter(torch.full((num_heads,), float(tau_init), dtype=torch.float32, device=device))
        self.backend = backend

    def _apply(self, fn, recurse: bool = True):
        def keep_fp32(t: Tensor) -> Tensor:
            out = fn(t)
            return out.float() if out.dtype in (torch.float16, torch.bfloat16) and t.dtype == torch.float32 else out

        return super()._apply(keep_fp32, recurse)

    def backend_for(self, op: str) -> Any:
        if isinstance(self.backend, Mapping):
            return self.backend.get(op)
        return self.backend

    def extra_repr(self) -> str:
        heads, window = self.bias.shape
        return f"heads={heads}, window={window}, backend={self.backend!r}"


def _check_call(module: nn.Module, dropout: float, kwargs: dict, rows: RowLayout) -> None:
    if dropout:
        raise LazyAttentionUnsupportedError(
            f"dropout: lazy attention has no attention dropout, got {dropout} (set config.attention_dropout = 0.0)")
    for name in ("softcap", "s_aux", "sinks"):
        if kwargs.get(name) is not None:
            raise LazyAttentionUnsupportedError(f"{name}: not supported by lazy attention; {SUPPORTED}")
    if kwargs.get("is_causal", getattr(module, "is_causal", True)) is False:
        raise LazyAttentionUnsupportedError(f"is_causal=False: lazy attention here is causal; {SUPPORTED}")
    window = kwargs.get("sliding_window")
    if window is not None and rows.q_offset + rows.q_len > window:
        raise LazyAttentionUnsupportedError(
            f"sliding_window: the window of {window} tokens cuts into a row of {rows.q_offset + rows.q_len} "
            f"tokens; lazy attention has no window (set config.sliding_window = None); {SUPPORTED}")


_last_documents: list = [None, -1, None]  # (weak reference to a position_ids tensor, its version, its documents)


def _documents_from_positions(position_ids: Tensor, batch: int, length: int) -> tuple[tuple[int, ...], ...]:
    """Document index of each token: a new document wherever position_ids does not grow by 1 (transformers' rule).

    One device-to-host read per position_ids tensor, which every layer of a forward shares.
    """
    ref, version, cached = _last_documents
    if (ref is None or ref() is not position_ids or version != position_ids._version or len(cached) != batch
            or len(cached[0]) != length):
        pos = position_ids.detach().expand(batch, length)
        new = torch.ones(batch, length, dtype=torch.bool, device=pos.device)
        new[:, 1:] = pos[:, 1:] - pos[:, :-1] != 1
        cached = tuple(map(tuple, (new.long().cumsum(1) - 1).tolist()))
        _last_documents[:] = [weakref.ref(position_ids), position_ids._version, cached]
    return cached


def _with_documents(rows: RowLayout, kwargs: dict) -> RowLayout:
    """rows with the packed documents of position_ids where the mask could not show them (a cache object
    disables transformers' packed masks, ``use_cache=True`` in a training forward)."""
    position_ids = kwargs.get("position_ids")
    if rows.q_offset or rows.padded or not isinstance(position_ids, Tensor) or position_ids.dim() != 2:
        return rows
    documents = _documents_from_positions(position_ids, rows.batch, rows.q_len)
    if rows.packed and documents != rows.documents:
        raise LazyAttentionUnsupportedError(
            "position_ids: its documents disagree with the model's attention mask (a chunked or block pattern); "
            f"{SUPPORTED}")
    return dataclasses.replace(rows, documents=documents)


def _shift(x: Tensor, offset: Tensor) -> Tensor:
    """out[b, :, t] = x[b, :, (t + offset[b]) % L] for x [B, heads, L, D] and offset [B] (a per-row roll)."""
    B, heads, L, D = x.shape
    idx = (torch.arange(L, device=x.device) + offset[:, None]) % L
    return x.gather(2, idx[:, None, :, None].expand(B, heads, L, D))


def _cu_seqlens(rows: RowLayout, kwargs: dict, device: torch.device) -> tuple[Tensor, int]:
    """cu_seqlens of the packed documents over the B * Lq flattened tokens, and the longest document."""
    if rows.q_offset or rows.padded:
        raise LazyAttentionUnsupportedError(
            f"packed documents: expected no cache and no padding (q_offset {rows.q_offset}, padded {rows.padded}); "
            f"{SUPPORTED}")
    L = rows.q_len
    bounds = [0]
    for b, doc in enumerate(rows.documents):
        bounds += [b * L + j for j in range(1, L) if doc[j] != doc[j - 1]] + [(b + 1) * L]
    given = kwargs.get("cu_seq_lens_q")
    if given is not None:
        k_given = kwargs.get("cu_seq_lens_k")
        if k_given is not None and not torch.equal(k_given.to(given.device), given):
            raise LazyAttentionUnsupportedError("cu_seq_lens_k: expected the same documents as cu_seq_lens_q")
        given_list = given.tolist()
        if rows.packed and given_list != bounds:
            raise LazyAttentionUnsupportedError(
                f"cu_seq_lens_q: {given_list} disagrees with the documents of position_ids {bounds}")
        if given_list[0] != 0 or given_list[-1] != rows.batch * L:
            raise LazyAttentionUnsupportedError(
                f"cu_seq_lens_q: expected 0 ... {rows.batch * L} (the batch's flattened tokens), got {given_list}")
        bounds = given_list
    max_len = max(b - a for a, b in zip(bounds[:-1], bounds[1:]))
    return torch.tensor(bounds, dtype=torch.int32, device=device), max_len


def _varlen(q, k, v, bias, tau, scale, rows, kwargs, backend) -> Tensor:
    B, H, L, D = q.shape
    cu, max_len = _cu_seqlens(rows, kwargs, q.device)
    if k.shape[2] != L:
        k, v = k[:, :, :L], v[:, :, :L]
    flat = [t.transpose(1, 2).reshape(B * L, t.shape[1], D) for t in (q, k, v)]
    o = ops.lazy_attention_varlen(*flat, bias, tau, cu, max_seqlen=max_len, scale=scale, backend=backend)
    return o.view(B, L, H, D)


def _prefill(q, k, v, bias, tau, scale, rows, backend) -> Tensor:
    """No cached tokens: the rows' valid tokens moved to slot 0, causal lazy attention with lengths."""
    L = q.shape[2]
    k, v = k[:, :, :L], v[:, :, :L]  # a static cache's unused slots
    if not rows.padded:
        return ops.lazy_attention(q, k, v, bias, tau, scale=scale, backend=backend).transpose(1, 2)
    lengths = torch.tensor([e - s for s, e in zip(rows.start, rows.end)], dtype=torch.int32, device=q.device)
    if not any(rows.start):  # right padding only
        return ops.lazy_attention(q, k, v, bias, tau, scale=scale, lengths=lengths, backend=backend).transpose(1, 2)
    start = torch.tensor(rows.start, device=q.device)
    q, k, v = (_shift(t, start) for t in (q, k, v))
    o = ops.lazy_attention(q, k, v, bias, tau, scale=scale, lengths=lengths, backend=backend)
    return _shift(o, -start).transpose(1, 2)  # rows past a row's tokens are zero and land on its padding


def _cached(q, k, v, bias, tau, scale, rows, backend_kv, backend_train) -> Tensor:
    """Queries at slots q_offset .. q_offset + Lq - 1, the newest of each row; keys [start, end) valid."""
    Lq = q.shape[2]
    newest = rows.q_offset + Lq
    for b, (s, e) in enumerate(zip(rows.start, rows.end)):
        if e != newest or s > rows.q_offset:
            raise LazyAttentionUnsupportedError(
                f"attention_mask: row {b} has valid tokens [{s}, {e}) but the new queries sit at "
                f"[{rows.q_offset}, {newest}): with a cache the new tokens must be the newest valid tokens of "
                f"every row; {SUPPORTED}")
    n = [e - s for s, e in zip(rows.start, rows.end)]
    if any(rows.start):
        start = torch.tensor(rows.start, device=q.device)
        k, v = _shift(k, start), _shift(v, start)
    k, v = k[:, :, :max(n)], v[:, :, :max(n)]
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v, bias, tau))
    if not grad:
        seqlens = torch.tensor(n, dtype=torch.int32, device=q.device)
        o = ops.lazy_attention_with_kvcache(q, k, v, bias.detach(), tau.detach(), seqlens, scale=scale,
                                            backend=backend_kv)
        return o.transpose(1, 2)
    # With gradients: every row's queries placed at its last Lq positions of a causal call over its n_b tokens.
    B, H, _, D = q.shape
    N = max(n)
    pos = torch.tensor(n, device=q.device)[:, None] - Lq + torch.arange(Lq, device=q.device)  # [B, Lq]
    index = pos[:, None, :, None].expand(B, H, Lq, D)
    q_full = q.new_zeros(B, H, N, D).scatter(2, index, q)
    lengths = torch.tensor(n, dtype=torch.int32, device=q.device)
    o = ops.lazy_attention(q_full, k, v, bias, tau, scale=scale, lengths=lengths, backend=backend_train)
    return o.gather(2, index).transpose(1, 2)


@torch.compiler.disable  # host-side layout logic: compiled models (generate()'s static-cache compile) break here
def lazy_attention_forward(module: nn.Module, query: Tensor, key: Tensor, value: Tensor,
                           attention_mask: Tensor | None, scaling: float | None = None, dropout: float = 0.0,
                           **kwargs: Any) -> tuple[Tensor, None]:
    """transformers' attention-function signature, computed by kernel-dispatch's lazy attention.

    Args:
        module: the attention module; its ``lazy_attention`` child holds bias [H, W] and tau [H].
        query: [B, H, Lq, D]; key, value: [B, Hkv, Lkv, D] (Lkv includes what a cache holds), one dtype.
        attention_mask: the row layout built by the registered mask function (None: no cache, no padding).
        scaling: the score scale (default 1 / sqrt(D)). dropout: must be 0.
        kwargs: position_ids, cu_seq_lens_q / cu_seq_lens_k (packed documents), sliding_window, ...

    Returns:
        (output [B, Lq, H, D] in query's dtype, None): no attention weights.
    """
    params = getattr(module, PARAMS, None)
    if not isinstance(params, LazyAttentionParameters):
        raise LazyAttentionUnsupportedError(
            f"{type(module).__name__} (layer {getattr(module, 'layer_idx', '?')}) has no lazy attention "
            "parameters: call kernel_dispatch.integrations.transformers.add_lazy_attention(model) first")
    B, _, Lq, _ = query.shape
    if attention_mask is None and key.shape[2] == Lq:
        rows = RowLayout((0,) * B, (Lq,) * B, 0, ((0,) * Lq,) * B)
    else:
        rows = RowLayout.from_tensor(attention_mask, B, Lq)
    rows = _with_documents(rows, kwargs)
    _check_call(module, dropout, kwargs, rows)
    scale = 1.0 / math.sqrt(query.shape[-1]) if scaling is None else float(scaling)
    param_dtype = torch.float64 if query.dtype == torch.float64 else torch.float32
    bias, tau = params.bias.to(param_dtype), params.tau.to(param_dtype)
    if rows.packed or kwargs.get("cu_seq_lens_q") is not None:
        o = _varlen(query, key, value, bias, tau, scale, rows, kwargs, params.backend_for("lazy_attention_varlen"))
    elif rows.q_offset == 0:
        o = _prefill(query, key, value, bias, tau, scale, rows, params.backend_for("lazy_attention"))
    else:
        o = _cached(query, key, value, bias, tau, scale, rows, params.backend_for("lazy_attention_with_kvcache"),
                    params.backend_for("lazy_attention"))
    return o.contiguous(), None
