"""The per-length driver of lazy_attention_varlen (``golden.lazy_attention_varlen.forward_by_length`` /
``backward_by_length``), on the CPU.

- With golden's dense module it is golden varlen, bit for bit and dtype for dtype (LSE float64 for float64 q),
  and each distinct document length is one dense call whose rows land on that length's documents.
Cases: one document, empty documents, documents of one length, a one-token document; documents of one length next
to each other (read as a view) and apart (gathered by index); GQA; causal and not.
"""
from __future__ import annotations

import pytest
import torch

from kernel_dispatch.golden import lazy_attention as dense
from kernel_dispatch.golden import lazy_attention_varlen as varlen
from kernel_dispatch.ops.lazy_attention_varlen_cases import cu_seqlens_of

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py

DOCS = [(7,), (0, 3, 0, 3, 5, 1, 0), (4, 4, 4), (1,), (2, 9, 2, 6, 9, 0, 1)]
H, HKV, D, W = 4, 2, 8, 5


def _inputs(docs, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    T = sum(docs)
    pdt = torch.float64 if dtype == torch.float64 else torch.float32
    q, do = (torch.randn(T, H, D, generator=g).to(dtype) for _ in range(2))
    k, v = (torch.randn(T, HKV, D, generator=g).to(dtype) for _ in range(2))
    bias = 0.5 * torch.randn(H, W, generator=g, dtype=pdt)
    tau = torch.tensor([-0.3, -1.0, 0.2, -0.05], dtype=pdt)
    return q, k, v, bias, tau, do, cu_seqlens_of(docs)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("docs", DOCS, ids=lambda d: "-".join(map(str, d)))
def test_driver_over_golden_dense_is_golden_varlen(docs, dtype, causal):
    q, k, v, bias, tau, do, cu = _inputs(docs, dtype)
    scale = D ** -0.5
    o, lse = varlen.forward(q, k, v, bias, tau, cu, max(docs), scale, causal)
    assert lse.dtype == (torch.float64 if dtype == torch.float64 else torch.float32) and lse.shape == (H, sum(docs))
    o2, lse2 = varlen.forward_by_length(dense, q, k, v, bias, tau, cu, scale, causal, lse.dtype)
    assert _same(o, o2) and _same(lse, lse2)
    grads = varlen.backward(do, q, k, v, bias, tau, o, lse, cu, max(docs), scale, causal)
    grads2 = varlen.backward_by_length(dense, do, q, k, v, bias, tau, o, lse, cu, scale, causal, lse.dtype)
    assert all(_same(a, b) for a, b in zip(grads, grads2))
    # each distinct length: one dense call on its documents stacked in order, rows scattered back unchanged
    bounds = cu.tolist()
    spans = [(a, b) for a, b in zip(bounds, bounds[1:]) if b > a]
    for L in sorted({b - a for a, b in spans}):
        mine = [(a, b) for a, b in spans if b - a == L]
        batch = [torch.stack([x[a:b] for a, b in mine]).transpose(1, 2) for x in (q, k, v)]
        o_L, lse_L = dense.forward(*batch, bias, tau, scale, None, causal)
        for j, (a, b) in enumerate(mine):
            assert torch.equal(o[a:b], o_L[j].transpose(0, 1)) and _same(lse[:, a:b], lse_L[j])
