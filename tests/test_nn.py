"""The layers of kernel_dispatch.nn: shapes, dtypes, GQA, RoPE, and mHC starting as a plain residual."""
import pytest
import torch

import kernel_dispatch as kd
from kernel_dispatch.nn import (MHC, LazyAttention, apply_rotary, collapse_streams, expand_streams, mhc_bias_init,
                                rotary_tables)


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py


@pytest.fixture(autouse=True)
def _golden():
    with kd.use_backend("golden"):
        yield


def test_lazy_attention_shapes_and_parameters():
    torch.manual_seed(0)
    layer = LazyAttention(dim=32, n_heads=4, n_kv_heads=2, max_bias_length=16)
    x = torch.randn(2, 9, 32, requires_grad=True)
    out = layer(x)
    assert out.shape == (2, 9, 32) and out.dtype == torch.float32
    assert layer.bias.shape == (4, 16) and layer.bias.dtype == torch.float32 and not layer.bias.any()
    assert layer.tau.shape == (4,) and layer.tau.dtype == torch.float32 and (layer.tau == -1.0).all()
    assert layer.wk.out_features == layer.wv.out_features == 2 * 8 and layer.wq.out_features == 4 * 8
    out.square().sum().backward()
    for name, p in layer.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
    assert layer.tau.grad.abs().sum() > 0 and layer.bias.grad.abs().sum() > 0


def test_lazy_attention_gqa_matches_repeated_kv_heads():
    """A GQA layer equals the same computation with every kv head repeated for its query heads."""
    torch.manual_seed(1)
    layer = LazyAttention(dim=32, n_heads=4, n_kv_heads=2, max_bias_length=8)
    with torch.no_grad():
        layer.bias.normal_()
        layer.tau.uniform_(-1.5, 0.5)
    x = torch.randn(2, 7, 32)
    B, L = 2, 7
    q = layer.wq(x).view(B, L, 4, 8).transpose(1, 2)
    k = layer.wk(x).view(B, L, 2, 8).transpose(1, 2)
    v = layer.wv(x).view(B, L, 2, 8).transpose(1, 2)
    cos, sin = rotary_tables(L, 8, layer.rope_base, x.device)
    q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
    o = kd.lazy_attention(q, k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1), layer.bias, layer.tau)
    ref = layer.wo(o.transpose(1, 2).reshape(B, L, 32))
    torch.testing.assert_close(layer(x), ref, rtol=1e-5, atol=1e-6)


def test_lazy_attention_bf16_activations_keep_fp32_parameters():
    torch.manual_seed(2)
    layer = LazyAttention(dim=16, n_heads=2, max_bias_length=4)
    x = torch.randn(1, 5, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = layer(x)
    assert out.dtype == torch.bfloat16
    assert layer.bias.dtype == layer.tau.dtype == torch.float32


def test_lazy_attention_rejects_bad_heads():
    with pytest.raises(ValueError, match="n_kv_heads"):
        LazyAttention(dim=32, n_heads=4, n_kv_heads=3)


def test_rotary_is_a_relative_rotation():
    """RoPE keeps norms and makes q.k depend on the position difference only."""
    torch.manual_seed(3)
    cos, sin = rotary_tables(12, 8, 10000.0, torch.device("cpu"))
    q, k = torch.randn(8), torch.randn(8)
    qs = apply_rotary(q.expand(1, 1, 12, 8), cos, sin)[0, 0]
    ks = apply_rotary(k.expand(1, 1, 12, 8), cos, sin)[0, 0]
    torch.testing.assert_close(qs.norm(dim=-1), q.norm().expand(12))
    torch.testing.assert_close(qs[5] @ ks[2], qs[9] @ ks[6])


def test_mhc_shapes_dtypes_and_parameters():
    torch.manual_seed(4)
    n, D = 4, 16
    layer = MHC(torch.nn.Linear(D, D), dim=D, n_streams=n)
    assert layer.phi.shape == (n * n + 2 * n, n * D) and layer.gamma.shape == (n * D,)
    assert all(p.dtype == torch.float32 for p in (layer.phi, layer.alpha, layer.bias, layer.gamma))
    assert torch.equal(layer.alpha, torch.full((3,), 0.01))
    x = torch.randn(2, 3, n, D, requires_grad=True)
    out = layer(x)
    assert out.shape == x.shape and out.dtype == x.dtype
    out.sum().backward()
    for name, p in layer.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name


def test_fresh_mhc_is_close_to_a_plain_residual():
    """h_res ~ I, h_pre ~ 1/n, h_post ~ 1: identical streams each become x + sublayer(x)."""
    torch.manual_seed(5)
    n, D = 4, 32
    sub = torch.nn.Linear(D, D)
    layer = MHC(sub, dim=D, n_streams=n)
    h = torch.randn(3, 5, D)
    x = expand_streams(h, n)
    with torch.no_grad():
        h_in, h_post, h_res = layer.mixings(x)
        eye = torch.eye(n).expand_as(h_res)
        assert (h_res - eye).abs().max() < 2e-3
        torch.testing.assert_close(h_post, torch.ones_like(h_post), atol=0.05, rtol=0)
        torch.testing.assert_close(h_in, h, atol=0.05 * h.abs().max().item(), rtol=0)
        out = layer(x)
        plain = h + sub(h)
        assert (out - plain[..., None, :]).norm() / plain.norm() / n ** 0.5 < 0.05
    assert torch.allclose(collapse_streams(x), h)


def test_mhc_bias_init_reaches_the_target_mixings():
    b = mhc_bias_init(4, 8.0)
    assert torch.allclose(torch.sigmoid(b[:4]), torch.full((4,), 0.25))
    assert torch.equal(b[4:8], torch.zeros(4))
    assert torch.equal(b[8:].view(4, 4), 8.0 * torch.eye(4))
