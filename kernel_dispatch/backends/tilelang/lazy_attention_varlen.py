"""TileLang lazy attention over packed documents (SPEC section 4): the lazy attention kernels with their ``varlen``
switch on, launched over a block table.

q [T, H, D], k, v [T, Hkv, D] fp16/bf16 (any strides: made contiguous here), bias [H, W], tau [H] fp32,
cu_seqlens [N + 1] int32. Nothing is padded: each CTA row of a kernel's grid (heads, R, 1) reads one row of a
block table (:func:`block_table`: the document's first token, its length and the block's first position), built
on the device from cu_seqlens without a host read. Loads read whole tiles by TMA (rows past a document belong to
the next one and are masked like padding); stores write only the document's rows. dbias and dtau are fixed-order
sums of per-(document, key block) and per-row partials, so they are bitwise reproducible.
"""
from __future__ import annotations

import functools

import torch

from . import lazy_attention as dense
from ._lazy_attention_dkdv_kernel import ROW_ALIGN


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def block_table(cu_seqlens: torch.Tensor, T: int, block: int, max_seqlen: int, reverse: bool) -> torch.Tensor:
    """[R, 3] int32, R = N + cdiv(T, block): one row (first token, length, first position) per block of ``block``
    positions of each non-empty document, then rows (0, 0, 0) that describe an empty document (their CTAs write
    nothing). R bounds the block count (sum of cdiv(n_d, block) <= N + T // block), so no host read is needed.

    Rows run block position by block position, every document's block at that position together: ascending, or
    descending with ``reverse`` (causal query sweeps: the longest rows start first, as in the fixed-length grids).
    """
    cu = cu_seqlens.to(torch.int64)
    lens = cu[1:] - cu[:-1]
    pos = torch.arange(_cdiv(max_seqlen, block), device=cu.device, dtype=torch.int64) * block
    if reverse:
        pos = pos.flip(0)
    live = pos[:, None] < lens[None, :]  # [positions, documents]
    rows = lens.shape[0] + _cdiv(T, block)
    idx = torch.nonzero_static(live, size=rows, fill_value=0)
    at, doc = idx[:, 0], idx[:, 1]
    table = torch.stack([cu[doc], lens[doc], pos[at]], dim=1)
    used = torch.arange(rows, device=cu.device) < live.sum()  # nonzero_static's rows past the count are fill
    return torch.where(used[:, None], table, 0).to(torch.int32).contiguous()


def inv_i(cu_seqlens: torch.Tensor, T: int, TP: int, causal: bool) -> torch.Tensor:
    """[TP] fp32: 1/i of every token (causal: 1/(its position in its document + 1); else 1/its document's
    length), 0 past T."""
    cu = cu_seqlens.to(torch.int64)
    tok = torch.arange(T, device=cu.device, dtype=torch.int64)
    doc = torch.searchsorted(cu[1:], tok, right=True)
    i = (tok - cu[doc] + 1) if causal else (cu[doc + 1] - cu[doc])
    out = torch.zeros(TP, dtype=torch.float32, device=cu.device)
    out[:T] = 1.0 / i.to(torch.float32)
    return out


def _kernel(name: str, q: torch.Tensor, causal: bool):
    D = q.shape[-1]
    return dense.kernel(name, D, dense.DTYPES[q.dtype], causal, dense.CONFIGS[D][name], q.device, varlen=True)


def _rows(name: str, q: torch.Tensor) -> int:
    """The rows of a CTA of kernel ``name`` (queries, or keys for dkdv)."""
    tiles = dense.CONFIGS[q.shape[-1]][name]
    return tiles.block_n if name == "dkdv" else tiles.block_m


