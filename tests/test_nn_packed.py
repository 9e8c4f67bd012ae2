"""LazyAttention on packed documents ([T, dim] with cu_seqlens / document_ids) and the mHC wrapper around it.

The oracle is the layer's own unpacked path run on each document alone ([1, L_d, dim]): same output and
gradients, so no token sees another document and rotary positions restart at each document. The
projections then multiply matrices of other shapes, whose fp32 sums round differently: the comparisons
allow a few fp32 roundings (RTOL = 1e-5 ~ 80 eps, over reductions of 16-32 terms), and the ones where
both sides compute the same sums are exact.
"""
import pytest
import torch

import kernel_dispatch as kd
from kernel_dispatch.nn import MHC, LazyAttention, PackedDocuments, PreNorm, RMSNorm, expand_streams

RTOL, ATOL = 1e-5, 1e-6
LENGTHS = [3, 0, 1, 6, 0, 4]  # empty documents, a one-token document, W (5) longer than some documents


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py


@pytest.fixture(autouse=True)
def _golden():
    with kd.use_backend("golden"):
        yield


def _cu(lengths):
    return torch.tensor([0] + list(lengths)).cumsum(0).to(torch.int32)


def _layer(seed=0):
    torch.manual_seed(seed)
    layer = LazyAttention(dim=16, n_heads=4, n_kv_heads=2, max_bias_length=5)
    with torch.no_grad():
        layer.bias.normal_()
        layer.tau.uniform_(-1.5, 0.3)
    return layer


def _grads(module, x, out, do):
    params = [p for _, p in module.named_parameters()]
    return torch.autograd.grad(out, [x, *params], do)


def test_packed_equals_each_document_alone():
    layer = _layer()
    T = sum(LENGTHS)
    x = torch.randn(T, 16, requires_grad=True)
    do = torch.randn(T, 16)
    out = layer(x, cu_seqlens=_cu(LENGTHS))
    assert out.shape == (T, 16)
    got = _grads(layer, x, out, do)

    parts, cu = [], _cu(LENGTHS).tolist()
    x_ref = x.detach().clone().requires_grad_()
    for s, e in zip(cu[:-1], cu[1:]):
        if e > s:
            parts.append(layer(x_ref[None, s:e])[0])
    ref_out = torch.cat(parts)
    ref = _grads(layer, x_ref, ref_out, do)
    torch.testing.assert_close(out, ref_out, rtol=RTOL, atol=ATOL)
    names = ["x"] + [n for n, _ in layer.named_parameters()]
    for name, g, r in zip(names, got, ref):
        torch.testing.assert_close(g, r, rtol=RTOL, atol=ATOL, msg=name)


def test_document_ids_and_packed_documents_equal_cu_seqlens():
    layer = _layer(1)
    T = sum(LENGTHS)
    x = torch.randn(T, 16)
    ids = torch.repeat_interleave(torch.tensor([7, 2, 9, 4]), torch.tensor([3, 1, 6, 4]))  # the non-empty ones
    by_cu = layer(x, cu_seqlens=_cu(LENGTHS), max_seqlen=8)
    by_ids = layer(x, document_ids=ids)
    docs = PackedDocuments.from_cu_seqlens(_cu(LENGTHS), T)
    assert docs.max_seqlen == 6 and docs.positions.tolist() == [0, 1, 2, 0, 0, 1, 2, 3, 4, 5, 0, 1, 2, 3]
    assert torch.equal(by_cu, by_ids) and torch.equal(by_cu, layer(x, documents=docs))


def test_one_document_equals_the_unpacked_layer():
    layer = _layer(2)
    x = torch.randn(1, 9, 16)
    torch.testing.assert_close(layer(x[0], cu_seqlens=_cu([9]))[None], layer(x), rtol=0, atol=0)


def test_no_token_attends_across_a_boundary():
    layer = _layer(3)
    x = torch.randn(sum(LENGTHS), 16)
    y = x.clone()
    y[4:10] += 1.0  # the fourth document (tokens 4..9)
    a, b = layer(x, cu_seqlens=_cu(LENGTHS)), layer(y, cu_seqlens=_cu(LENGTHS))
    other = torch.ones(len(x), dtype=torch.bool)
    other[4:10] = False
    assert torch.equal(a[other], b[other]) and not torch.equal(a[4:10], b[4:10])


def test_mhc_passes_the_documents_to_its_sublayer():
    """MHC(PreNorm(RMSNorm, LazyAttention)) on packed streams [T, n, dim] equals it on each document alone."""
    torch.manual_seed(4)
    n, D = 4, 16
    block = MHC(PreNorm(RMSNorm(D), LazyAttention(D, n_heads=2, max_bias_length=4)), dim=D, n_streams=n)
    T = sum(LENGTHS)
    x = expand_streams(torch.randn(T, D), n) + 0.1 * torch.randn(T, n, D)
    out = block(x, documents=PackedDocuments.from_cu_seqlens(_cu(LENGTHS), T))
    cu = _cu(LENGTHS).tolist()
    ref = torch.cat([block(x[None, s:e])[0] for s, e in zip(cu[:-1], cu[1:]) if e > s])
    torch.testing.assert_close(out, ref, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("kwargs,match", [
    (dict(cu_seqlens=torch.tensor([0, 3, 12], dtype=torch.int32)), "cu_seqlens: expected 0 = cu"),
    (dict(cu_seqlens=torch.tensor([0, 9, 4, 14], dtype=torch.int32)), "cu_seqlens: expected 0 = cu"),
    (dict(cu_seqlens=torch.tensor([1, 14], dtype=torch.int32)), "cu_seqlens: expected 0 = cu"),
    (dict(cu_seqlens=torch.tensor([0, 14])), "cu_seqlens: expected an int32"),
    (dict(cu_seqlens=torch.tensor([0, 4, 14], dtype=torch.int32), max_seqlen=9), "max_seqlen: expected an int >= "),
    (dict(document_ids=torch.tensor([0] * 5 + [1] * 5 + [0] * 4)), "document_ids: expected the tokens"),
    (dict(cu_seqlens=torch.tensor([0, 14], dtype=torch.int32), document_ids=torch.zeros(14, dtype=torch.long)),
     "document_ids: give one of"),
    (dict(max_seqlen=4), "max_seqlen: only meaningful"),
])
def test_bad_packed_input_names_the_argument(kwargs, match):
    layer = _layer()
    with pytest.raises((ValueError, TypeError), match=match):
        layer(torch.randn(14, 16), **kwargs)


def test_packed_needs_two_dimensional_tokens():
    with pytest.raises(ValueError, match=r"x: expected packed tokens \[T, dim\]"):
        _layer()(torch.randn(1, 14, 16), cu_seqlens=torch.tensor([0, 14], dtype=torch.int32))
