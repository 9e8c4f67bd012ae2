"""The golden lazy attention over packed documents (SPEC section 4) against its oracles.

- gradcheck in float64 of the closed-form backward (through a small autograd.Function over golden);
- equality with the per-document loop of golden lazy_attention (B = 1 per document), forward and backward;
- tau = 0 with a zero bias is plain attention per document: torch's SDPA, forward and backward.
Cases: empty documents, documents of length 1, one document, a few hundred documents, W longer than a
document, GQA, causal and not.
"""
import pytest
import torch
import torch.nn.functional as F
from torch.autograd import gradcheck

from kernel_dispatch.golden import lazy_attention as dense
from kernel_dispatch.golden import lazy_attention_varlen as varlen

F64 = torch.float64


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py


class GoldenVarlen(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, bias, tau, cu, scale, causal):
        o, lse = varlen.forward(q, k, v, bias, tau, cu, _max_len(cu), scale, causal)
        ctx.save_for_backward(q, k, v, bias, tau, o, lse, cu)
        ctx.scale, ctx.causal = scale, causal
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, bias, tau, o, lse, cu = ctx.saved_tensors
        return (*varlen.backward(do, q, k, v, bias, tau, o, lse, cu, _max_len(cu), ctx.scale, ctx.causal),
                None, None, None)


def _max_len(cu):
    return int((cu[1:] - cu[:-1]).max()) if len(cu) > 1 else 0


def _cu(lengths):
    return torch.tensor([0] + list(lengths), dtype=torch.int32).cumsum(0, dtype=torch.int32)


def _inputs(lengths, H=4, Hkv=2, D=3, W=3, seed=0, dtype=F64, tau=None, zero_bias=False):
    T = sum(lengths)
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(T, H, D, generator=g, dtype=dtype)
    k = torch.randn(T, Hkv, D, generator=g, dtype=dtype)
    v = torch.randn(T, Hkv, D, generator=g, dtype=dtype)
    bias = torch.zeros(H, W, dtype=dtype) if zero_bias else 0.5 * torch.randn(H, W, generator=g, dtype=dtype)
    tau = torch.tensor([-0.3, -1.4, 0.2, -0.05][:H], dtype=dtype) if tau is None else torch.full((H,), tau, dtype=dtype)
    return q, k, v, bias, tau, _cu(lengths)


def _per_document(q, k, v, bias, tau, cu, do, scale, causal):
    """The SPEC's oracle: golden lazy_attention on each document (B = 1), concatenated; dbias, dtau summed."""
    o, lse = torch.zeros_like(q), torch.zeros(q.shape[1], q.shape[0], dtype=F64 if q.dtype == F64 else torch.float32)
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    dbias, dtau = torch.zeros_like(bias), torch.zeros_like(tau)
    magnitude = [torch.zeros_like(bias), torch.zeros_like(tau)]
    for s, e in zip(cu[:-1].tolist(), cu[1:].tolist()):
        if e == s:
            continue
        args = [t[s:e].transpose(0, 1)[None] for t in (q, k, v)]
        o_d, lse_d = dense.forward(*args, bias, tau, scale, None, causal)
        grads = dense.backward(do[s:e].transpose(0, 1)[None], *args, bias, tau, o_d, lse_d, scale, None, causal)
        o[s:e], lse[:, s:e] = o_d[0].transpose(0, 1), lse_d[0]
        dq[s:e], dk[s:e], dv[s:e] = (g[0].transpose(0, 1) for g in grads[:3])
        dbias += grads[3]
        dtau += grads[4]
        for total, part in zip(magnitude, _summand_magnitudes(*args, bias, tau, do[s:e].transpose(0, 1)[None],
                                                             scale, causal)):
            total += part
    return o, lse, (dq, dk, dv, dbias, dtau), magnitude


def _summand_magnitudes(q, k, v, bias, tau, do, scale, causal):
    """sum |dS[m, n]| over each bias distance [H, W] and sum |Mk dA / i| per head [H] (SPEC section 1): the
    magnitudes of the terms that dbias and dtau add up, for one document [1, H, L, D]."""
    s, valid, i, _ = dense._scores(q, k, bias, scale, None, causal, q.dtype)
    groups = q.shape[1] // k.shape[1]
    p = torch.exp(s - torch.logsumexp(s, -1, keepdim=True))
    mk = (p + tau.to(q.dtype).view(1, -1, 1, 1) / i > 0) & valid
    dp = (do @ v.repeat_interleave(groups, 1).transpose(-1, -2)) * mk
    ds = (p * (dp - (p * dp).sum(-1, keepdim=True))).abs()[0]
    L, W = q.shape[2], bias.shape[1]
    dist = torch.arange(L)[:, None] - torch.arange(L)[None, :]
    dist = dist if causal else dist.abs()
    mag_bias = torch.stack([(ds * (dist == t)).sum((-1, -2)) for t in range(W)], -1)
    return mag_bias.to(bias.dtype), (dp.abs() / i).sum((0, 2, 3)).to(tau.dtype)


CASES = {
    "empty and length-1 documents": [0, 1, 4, 0, 1, 3, 0],
    "one document": [9],
    "one document shorter than W": [2],
    "all empty but one token": [0, 0, 1, 0],
}


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("lengths", list(CASES.values()), ids=list(CASES))
def test_gradcheck(lengths, causal):
    q, k, v, bias, tau, cu = _inputs(lengths, H=2, Hkv=1, D=2, W=4)
    args = tuple(t.requires_grad_() for t in (q, k, v, bias, tau))
    assert gradcheck(lambda *a: GoldenVarlen.apply(*a, cu, 0.7, causal), args)


