"""TileLang lazy attention over packed documents (SPEC section 4).

q [T, H, D], k, v [T, Hkv, D] fp16/bf16 (any strides: made contiguous), bias [H, W], tau [H] fp32, cu_seqlens
[N + 1] int32. O [T, H, D] in q's dtype, LSE [H, T] fp32 (natural log).

Forward: the fixed-length LSE and output kernels in their packed-documents form (``varlen``,
``_lazy_attention_layout``): a CTA owns (head, document, query block), reads the document's first token and length
from cu_seqlens, covers ``max_seqlen`` rows of the grid and stores only its document's rows. Two launches for any
number of documents, no copies of q, k, v beyond making them contiguous, no host read: capturable in a CUDA graph.

Backward: the fixed-length kernels once per distinct document length, on those documents as one dense batch
[B_L, H, L, D] (golden's per-length driver, :func:`kernel_dispatch.golden.lazy_attention_varlen.backward_by_length`):
documents of one length that follow each other in the packed tensor are read as a view and written back by one
strided copy, others are gathered by token index; the groups come from a host read of cu_seqlens. dbias and dtau
sum the per-length results in ascending length in float64, then are cast: bitwise reproducible.
"""
from __future__ import annotations

import torch

from ...golden.lazy_attention_varlen import backward_by_length
from . import lazy_attention as dense


def forward(q, k, v, bias, tau, cu_seqlens, max_seqlen: int, scale: float, causal: bool):
    """O [T, H, D] (q's dtype, contiguous) and LSE [H, T] fp32 (natural log); see SPEC section 4.

    ``max_seqlen`` must be at least the longest document (the front end checks it): the grid covers that many rows
    per document.
    """
    dense._check(q)
    T, H, _ = q.shape
    qc, kc, vc = q.contiguous(), k.contiguous(), v.contiguous()
    bias32 = bias.to(torch.float32).contiguous()
    tau32 = tau.to(torch.float32).contiguous()
    seqs = cu_seqlens.to(device=q.device, dtype=torch.int32).contiguous()
    lse = torch.empty(H, T, dtype=torch.float32, device=q.device)
    o = torch.empty_like(qc)
    with torch.cuda.device(q.device):
        dense._kernel("lse", q, causal, varlen=True)(qc, kc, bias32, seqs, lse, float(scale), int(max_seqlen))
        dense._kernel("fwd", q, causal, varlen=True)(qc, kc, vc, bias32, tau32, seqs, lse, o, float(scale),
                                                     int(max_seqlen))
    return o, lse


def backward(do, q, k, v, bias, tau, o, lse, cu_seqlens, max_seqlen: int, scale: float, causal: bool):
    """(dq, dk, dv, dbias, dtau), contiguous, in the dtypes of (q, k, v, bias, tau).

    do [T, H, D] (any strides), the forward's inputs and its residuals o [T, H, D] (q's dtype) and lse [H, T].
    """
    dense._check(q)
    return backward_by_length(dense, do, q, k, v, bias, tau, o, lse, cu_seqlens, scale, causal, torch.float64)
