"""lazy_attention_with_kvcache through the public API: the definition (rows of lazy_attention over each row's
first n_b tokens), the in-place append, and named errors for bad input."""
import pytest
import torch

import kernel_dispatch as kd
from kernel_dispatch import registry
from kernel_dispatch.testing.matrix import rel_err, tolerance

B, H, Hkv, S, D, W = 3, 4, 2, 48, 16, 6
CACHED = (20, 0, 33)


def _inputs(Lq=3, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g).to(dtype)  # noqa: E731
    return dict(q=r(B, H, Lq, D), k_cache=r(B, Hkv, S, D), v_cache=r(B, Hkv, S, D), bias=0.5 * r(H, W).float(),
                tau=torch.tensor([-0.7, -1.3, 0.2, -0.4]), cache_seqlens=torch.tensor(CACHED, dtype=torch.int32),
                k=r(B, Hkv, Lq, D), v=r(B, Hkv, Lq, D))


def _reasons(backend, t):
    return kd.which_backend("lazy_attention_with_kvcache", t["q"], t["k_cache"], t["v_cache"], t["bias"], t["tau"],
                            t["cache_seqlens"], k=t["k"], v=t["v"]).reasons[backend]


@pytest.mark.parametrize("Lq", [1, 5])
@pytest.mark.parametrize("backend", registry.BACKEND_NAMES)
def test_rows_equal_lazy_attention_over_the_first_n_tokens(backend, Lq):
    t = _inputs(Lq)
    if _reasons(backend, t):
        pytest.skip(f"{backend}: " + "; ".join(_reasons(backend, t)))
    k_cache, v_cache = t["k_cache"].clone(), t["v_cache"].clone()
    o = kd.lazy_attention_with_kvcache(t["q"], k_cache, v_cache, t["bias"], t["tau"], t["cache_seqlens"],
                                       k=t["k"], v=t["v"], backend=backend)
    for b, c in enumerate(CACHED):
        n = c + Lq
        assert torch.equal(k_cache[b, :, c:n], t["k"][b]) and torch.equal(v_cache[b, :, c:n], t["v"][b])
        assert torch.equal(k_cache[b, :, n:], t["k_cache"][b, :, n:]), "append wrote past the new tokens"
        q_full = torch.zeros(1, H, n, D, dtype=torch.float64)
        q_full[0, :, n - Lq:] = t["q"][b].double()
        ref = kd.lazy_attention(q_full, k_cache[b:b + 1, :, :n].double(), v_cache[b:b + 1, :, :n].double(),
                                t["bias"].double(), t["tau"].double(), backend="golden")[0, :, n - Lq:]
        assert rel_err(o[b], ref) <= tolerance("lazy_attention_with_kvcache", torch.float32, "o"), b


def _call(**t):
    q, kc, vc, bias, tau, cs = (t.pop(n) for n in ("q", "k_cache", "v_cache", "bias", "tau", "cache_seqlens"))
    return kd.lazy_attention_with_kvcache(q, kc, vc, bias, tau, cs, **t)


BAD = [
    ("requires_grad", lambda t: t["q"].requires_grad_(), "q: requires grad"),
    ("bias_requires_grad", lambda t: t["bias"].requires_grad_(), "bias: requires grad"),
    ("overflow", lambda t: t.update(cache_seqlens=torch.tensor((20, 0, 46), dtype=torch.int32)), "capacity"),
    ("negative", lambda t: t.update(cache_seqlens=torch.tensor((20, -1, 3), dtype=torch.int32)), ">= 0"),
    ("int64", lambda t: t.update(cache_seqlens=t["cache_seqlens"].long()), "cache_seqlens: expected dtype"),
    ("device", lambda t: t.update(cache_seqlens=t["cache_seqlens"].to("meta")), "cache_seqlens: expected device"),
    ("dtype", lambda t: t.update(k_cache=t["k_cache"].double()), "k_cache: expected the dtype of q"),
    ("shape", lambda t: t.update(v_cache=t["v_cache"][:, :, :-1]), "v_cache: expected shape"),
    ("new_shape", lambda t: t.update(k=t["k"][:, :, :1]), "k: expected shape"),
    ("k_without_v", lambda t: t.update(v=None), "k and v are given together"),
    ("fewer_keys_than_queries", lambda t: t.update(k=None, v=None), "fewer than the Lq"),
]


@pytest.mark.parametrize("mutate,match", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_input_is_a_named_error(mutate, match):
    t = _inputs(Lq=3)
    mutate(t)
    with pytest.raises((TypeError, ValueError), match=match):
        _call(**t)


def test_overflow_is_an_error_under_torch_compile():
    t = _inputs(Lq=3)
    t["cache_seqlens"] = torch.tensor((20, 0, 46), dtype=torch.int32)
    with pytest.raises(Exception, match="cache_seqlens"):
        torch.compile(_call, fullgraph=True)(**t)
