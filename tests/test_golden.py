"""The golden backend against oracles nobody here wrote: torch.autograd and torch's SDPA.

- gradcheck in float64 of the closed-form backward (through the public ops, backend golden);
- the closed-form backward against torch.autograd of the golden forward;
- lazy attention with tau = 0 and a zero bias is plain attention (SDPA), forward and backward;
- the SPEC's facts: tau <= -1 zeroes the first causal row; tau >= 0 adds (tau/i) * prefix-sum of v.
"""
import pytest
import torch
from torch.autograd import gradcheck

import kernel_dispatch as kd
from kernel_dispatch.golden import lazy_attention as g_attn
from kernel_dispatch.golden import mhc_post as g_post
from kernel_dispatch.golden import mhc_pre as g_pre

F64 = torch.float64


def _attn_inputs(B=2, H=4, Hkv=2, L=7, D=3, W=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, L, D, generator=g, dtype=F64)
    k = torch.randn(B, Hkv, L, D, generator=g, dtype=F64)
    v = torch.randn(B, Hkv, L, D, generator=g, dtype=F64)
    bias = 0.5 * torch.randn(H, W, generator=g, dtype=F64)
    tau = torch.tensor([-0.3, -1.4, 0.2, -0.05][:H], dtype=F64)
    return [t.requires_grad_() for t in (q, k, v, bias, tau)]


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("lengths", [None, (7, 3)])
def test_lazy_attention_gradcheck(causal, lengths):
    lens = None if lengths is None else torch.tensor(lengths)
    fn = lambda *a: kd.lazy_attention(*a, causal=causal, lengths=lens, backend="golden")  # noqa: E731
    assert gradcheck(fn, tuple(_attn_inputs()))


def test_mhc_pre_gradcheck_with_and_without_gamma():
    g = torch.Generator().manual_seed(1)
    n, D = 4, 5
    M = n * n + 2 * n
    x = torch.randn(3, n, D, generator=g, dtype=F64, requires_grad=True)
    phi = (0.3 * torch.randn(M, n * D, generator=g, dtype=F64)).requires_grad_()
    alpha = torch.tensor([0.9, 1.1, 1.3], dtype=F64, requires_grad=True)
    bias = (0.2 * torch.randn(M, generator=g, dtype=F64)).requires_grad_()
    gamma = (1 + 0.1 * torch.randn(n * D, generator=g, dtype=F64)).requires_grad_()
    assert gradcheck(lambda *a: kd.mhc_pre(*a, sinkhorn_iters=6, backend="golden"), (x, phi, alpha, bias, gamma))
    assert gradcheck(lambda *a: kd.mhc_pre(*a, None, backend="golden"), (x, phi, alpha, bias))


def test_mhc_post_gradcheck():
    g = torch.Generator().manual_seed(2)
    f = torch.randn(3, 5, generator=g, dtype=F64, requires_grad=True)
    x = torch.randn(3, 4, 5, generator=g, dtype=F64, requires_grad=True)
    hp = torch.rand(3, 4, generator=g, dtype=F64, requires_grad=True)
    hr = torch.rand(3, 4, 4, generator=g, dtype=F64, requires_grad=True)
    assert gradcheck(lambda *a: kd.mhc_post(*a, backend="golden"), (f, x, hp, hr))


def _autograd_grads(fn, inputs, outs_grad):
    outs = fn(*inputs)
    outs = outs if isinstance(outs, tuple) else (outs,)
    return torch.autograd.grad(outs, inputs, outs_grad)


@pytest.mark.parametrize("causal,lengths", [(True, None), (False, (7, 4))])
def test_lazy_attention_closed_form_equals_autograd_of_forward(causal, lengths):
    q, k, v, bias, tau = _attn_inputs(L=9, W=4)
    lens = None if lengths is None else torch.tensor(lengths)
    scale = 0.6
    do = torch.randn_like(q)
    auto = _autograd_grads(lambda *a: g_attn.forward(*a, scale, lens, causal)[0], [q, k, v, bias, tau], (do,))
    o, lse = g_attn.forward(q, k, v, bias, tau, scale, lens, causal)
    closed = g_attn.backward(do, q, k, v, bias, tau, o, lse, scale, lens, causal)
    for name, a, c in zip(("dq", "dk", "dv", "dbias", "dtau"), auto, closed):
        torch.testing.assert_close(c, a, rtol=1e-10, atol=1e-12, msg=name)


