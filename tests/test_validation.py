"""Bad input: every violation gives a ValueError or TypeError naming the argument, the expectation and the value."""
import pytest
import torch

import kernel_dispatch as kd


def attn(**over):
    B, H, L, D = 2, 4, 6, 8
    a = dict(q=torch.randn(B, H, L, D), k=torch.randn(B, 2, L, D), v=torch.randn(B, 2, L, D),
             bias=torch.zeros(H, 3), tau=torch.zeros(H))
    kw = {k: over.pop(k) for k in ("lengths", "causal", "scale") if k in over}
    a.update(over)
    return kd.lazy_attention(a["q"], a["k"], a["v"], a["bias"], a["tau"], **kw)


@pytest.mark.parametrize("over,exc,words", [
    (dict(q=torch.randn(2, 4, 6)), ValueError, ["q", "4-D", "[2, 4, 6]"]),
    (dict(k=torch.randn(2, 2, 5, 8)), ValueError, ["k", "[B, Hkv, L, D]", "[2, 2, 5, 8]"]),
    (dict(v=torch.randn(2, 2, 6, 4)), ValueError, ["v", "[2, 2, 6, 8]", "[2, 2, 6, 4]"]),
    (dict(k=torch.randn(2, 3, 6, 8), v=torch.randn(2, 3, 6, 8)), ValueError, ["k", "Hkv = 3", "H % Hkv"]),
    (dict(bias=torch.zeros(3, 3)), ValueError, ["bias", "[H, W]", "[3, 3]"]),
    (dict(bias=torch.zeros(4)), ValueError, ["bias", "2-D"]),
    (dict(tau=torch.zeros(4, 1)), ValueError, ["tau", "1-D"]),
    (dict(tau=torch.zeros(2)), ValueError, ["tau", "[H]", "[2]"]),
    (dict(q=torch.randint(0, 3, (2, 4, 6, 8))), TypeError, ["q", "dtype", "int64"]),
    (dict(k=torch.randn(2, 2, 6, 8, dtype=torch.float64)), TypeError, ["k", "dtype of q"]),
    (dict(bias=torch.zeros(4, 3, dtype=torch.bfloat16)), TypeError, ["bias", "float32", "bfloat16"]),
    (dict(q=torch.randn(2, 4, 0, 8), k=torch.randn(2, 2, 0, 8), v=torch.randn(2, 2, 0, 8)), ValueError,
     ["q", "L = 0"]),
    (dict(lengths=torch.tensor([6, 7])), ValueError, ["lengths", "[1, 6]", "max 7"]),
    (dict(lengths=torch.tensor([0, 3])), ValueError, ["lengths", "min 0"]),
    (dict(lengths=torch.tensor([6])), ValueError, ["lengths", "[B]", "[1]"]),
    (dict(lengths=torch.tensor([6.0, 3.0])), TypeError, ["lengths", "int"]),
    (dict(causal=1), TypeError, ["causal", "bool"]),
    (dict(scale="x"), TypeError, ["scale", "float"]),
    (dict(scale=float("nan")), ValueError, ["scale", "finite float", "nan"]),
    (dict(scale=float("inf")), ValueError, ["scale", "finite float", "inf"]),
    (dict(scale=-float("inf")), ValueError, ["scale", "finite float", "-inf"]),
    (dict(q="not a tensor"), TypeError, ["q", "torch.Tensor", "str"]),
])
def test_lazy_attention_bad_input(over, exc, words):
    with pytest.raises(exc) as e:
        attn(**over)
    for w in words:
        assert w in str(e.value), (w, str(e.value))


def test_lazy_attention_different_devices():
    meta = torch.zeros(4, device="meta")
    with pytest.raises(ValueError, match="tau: expected device cpu"):
        attn(tau=meta)


def pre(**over):
    n, D = 4, 8
    M = n * n + 2 * n
    a = dict(x=torch.randn(3, n, D), phi=torch.randn(M, n * D), alpha=torch.ones(3), bias=torch.zeros(M), gamma=None)
    kw = {k: over.pop(k) for k in ("sinkhorn_iters", "post_mult", "norm_eps", "pre_eps", "sinkhorn_eps") if k in over}
    a.update(over)
    return kd.mhc_pre(a["x"], a["phi"], a["alpha"], a["bias"], a["gamma"], **kw)


