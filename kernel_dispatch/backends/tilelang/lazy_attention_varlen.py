"""TileLang lazy attention over packed documents (SPEC section 4).

q [T, H, D], k, v [T, Hkv, D] fp16/bf16 (any strides: made contiguous), bias [H, W], tau [H] fp32, cu_seqlens
[N + 1] int32. O [T, H, D] in q's dtype, LSE [H, T] fp32 (natural log).

Forward: the fixed-length LSE and output kernels in their packed-documents form (``varlen``,
``_lazy_attention_layout``): a CTA owns (head, document, query block), reads the document's first token and length
from cu_seqlens, covers ``max_seqlen`` rows of the grid and stores only its document's rows. Two launches for any
number of documents, no copies of q, k, v beyond making them contiguous, no host read: capturable in a CUDA graph.

Backward: the three fixed-length backward kernels in their packed form: the row dots dO . O per token, the dQ
sweep with Delta and the dtau terms (it also writes 1/i of every token), then dK, dV with the dbias partials, one
row of partials per (document, key block) (``_lazy_attention_dkdv_kernel``). Three launches, no host read. dbias
and dtau are fixed-order float64 sums of the partials and the per-token terms, then cast: bitwise reproducible.
"""
from __future__ import annotations

import torch

from . import lazy_attention as dense
from ._lazy_attention_layout import ROW_ALIGN


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
    T, H, D = q.shape
    W = bias.shape[1]
    dev = q.device
    N = cu_seqlens.shape[0] - 1
    qc, kc, vc, doc = q.contiguous(), k.contiguous(), v.contiguous(), do.to(q.dtype).contiguous()
    bias32 = bias.to(torch.float32).contiguous()
    tau32 = tau.to(torch.float32).contiguous()
    seqs = cu_seqlens.to(device=dev, dtype=torch.int32).contiguous()
    TP = -(-T // ROW_ALIGN) * ROW_ALIGN  # padded row length: the dK/dV kernel TMA-loads these rows
    new = torch.empty if TP == T else torch.zeros  # with TP == T every column is written before it is read
    if TP == T and lse.dtype == torch.float32 and lse.is_contiguous() and lse.data_ptr() % 16 == 0:
        lse_p = lse  # read only, and TMA-aligned
    else:
        lse_p = torch.zeros(H, TP, dtype=torch.float32, device=dev)
        lse_p[:, :T] = lse
    d0, delta, rdiv = (new(H, TP, dtype=torch.float32, device=dev) for _ in range(3))
    inv_i = new(TP, dtype=torch.float32, device=dev)
    dq, dk, dv = torch.empty_like(qc), torch.empty_like(kc), torch.empty_like(vc)
    block_n = dense.CONFIGS[D]["dkdv"].block_n
    partial = torch.zeros(H, -(-T // block_n) + N, min(W, int(max_seqlen)), dtype=torch.float32, device=dev)
    s, ms = float(scale), int(max_seqlen)
    with torch.cuda.device(dev):
        dense._kernel("row_dot", q, causal, varlen=True)(doc, o.to(q.dtype).contiguous(), d0)
        dense._kernel("dq_delta", q, causal, varlen=True)(qc, kc, vc, doc, bias32, tau32, seqs, lse_p, d0, delta, rdiv,
                                                          inv_i, dq, s, ms)
        dense._kernel("dkdv", q, causal, varlen=True)(qc, kc, vc, doc, bias32, tau32, seqs, lse_p, delta, inv_i, dk,
                                                      dv, partial, s, ms)
    dbias = partial.sum(1, dtype=torch.float64)  # fixed-order sums of the per-(document, key block) partials
    if dbias.shape[1] < W:  # distances >= max_seqlen: no pair of positions in a document is that far apart
        dbias = torch.nn.functional.pad(dbias, (0, W - dbias.shape[1]))
    dtau = rdiv[:, :T].sum(1, dtype=torch.float64)
    return dq, dk, dv, dbias.to(bias.dtype), dtau.to(tau.dtype)