def test_mhc_closed_form_equals_autograd_of_forward():
    g = torch.Generator().manual_seed(3)
    T, n, D = 6, 4, 8
    M = n * n + 2 * n
    x = torch.randn(T, n, D, generator=g, dtype=F64, requires_grad=True)
    phi = (0.2 * torch.randn(M, n * D, generator=g, dtype=F64)).requires_grad_()
    alpha = torch.tensor([0.9, 1.1, 1.3], dtype=F64, requires_grad=True)
    bias = (0.2 * torch.randn(M, generator=g, dtype=F64)).requires_grad_()
    gamma = (1 + 0.1 * torch.randn(n * D, generator=g, dtype=F64)).requires_grad_()
    hp = (20, 2.0, 1e-6, 1e-6, 1e-6)
    grads = (torch.randn(T, D, generator=g, dtype=F64), torch.randn(T, n, generator=g, dtype=F64),
             torch.randn(T, n, n, generator=g, dtype=F64))
    auto = _autograd_grads(lambda *a: g_pre.forward(*a, *hp)[:3], [x, phi, alpha, bias, gamma], grads)
    _, _, _, z, inv_rms = g_pre.forward(x, phi, alpha, bias, gamma, *hp)
    closed = g_pre.backward(*grads, x, phi, alpha, bias, gamma, z, inv_rms, *hp)
    for name, a, c in zip(("dx", "dphi", "dalpha", "dbias", "dgamma"), auto, closed):
        torch.testing.assert_close(c, a, rtol=1e-9, atol=1e-11, msg=name)
    f, hpost, hres = torch.randn(T, D, dtype=F64), torch.rand(T, n, dtype=F64), torch.rand(T, n, n, dtype=F64)
    f, hpost, hres = (t.requires_grad_() for t in (f, hpost, hres))
    gout = torch.randn(T, n, D, dtype=F64)
    auto = _autograd_grads(g_post.forward, [f, x, hpost, hres], (gout,))
    closed = g_post.backward(gout, f, x, hpost, hres)
    for a, c in zip(auto, closed):
        torch.testing.assert_close(c, a, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("dtype", [F64, torch.float32])
def test_tau0_zero_bias_is_sdpa(causal, dtype):
    g = torch.Generator().manual_seed(4)
    B, H, L, D = 2, 3, 19, 8
    q, k, v = (torch.randn(B, H, L, D, generator=g, dtype=dtype, requires_grad=True) for _ in range(3))
    bias, tau = torch.zeros(H, 5, dtype=F64 if dtype == F64 else torch.float32), torch.zeros(H, dtype=bias_dtype(dtype))
    o = kd.lazy_attention(q, k, v, bias, tau, causal=causal, backend="golden")
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    tol = dict(rtol=1e-10, atol=1e-10) if dtype == F64 else dict(rtol=2e-5, atol=2e-6)
    torch.testing.assert_close(o, ref, **tol)
    do = torch.randn_like(o)
    mine = torch.autograd.grad(o, (q, k, v), do)
    theirs = torch.autograd.grad(ref, (q, k, v), do)
    for a, b in zip(mine, theirs):
        torch.testing.assert_close(a, b, **tol)


def bias_dtype(dtype):
    return F64 if dtype == F64 else torch.float32


def test_tau_le_minus1_zeroes_first_causal_row():
    q, k, v, bias, _ = _attn_inputs(H=2, Hkv=2)
    tau = torch.tensor([-1.0, -2.5], dtype=F64)
    o = kd.lazy_attention(q, k, v, bias, tau, backend="golden")
    assert torch.all(o[:, :, 0] == 0)
    assert o[:, :, 1:].abs().sum() > 0


def test_tau_nonnegative_adds_prefix_mean_of_v():
    q, k, v, bias, _ = _attn_inputs(H=2, Hkv=2, L=11, W=4)
    tau = torch.tensor([0.0, 0.7], dtype=F64)
    o = kd.lazy_attention(q, k, v, bias, tau, backend="golden")
    zero = kd.lazy_attention(q, k, v, bias, torch.zeros_like(tau), backend="golden")
    i = torch.arange(1, 12, dtype=F64).view(1, 1, -1, 1)
    expected = zero + tau.view(1, -1, 1, 1) / i * v.cumsum(2)
    torch.testing.assert_close(o, expected, rtol=1e-12, atol=1e-12)


def test_padded_rows_are_zero_with_zero_gradients():
    q, k, v, bias, tau = _attn_inputs(L=8)
    lens = torch.tensor([8, 5])
    o = kd.lazy_attention(q, k, v, bias, tau, lengths=lens, backend="golden")
    assert torch.all(o[1, :, 5:] == 0)
    dq, dk, dv = torch.autograd.grad(o.square().sum() + o.sum(), (q, k, v))
    assert torch.all(dq[1, :, 5:] == 0) and torch.all(dk[1, :, 5:] == 0) and torch.all(dv[1, :, 5:] == 0)
    # the padding does not change the valid rows: same result as the truncated sequence
    o_short = kd.lazy_attention(*(t[1:2, :, :5] for t in (q, k, v)), bias, tau, backend="golden")
    torch.testing.assert_close(o[1:2, :, :5], o_short)
