"""lazy_attention_varlen: the SDPA oracle per document on every backend, and named errors eager and compiled."""
import pytest
import torch
import torch.nn.functional as F

import kernel_dispatch as kd
from kernel_dispatch import registry
from kernel_dispatch.ops.lazy_attention_varlen_cases import cu_seqlens_of
from kernel_dispatch.testing.matrix import rel_err, tolerance

DOCS = (5, 0, 17, 1, 30)


def _inputs(dtype=torch.float32, H=4, Hkv=2, D=16, W=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    T = sum(DOCS)
    q, k, v = (torch.randn(T, h, D, generator=g).to(dtype) for h in (H, Hkv, Hkv))
    return q, k, v, torch.zeros(H, W), torch.zeros(H), cu_seqlens_of(DOCS)


def _reasons(backend):
    q, k, v, bias, tau, cu = _inputs()
    return kd.which_backend("lazy_attention_varlen", q, k, v, bias, tau, cu).reasons[backend]


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "noncausal"])
@pytest.mark.parametrize("backend", registry.BACKEND_NAMES)
def test_tau0_zero_bias_is_sdpa_per_document(backend, causal):
    """With tau = 0 and a zero bias lazy attention is softmax attention: each document equals torch's SDPA on
    that document alone (an oracle no one here wrote), forward and backward."""
    if _reasons(backend):
        pytest.skip(f"{backend}: " + "; ".join(_reasons(backend)))
    q, k, v, bias, tau, cu = _inputs()
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    o = kd.lazy_attention_varlen(*leaves, bias, tau, cu, causal=causal, backend=backend)
    do = torch.randn_like(o)
    got = (o,) + torch.autograd.grad(o, leaves, do)
    ref_leaves = [t.double().requires_grad_() for t in (q, k, v)]
    outs = []
    for a, b in zip(cu[:-1].tolist(), cu[1:].tolist()):
        if b == a:
            continue
        qd, kd_, vd = (t[a:b].transpose(0, 1)[None] for t in ref_leaves)
        outs.append(F.scaled_dot_product_attention(qd, kd_, vd, is_causal=causal, enable_gqa=True)[0].transpose(0, 1))
    ref_o = torch.cat(outs)
    ref = (ref_o,) + torch.autograd.grad(ref_o, ref_leaves, do.double())
    for name, g_, r in zip(("o", "dq", "dk", "dv"), got, ref):
        assert rel_err(g_, r) <= tolerance("lazy_attention_varlen", torch.float32, name), name


def _call(q, k, v, bias, tau, cu, **kw):
    return kd.lazy_attention_varlen(q, k, v, bias, tau, cu, **kw)


BAD = [
    ("cu_seqlens", lambda cu: cu.long(), {}, "int32"),
    ("cu_seqlens", lambda cu: cu.to("meta"), {}, "device"),
    ("cu_seqlens", lambda cu: cu + 1, {}, "cu_seqlens\\[0\\] == 0"),
    ("cu_seqlens", lambda cu: torch.tensor([0, 10, 4, 53], dtype=torch.int32), {}, "non-decreasing"),
    ("cu_seqlens", lambda cu: torch.tensor([0, 10, 50], dtype=torch.int32), {}, "last value"),
    ("max_seqlen", lambda cu: cu, {"max_seqlen": 29}, "longest document"),
]


@pytest.mark.parametrize("name,bad,kw,match", BAD, ids=[m for *_, m in BAD])
def test_bad_cu_seqlens_is_a_named_error(name, bad, kw, match):
    q, k, v, bias, tau, cu = _inputs()
    with pytest.raises((TypeError, ValueError), match=f"{name}.*{match}|{name}: .*"):
        _call(q, k, v, bias, tau, bad(cu), **kw)


@pytest.mark.parametrize("name,bad,kw,match", [b for b in BAD if b[3] not in ("int32", "device")],
                         ids=[m for *_, m in BAD if m not in ("int32", "device")])
def test_bad_cu_seqlens_is_an_error_under_torch_compile(name, bad, kw, match):
    q, k, v, bias, tau, cu = _inputs()
    compiled = torch.compile(_call, fullgraph=True)
    with pytest.raises(Exception, match=name):
        compiled(q, k, v, bias, tau, bad(cu), **kw)
