"""Lazy attention over packed documents in plain PyTorch (SPEC section 4), forward and closed-form backward.

Layout (FlashAttention's varlen layout): q [T, H, D]; k, v [T, Hkv, D]; cu_seqlens int32 [N + 1]
with document d at tokens cu_seqlens[d] .. cu_seqlens[d + 1] - 1; bias [H, W]; tau [H].
Each document is section 1 with B = 1: this module runs :mod:`.lazy_attention` on the documents,
one call per distinct document length (documents of equal length are one batch), so memory is
O(sum of L_d^2), never O(T^2). O is returned in q's dtype, LSE as [H, T] in float32 (float64 for
float64 q). dbias and dtau sum over documents.

:func:`forward_by_length` and :func:`backward_by_length` are that per-length driver for any module with the
dense signatures ``forward(q, k, v, bias, tau, scale, lengths, causal)`` and ``backward(do, q, k, v, bias, tau,
o, lse, scale, lengths, causal)``. They read cu_seqlens on the host.
"""
from __future__ import annotations

import torch

from . import lazy_attention as dense
from ._common import compute_dtype


class _Group:
    """The non-empty documents of one length L: their token indices [B_L, L], or, when they are consecutive in the
    packed tensor (the uniform case: every document of one length), the token range they fill, read as a view."""

    def __init__(self, length: int, starts: list[int], device: torch.device):
        self.length, self.count = length, len(starts)
        consecutive = all(b - a == length for a, b in zip(starts, starts[1:]))
        self.range = (starts[0], starts[0] + length * len(starts)) if consecutive else None
        self.idx = None if consecutive else (torch.tensor(starts, device=device)[:, None]
                                             + torch.arange(length, device=device)[None, :])

    def _tokens(self, t: torch.Tensor, dim: int) -> torch.Tensor:
        """The group's tokens of t along ``dim`` (T there) as [..., B_L, L, ...]: a view, or a gathered copy."""
        if self.range is None:
            return t[(slice(None),) * dim + (self.idx,)]
        return t.narrow(dim, self.range[0], self.range[1] - self.range[0]).unflatten(dim, (self.count, self.length))

    def _put(self, full: torch.Tensor, part: torch.Tensor, dim: int) -> None:
        """Writes part, laid out as :meth:`_tokens` returns it, into the group's tokens of full along ``dim``."""
        if self.range is None:
            full[(slice(None),) * dim + (self.idx,)] = part
        else:
            self._tokens(full, dim).copy_(part)

    def dense(self, t: torch.Tensor) -> torch.Tensor:
        """Tokens of t [T, heads, D] as the dense layout [B_L, heads, L, D] (a view for consecutive documents)."""
        return self._tokens(t, 0).transpose(1, 2)

    def put(self, full: torch.Tensor, part: torch.Tensor) -> None:
        """Writes part [B_L, heads, L, D] into the group's tokens of full [T, heads, D]."""
        self._put(full, part.transpose(1, 2), 0)

    def lse_rows(self, lse: torch.Tensor) -> torch.Tensor:
        """The group's columns of lse [H, T] as [B_L, H, L]."""
        return self._tokens(lse, 1).transpose(0, 1)

    def put_lse(self, lse: torch.Tensor, part: torch.Tensor) -> None:
        """Writes part [B_L, H, L] into the group's columns of lse [H, T]."""
        self._put(lse, part.transpose(0, 1), 1)


def _groups(cu_seqlens: torch.Tensor) -> list[_Group]:
    """The non-empty documents grouped by length, ascending."""
    cu = cu_seqlens.tolist()
    by_length: dict[int, list[int]] = {}
    for start, end in zip(cu[:-1], cu[1:]):
        if end > start:
            by_length.setdefault(end - start, []).append(start)
    return [_Group(length, starts, cu_seqlens.device) for length, starts in sorted(by_length.items())]


def forward_by_length(module, q, k, v, bias, tau, cu_seqlens, scale: float, causal: bool, lse_dtype: torch.dtype):
    """O [T, H, D] (q's dtype, contiguous) and LSE [H, T] (``lse_dtype``): ``module.forward`` once per distinct
    document length, on those documents as one dense batch [B_L, H, L, D] with lengths=None, in ascending length."""
    T, H, D = q.shape
    o = q.new_empty(q.shape)  # cu_seqlens partitions [0, T): the groups write every token
    lse = torch.empty(H, T, dtype=lse_dtype, device=q.device)
    for grp in _groups(cu_seqlens):
        o_g, lse_g = module.forward(grp.dense(q), grp.dense(k), grp.dense(v), bias, tau, scale, None, causal)
        grp.put(o, o_g)
        grp.put_lse(lse, lse_g)
    return o, lse


def backward_by_length(module, do, q, k, v, bias, tau, o, lse, cu_seqlens, scale: float, causal: bool,
                       acc_dtype: torch.dtype):
    """(dq, dk, dv, dbias, dtau), contiguous, in the dtypes of (q, k, v, bias, tau): ``module.backward`` once per
    distinct document length, as :func:`forward_by_length` groups them; dbias and dtau sum over the lengths in
    ascending order in ``acc_dtype``, then are cast (the same inputs give the same bits)."""
    dq, dk, dv = q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)  # every token written
    dbias = torch.zeros(bias.shape, dtype=acc_dtype, device=q.device)
    dtau = torch.zeros(tau.shape, dtype=acc_dtype, device=q.device)
    for grp in _groups(cu_seqlens):
        grads = module.backward(grp.dense(do), grp.dense(q), grp.dense(k), grp.dense(v), bias, tau, grp.dense(o),
                                grp.lse_rows(lse), scale, None, causal)
        for full, part in zip((dq, dk, dv), grads[:3]):
            grp.put(full, part)
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
