"""The mask of lazy attention inside transformers: a row layout, not a dense mask.

transformers builds the mask once per forward with the function registered for the attention
implementation (``AttentionMaskInterface``) and hands it unchanged to every attention call. Lazy
attention is causal with positions, distances and the Elastic-Softmax count i measured from each
row's (or document's) first token, so what it needs is, per batch row:

- ``start``, ``end``: the slots [start, end) of the valid keys in the key tensor the attention call
  receives (left padding makes start > 0, right padding end < the row's length; a static cache holds
  unused slots past end);
- ``q_offset``: the slot of the first query (the number of tokens already cached);
- ``documents``: for a packed row (``DataCollatorWithFlattening``), the document index of each query.

:func:`lazy_attention_mask` computes this :class:`RowLayout` from transformers' arguments and returns
it encoded as a small int64 CPU tensor of shape [B, 1, 1, 4 + Lq] (4-D, so that transformers passes it
through untouched when a caller hands it back, as ``generate()`` does with static caches). Anything it
cannot express (padding inside a row, a sliding window that cuts, bidirectional or image-token masks,
a cache that dropped keys) raises :class:`LazyAttentionUnsupportedError` naming what is supported.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import Tensor
from transformers.masking_utils import causal_mask_function

MAGIC = 0x4C617A79  # "Lazy": marks a tensor as a RowLayout, so no foreign 4-D mask is misread as one
HEADER = 4  # MAGIC, start, end, q_offset; then one document index per query

SUPPORTED = ("supported: causal attention over each row's contiguous valid tokens (left and/or right padding), "
             "packed documents without padding (position_ids that restart, or cu_seq_lens_q), and transformers' "
             "dynamic and static caches")


class LazyAttentionUnsupportedError(ValueError):
    """A model, mask or call that kernel-dispatch's lazy attention cannot compute exactly."""


@dataclass(frozen=True)
class RowLayout:
    """Where each batch row's valid keys and queries sit (see the module docstring).

    start, end: per row, the valid key slots [start, end). q_offset: the slot of query 0 (all rows).
    documents: per row, the document index of each of the Lq queries (all 0 unless packed).
    """

    start: tuple[int, ...]
    end: tuple[int, ...]
    q_offset: int
    documents: tuple[tuple[int, ...], ...]

    @property
    def batch(self) -> int:
        return len(self.start)

    @property
    def q_len(self) -> int:
        return len(self.documents[0])

    @property
    def packed(self) -> bool:
        return any(doc[-1] > 0 for doc in self.documents)

    @property
    def padded(self) -> bool:
        full = self.q_offset + self.q_len
        return any(s > 0 or e < full for s, e in zip(self.start, self.end))

    def to_tensor(self) -> Tensor:
        """int64 [B, 1, 1, 4 + Lq] on the CPU: MAGIC, start, end, q_offset, then the document indices."""
        rows = [[MAGIC, s, e, self.q_offset, *doc] for s, e, doc in zip(self.start, self.end, self.documents)]
        return torch.tensor(rows, dtype=torch.int64).view(self.batch, 1, 1, HEADER + self.q_len)

    @classmethod
    def from_tensor(cls, t: Any, batch: int, q_len: int) -> "RowLayout":
        """Decode :meth:`to_tensor`; LazyAttentionUnsupportedError for any other mask."""
        if not is_row_layout(t) or tuple(t.shape) != (batch, 1, 1, HEADER + q_len):
            what = f"a {t.dtype} tensor of shape {list(t.shape)}" if isinstance(t, Tensor) else type(t).__name__
            raise LazyAttentionUnsupportedError(
                f"attention_mask: expected the row layout built by kernel-dispatch's mask function for "
                f"{batch} rows and {q_len} queries, got {what}. Custom 4-D masks are not supported: pass a 2-D "
                f"padding mask (1 = token, 0 = padding); {SUPPORTED}")
        rows = t.reshape(batch, HEADER + q_len).tolist()
        return cls(start=tuple(r[1] for r in rows), end=tuple(r[2] for r in rows), q_offset=rows[0][3],
                   documents=tuple(tuple(r[HEADER:]) for r in rows))


def is_row_layout(t: Any) -> bool:
    return (isinstance(t, Tensor) and t.dtype == torch.int64 and t.dim() == 4 and t.shape[-1] > HEADER
            and t.numel() > 0 and bool((t[..., 0] == MAGIC).all()))


def _padding_rows(attention_mask: Tensor, batch: int, total: int) -> tuple[list[int], list[int]]:
    """start and end of each row's valid tokens in a 2-D padding mask; error if a row has a hole or none."""
    if attention_mask.dim() != 2 or tuple(attention_mask.shape) != (batch, total):
        raise LazyAttentionUnsupportedError(
            f"attention_mask: expected a 2-D padding mask [batch, cached + new tokens] = [{batch}, {total}], got "
            f"shape {list(attention_mask.shape)}; {SUPPORTED}")
    m = attention_mask.detach().to("cpu", torch.bool)
    count = m.sum(1)
    if bool((count == 0).any()):
        row = int((count == 0).nonzero()[0])
        raise LazyAttentionUnsupportedError(f"attention_mask: row {row} has no valid token (all padding)")
    slots = torch.arange(total)
    start = torch.where(m, slots, total).amin(1)
    end = torch.where(m, slots, -1).amax(1) + 1
    holes = (end - start) != count
    if bool(holes.any()):
        row = int(holes.nonzero()[0])
        raise LazyAttentionUnsupportedError(
            f"attention_mask: row {row} has padding between valid tokens (its valid tokens are not contiguous); "
            f"{SUPPORTED}. With a cache, pad prompts on the left (tokenizer.padding_side = 'left')")
    return start.tolist(), end.tolist()