@pytest.mark.parametrize("over,exc,words", [
    (dict(x=torch.randn(8)), ValueError, ["x", "at least 2 dims"]),
    (dict(x=torch.randn(0, 4, 8)), ValueError, ["x", "T = 0"]),
    (dict(phi=torch.randn(24, 31)), ValueError, ["phi", "[n*n + 2n, n*D]", "[24, 32]", "[24, 31]"]),
    (dict(alpha=torch.ones(2)), ValueError, ["alpha", "[3]", "[2]"]),
    (dict(bias=torch.zeros(23)), ValueError, ["bias", "[24]", "[23]"]),
    (dict(gamma=torch.ones(31)), ValueError, ["gamma", "[n*D]", "[32]"]),
    (dict(x=torch.randint(0, 2, (3, 4, 8))), TypeError, ["x", "dtype", "int64"]),
    (dict(phi=torch.randn(24, 32, dtype=torch.bfloat16)), TypeError, ["phi", "bfloat16"]),
    (dict(sinkhorn_iters=0), ValueError, ["sinkhorn_iters", ">= 1", "0"]),
    (dict(norm_eps=-1.0), ValueError, ["norm_eps", "finite float > 0", "-1.0"]),
    (dict(norm_eps=0.0), ValueError, ["norm_eps", "finite float > 0", "0.0"]),
    (dict(norm_eps=float("nan")), ValueError, ["norm_eps", "finite", "nan"]),
    (dict(norm_eps=float("inf")), ValueError, ["norm_eps", "finite", "inf"]),
    (dict(post_mult=float("nan")), ValueError, ["post_mult", "finite float", "nan"]),
    (dict(post_mult=float("-inf")), ValueError, ["post_mult", "finite float", "-inf"]),
    (dict(post_mult="2"), TypeError, ["post_mult", "float", "str"]),
    (dict(pre_eps=-1e-6), ValueError, ["pre_eps", "finite float >= 0", "-1e-06"]),
    (dict(pre_eps=float("nan")), ValueError, ["pre_eps", "finite", "nan"]),
    (dict(sinkhorn_eps=float("inf")), ValueError, ["sinkhorn_eps", "finite float >= 0", "inf"]),
    (dict(sinkhorn_eps=-0.5), ValueError, ["sinkhorn_eps", ">= 0", "-0.5"]),
    (dict(gamma=torch.ones(32, device="meta")), ValueError, ["gamma", "device"]),
])
def test_mhc_pre_bad_input(over, exc, words):
    with pytest.raises(exc) as e:
        pre(**over)
    for w in words:
        assert w in str(e.value), (w, str(e.value))


def post(**over):
    a = dict(f=torch.randn(3, 8), x=torch.randn(3, 4, 8), h_post=torch.rand(3, 4), h_res=torch.rand(3, 4, 4))
    a.update(over)
    return kd.mhc_post(a["f"], a["x"], a["h_post"], a["h_res"])


@pytest.mark.parametrize("over,exc,words", [
    (dict(f=torch.randn(3, 7)), ValueError, ["f", "[..., D]", "[3, 8]", "[3, 7]"]),
    (dict(f=torch.randn(3, 8, dtype=torch.float64)), TypeError, ["f", "dtype of x"]),
    (dict(h_post=torch.rand(3, 5)), ValueError, ["h_post", "[3, 4]", "[3, 5]"]),
    (dict(h_res=torch.rand(3, 4)), ValueError, ["h_res", "[3, 4, 4]"]),
    (dict(x=torch.randn(0, 4, 8), f=torch.randn(0, 8), h_post=torch.rand(0, 4), h_res=torch.rand(0, 4, 4)),
     ValueError, ["x", "at least one token"]),
    (dict(h_res=torch.rand(3, 4, 4, dtype=torch.float16)), TypeError, ["h_res", "float16"]),
    (dict(h_post=torch.rand(3, 4, device="meta")), ValueError, ["h_post", "device"]),
])
def test_mhc_post_bad_input(over, exc, words):
    with pytest.raises(exc) as e:
        post(**over)
    for w in words:
        assert w in str(e.value), (w, str(e.value))