def forward(q, k, v, bias, tau, cu_seqlens, max_seqlen: int, scale: float, causal: bool):
    """O [T, H, D] (q's dtype, contiguous) and LSE [H, T] fp32 (natural log); see SPEC section 4."""
    dense._check(q)
    T, H, D = q.shape
    qc, kc, vc = q.contiguous(), k.contiguous(), v.contiguous()
    bias32 = bias.to(torch.float32).contiguous()
    tau32 = tau.to(torch.float32).contiguous()
    cu = cu_seqlens.to(torch.int32).contiguous()
    tables = {n: block_table(cu, T, _rows(n, q), max_seqlen, reverse=causal) for n in ("lse", "fwd")}
    lse = torch.empty(H, T, dtype=torch.float32, device=q.device)
    o = torch.empty_like(qc)
    with torch.cuda.device(q.device):
        _kernel("lse", q, causal)(qc, kc, bias32, tables["lse"], lse, float(scale))
        _kernel("fwd", q, causal)(qc, kc, vc, bias32, tau32, tables["fwd"], lse, o, float(scale))
    return o, lse


def backward(do, q, k, v, bias, tau, o, lse, cu_seqlens, max_seqlen: int, scale: float, causal: bool):
    """(dq, dk, dv, dbias, dtau), contiguous, in the dtypes of (q, k, v, bias, tau).

    do [T, H, D] (any strides), the forward's inputs and its residuals o [T, H, D] (q's dtype) and lse [H, T].
    """
    dense._check(q)
    T, H, D = q.shape
    W = bias.shape[1]
    dev = q.device
    qc, kc, vc, doc = q.contiguous(), k.contiguous(), v.contiguous(), do.to(q.dtype).contiguous()
    bias32 = bias.to(torch.float32).contiguous()
    tau32 = tau.to(torch.float32).contiguous()
    cu = cu_seqlens.to(torch.int32).contiguous()
    TP = _cdiv(T, ROW_ALIGN) * ROW_ALIGN  # padded row length: the dK/dV kernel TMA-loads these rows
    # with TP == T every column of the row vectors is written before it is read (every token is in a document)
    rows = functools.partial(torch.empty if TP == T else torch.zeros, H, TP, dtype=torch.float32, device=dev)
    if TP == T and lse.dtype == torch.float32 and lse.is_contiguous() and lse.data_ptr() % 16 == 0:
        lse_p = lse  # read only, and TMA-aligned
    else:
        lse_p = rows()
        lse_p[:, :T] = lse
    delta, rdiv = rows(), rows()
    d0 = rows()  # dO . O, the dQ sweep's first estimate of Delta
    q_table = block_table(cu, T, _rows("dq_delta", q), max_seqlen, reverse=causal)
    k_table = block_table(cu, T, _rows("dkdv", q), max_seqlen, reverse=False)
    dk = torch.empty_like(kc)
    dv = torch.empty_like(vc)
    dq = torch.empty_like(qc)
    # one row of dbias partials per (document, key block): no distance reaches the longest document
    partial = torch.zeros(k_table.shape[0], H, 1, min(W, max_seqlen), dtype=torch.float32, device=dev)
    s = float(scale)
    with torch.cuda.device(dev):
        _kernel("row_dot", q, causal)(doc, o.to(q.dtype).contiguous(), d0)
        _kernel("dq_delta", q, causal)(qc, kc, vc, doc, bias32, tau32, q_table, lse_p, d0, delta, rdiv, dq, s)
        _kernel("dkdv", q, causal)(qc, kc, vc, doc, bias32, tau32, k_table, lse_p, delta,
                                   inv_i(cu, T, TP, causal), dk, dv, partial, s)
    dbias = partial.sum((0, 2), dtype=torch.float64)  # fixed-order sums of the per-key-block partials
    if dbias.shape[1] < W:  # distances >= the longest document: no pair of positions is that far apart
        dbias = torch.nn.functional.pad(dbias, (0, W - dbias.shape[1]))
    dtau = rdiv.sum(1, dtype=torch.float64)
    return dq, dk, dv, dbias.to(bias.dtype), dtau.to(tau.dtype)