def _probe_documents(mask_function: Callable, batch: int, length: int, device: Any) -> list[list[int]]:
    """Document index of every query of a no-cache, unpadded mask built from ``mask_function``.

    Evaluates the mask function at O(B * L) (query, key) pairs: query j starts a document when it does not
    see j - 1; then j must see itself and its document's first token, not j + 1 and not the token before its
    document. Anything else (a window that cuts, a bidirectional or chunked pattern read as documents only
    where position_ids agree, see the attention call) raises.
    """
    j = torch.arange(length, device=device)
    b = torch.arange(batch, device=device)[:, None]

    def sees(q: Tensor, kv: Tensor) -> Tensor:
        q, kv = torch.broadcast_tensors(q.expand(batch, -1), kv.expand(batch, -1))
        return torch.as_tensor(mask_function(b, 0, q, kv), device=device).expand(batch, q.shape[1])

    first = torch.ones(batch, 1, dtype=torch.bool, device=device)
    new_doc = torch.cat([first, ~sees(j[None, 1:], j[None, 1:] - 1)], 1) if length > 1 else first
    doc_start = torch.cummax(torch.where(new_doc, j, 0), dim=1).values
    ok = sees(j[None], j[None]) & sees(j[None], doc_start)
    if length > 1:
        ok[:, :-1] &= ~sees(j[None, :-1], j[None, 1:])
    before = doc_start - 1
    ok &= (before < 0) | ~sees(j[None], before.clamp(min=0))
    if not bool(ok.all()):
        raise LazyAttentionUnsupportedError(
            "attention mask: the model's mask function is not causal within documents (a sliding window shorter "
            f"than the sequence, a bidirectional, chunked or block pattern); {SUPPORTED}")
    return (new_doc.long().cumsum(1) - 1).cpu().tolist()


def lazy_attention_mask(batch_size: int, q_length: int, kv_length: int, q_offset: Any = 0, kv_offset: int = 0,
                        mask_function: Callable = causal_mask_function, attention_mask: Tensor | None = None,
                        local_size: int | None = None, use_vmap: bool = False, device: Any = "cpu",
                        **_: Any) -> Tensor:
    """transformers' mask function for lazy attention: the :class:`RowLayout` of this forward, as a tensor.

    Args (transformers' ``AttentionMaskInterface`` convention):
        batch_size, q_length: the batch and the number of new tokens (queries).
        kv_length, kv_offset: the key slots the attention call receives (kv_offset must be 0: no cache that
            dropped keys).
        q_offset: the tokens already cached (an int, or a 0-d tensor for static caches).
        mask_function: the pattern (causal; with packed position_ids a per-document causal pattern; with a
            sliding window ``local_size`` the window).
        attention_mask: optional 2-D bool [batch, q_offset + q_length] padding mask, True = token.

    Returns:
        int64 [batch, 1, 1, 4 + q_length] on the CPU (see :class:`RowLayout`).
    """
    q_offset = int(q_offset)
    if kv_offset:
        raise LazyAttentionUnsupportedError(
            f"the cache dropped its first {kv_offset} tokens (a sliding-window cache): lazy attention needs every "
            f"past key; {SUPPORTED}")
    if use_vmap:
        raise LazyAttentionUnsupportedError(
            "the model combines its causal mask with another mask function (or_mask_function / and_mask_function, "
            f"e.g. image tokens); {SUPPORTED}")
    total = q_offset + q_length
    if local_size is not None and total > local_size:
        raise LazyAttentionUnsupportedError(
            f"the model's sliding window of {local_size} tokens cuts into a row of {total} tokens: lazy attention "
            f"has no window (set config.sliding_window = None to attend to the whole past); {SUPPORTED}")
    if attention_mask is None:
        start, end = [0] * batch_size, [total] * batch_size
    else:
        start, end = _padding_rows(attention_mask, batch_size, total)
    no_docs = [[0] * q_length for _ in range(batch_size)]
    if mask_function is causal_mask_function:
        documents = no_docs
    elif attention_mask is None and q_offset == 0 and kv_length == q_length:
        documents = _probe_documents(mask_function, batch_size, q_length, device)
    elif local_size is not None:
        documents = no_docs  # a plain sliding window, and the check above shows that it cannot cut
    else:
        raise LazyAttentionUnsupportedError(f"the model's mask function is not plain causal; {SUPPORTED}")
    return RowLayout(tuple(start), tuple(end), q_offset, tuple(map(tuple, documents))).to_tensor()