def _many_lengths(n, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 6, (n,), generator=g).tolist()


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("lengths", [*CASES.values(), _many_lengths(300)],
                         ids=[*CASES, "300 documents of length 0-5"])
@pytest.mark.parametrize("dtype", [F64, torch.float32])
def test_equals_per_document_loop(lengths, causal, dtype):
    """Documents of one length run as one batch; every document's result equals its own call, bit for bit."""
    q, k, v, bias, tau, cu = _inputs(lengths, W=4, dtype=dtype, seed=2)
    bias, tau = bias.float(), tau.float()
    do = torch.randn_like(q)
    scale = 0.6
    o, lse = varlen.forward(q, k, v, bias, tau, cu, _max_len(cu), scale, causal)
    grads = varlen.backward(do, q, k, v, bias, tau, o, lse, cu, _max_len(cu), scale, causal)
    o_ref, lse_ref, grads_ref, magnitude = _per_document(q, k, v, bias, tau, cu, do, scale, causal)
    assert o.dtype == q.dtype and o.shape == q.shape
    assert lse.shape == (q.shape[1], q.shape[0]) and lse.dtype == (F64 if dtype == F64 else torch.float32)
    torch.testing.assert_close(o, o_ref, rtol=0, atol=0)
    torch.testing.assert_close(lse, lse_ref, rtol=0, atol=0)
    for name, got, ref, inp in zip(("dq", "dk", "dv"), grads[:3], grads_ref[:3], (q, k, v)):
        assert got.dtype == inp.dtype
        torch.testing.assert_close(got, ref, rtol=0, atol=0, msg=name)
    # dbias and dtau add the same summands (dS entries; Mk dA / i) in another order (documents of one length
    # first): two sums of n terms in floating point differ by at most 2 (n - 1) eps sum|term|; n <= 2T for a
    # bias distance (one or two keys per query), n = sum L_d^2 for tau
    eps = torch.finfo(bias.dtype).eps
    counts = (2 * q.shape[0], sum(n * n for n in lengths))
    for name, got, ref, mag, n in zip(("dbias", "dtau"), grads[3:], grads_ref[3:], magnitude, counts):
        assert got.dtype == bias.dtype
        assert ((got - ref).abs() <= 2 * max(n - 1, 0) * eps * mag).all(), name


def _sdpa_per_document(q, k, v, cu, do, causal, scale):
    groups = q.shape[1] // k.shape[1]
    outs = []
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    for s, e in zip(cu[:-1].tolist(), cu[1:].tolist()):
        if e == s:
            continue
        qd, kd, vd = (t[s:e].transpose(0, 1) for t in leaves)
        kd, vd = kd.repeat_interleave(groups, 0), vd.repeat_interleave(groups, 0)
        outs.append(F.scaled_dot_product_attention(qd, kd, vd, is_causal=causal, scale=scale).transpose(0, 1))
    o_full = torch.cat(outs)  # the documents in order, empty ones contributing nothing
    o_full.backward(do)
    return o_full.detach(), [t.grad for t in leaves]


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("lengths", [CASES["empty and length-1 documents"], [9], _many_lengths(200, seed=3)],
                         ids=["empty and length-1 documents", "one document", "200 documents"])
def test_tau_zero_zero_bias_is_sdpa_per_document(lengths, causal):
    """An oracle nobody here wrote: with tau = 0 and no bias, each document is plain softmax attention."""
    q, k, v, bias, tau, cu = _inputs(lengths, W=6, seed=4, tau=0.0, zero_bias=True)
    do = torch.randn_like(q)
    scale = 0.8
    o, lse = varlen.forward(q, k, v, bias, tau, cu, _max_len(cu), scale, causal)
    dq, dk, dv, dbias, dtau = varlen.backward(do, q, k, v, bias, tau, o, lse, cu, _max_len(cu), scale, causal)
    o_ref, (dq_ref, dk_ref, dv_ref) = _sdpa_per_document(q, k, v, cu, do, causal, scale)
    for name, got, ref in (("o", o, o_ref), ("dq", dq, dq_ref), ("dk", dk, dk_ref), ("dv", dv, dv_ref)):
        torch.testing.assert_close(got, ref, rtol=1e-10, atol=1e-12, msg=name)


def test_no_token_sees_another_document():
    """Changing one document's k and v leaves every other document's output and LSE unchanged."""
    lengths = [3, 5, 0, 4]
    q, k, v, bias, tau, cu = _inputs(lengths, seed=5)
    o, lse = varlen.forward(q, k, v, bias, tau, cu, 5, 0.5, True)
    k2, v2 = k.clone(), v.clone()
    k2[3:8] += 1.0
    v2[3:8] -= 2.0
    o2, lse2 = varlen.forward(q, k2, v2, bias, tau, cu, 5, 0.5, True)
    outside = torch.ones(q.shape[0], dtype=torch.bool)
    outside[3:8] = False
    assert torch.equal(o[outside], o2[outside]) and torch.equal(lse[:, outside], lse2[:, outside])
    assert not torch.equal(o[3:8], o2[3:8])


def test_no_tokens():
    """T = 0 (every document empty): empty outputs, zero parameter gradients."""
    q, k, v, bias, tau, cu = _inputs([0, 0])
    o, lse = varlen.forward(q, k, v, bias, tau, cu, 0, 0.5, True)
    assert o.shape == (0, 4, 3) and lse.shape == (4, 0)
    dq, dk, dv, dbias, dtau = varlen.backward(o, q, k, v, bias, tau, o, lse, cu, 0, 0.5, True)
    assert dq.shape == q.shape and not dbias.any() and not dtau.any()
