"""TileLang lazy attention over packed documents (SPEC section 4): the fixed-length TileLang kernels
(:mod:`.lazy_attention`), one dense batch per distinct document length.

q [T, H, D], k, v [T, Hkv, D] fp16/bf16 (any strides), bias [H, W], tau [H] fp32, cu_seqlens [N + 1] int32.
The documents of each length L form one dense batch [B_L, H, L, D] (a view of the packed rows where they are
consecutive, else gathered by token index) and run through the fixed-length ``forward`` / ``backward`` with
lengths=None (no padding, so no lengths), ascending in L; the results are written back to the packed rows
(golden's per-length driver, :func:`kernel_dispatch.golden.lazy_attention_varlen.forward_by_length`). O [T, H, D] in q's dtype, LSE [H, T] fp32
(natural log). dbias and dtau sum the per-length results in ascending length in float64, then are cast: bitwise
reproducible.

Cost: one set of dense launches (forward: 2 kernels, backward: 3) per distinct document length, plus the gathers
and scatters: documents of one length that follow each other in the packed tensor (every document, when all have
one length) are read as a view and written back by one strided copy, others are gathered by token index; the dense
launchers then make the [B_L, H, L, D] views contiguous. The groups come from a host read of cu_seqlens
(``max_seqlen`` is not used), so a call waits for the device and cannot be captured in a CUDA graph, as with golden.
"""
from __future__ import annotations

import torch

from ...golden.lazy_attention_varlen import backward_by_length, forward_by_length
from . import lazy_attention as dense


def forward(q, k, v, bias, tau, cu_seqlens, max_seqlen: int, scale: float, causal: bool):
    """O [T, H, D] (q's dtype, contiguous) and LSE [H, T] fp32 (natural log); see SPEC section 4."""
    dense._check(q)
    return forward_by_length(dense, q, k, v, bias, tau, cu_seqlens, scale, causal, torch.float32)


def backward(do, q, k, v, bias, tau, o, lse, cu_seqlens, max_seqlen: int, scale: float, causal: bool):
    """(dq, dk, dv, dbias, dtau), contiguous, in the dtypes of (q, k, v, bias, tau).

    do [T, H, D] (any strides), the forward's inputs and its residuals o [T, H, D] (q's dtype) and lse [H, T].
    """
    dense._check(q)
    return backward_by_length(dense, do, q, k, v, bias, tau, o, lse, cu_seqlens, scale, causal, torch.float64)
