"""A whole training step (forward and backward) captured in a CUDA graph replays to the eager results, bitwise.

At small shapes the ops are host-bound (docs/lazy-attention-speed.md, "The host": the mHC block at T=4096 needs
about 1.5 ms of host time for 0.3-0.7 ms of GPU work), and capture removes the host cost. That needs every kernel
on torch's current stream, allocations through the caching allocator and no host synchronisation once warm; a
backend that broke any of these would fail the capture or replay stale results. The replay runs on inputs changed
in place after the capture, so it must recompute, not return what capture computed.
CPU: skipped (marked gpu: CUDA graphs need a CUDA device).
"""
from __future__ import annotations

import pytest
import torch

import kernel_dispatch as kd
from kernel_dispatch import registry
from kernel_dispatch.cuda_graphs import capture

pytestmark = pytest.mark.gpu

BACKENDS = ("triton", "tilelang", "cute")


def _skip_unless_runs(op: str, backend: str, meta: dict) -> None:
    reasons = registry.why_not(op, backend, meta)
    if reasons:
        pytest.skip(f"{backend} cannot run {op} here: {'; '.join(reasons)}")


def _capture_and_check(step, leaves):
    """Warm up on a side stream, capture ``step``, change ``leaves`` in place, replay, compare with eager."""
    graph, captured = capture(step)
    with torch.no_grad():
        for t in leaves:
            t.mul_(0.75)
    graph.replay()
    torch.cuda.synchronize()
    expected = step()
    assert len(captured) == len(expected)
    for i, (got, want) in enumerate(zip(captured, expected)):
        assert torch.equal(got, want), f"output {i}: replay differs from eager (max abs {(got - want).abs().max()})"


@pytest.mark.parametrize("backend", BACKENDS)
def test_lazy_attention_step_replays(backend):
    B, H, Hkv, L, D, W = 2, 4, 2, 300, 64, 40
    meta = {"device": "cuda", "dtype": torch.bfloat16, "head_dim": D, "gqa": True, "lengths": False, "causal": True,
            "bias_length": W}
    _skip_unless_runs("lazy_attention", backend, meta)
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(B, H, L, D, device="cuda", generator=g).bfloat16().requires_grad_()
    k, v = (torch.randn(B, Hkv, L, D, device="cuda", generator=g).bfloat16().requires_grad_() for _ in range(2))
    bias = (0.5 * torch.randn(H, W, device="cuda", generator=g)).requires_grad_()
    tau = torch.tensor([-1.2, -0.8, 0.3, -0.5], device="cuda").requires_grad_()
    do = torch.randn(B, H, L, D, device="cuda", generator=g).bfloat16()
    leaves = (q, k, v, bias, tau)

    def step():
        o = kd.lazy_attention(q, k, v, bias, tau, backend=backend)
        return (o, *torch.autograd.grad(o, leaves, do))

    _capture_and_check(step, (q, k, v))


@pytest.mark.parametrize("backend", BACKENDS)
def test_mhc_block_step_replays(backend):
    T, n, D = 96, 4, 4096
    M = n * n + 2 * n
    _skip_unless_runs("mhc_pre", backend, {"device": "cuda", "dtype": torch.bfloat16, "n": n, "D": D})
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(T, n, D, device="cuda", generator=g).bfloat16().requires_grad_()
    phi = (0.05 * torch.randn(M, n * D, device="cuda", generator=g)).requires_grad_()
    alpha = torch.tensor([0.8, 1.2, 0.9], device="cuda").requires_grad_()
    bias = (0.3 * torch.randn(M, device="cuda", generator=g)).requires_grad_()
    gamma = (1 + 0.1 * torch.randn(n * D, device="cuda", generator=g)).requires_grad_()
    gout = torch.randn(T, n, D, device="cuda", generator=g).bfloat16()
    leaves = (x, phi, alpha, bias, gamma)

    def step():
        h_in, h_post, h_res, x_res = kd.mhc_pre(x, phi, alpha, bias, gamma, backend=backend, return_residual=True)
        out = kd.mhc_post(h_in, x_res, h_post, h_res, backend=backend)
        return (out, *torch.autograd.grad(out, leaves, gout))

    _capture_and_check(step, (x, phi))


def test_tilelang_constants_first_made_inside_capture():
    """A shape first met inside a capture: the launchers' reused constants (1/i of causal rows, ones for
    gamma=None) are made by kernels that capture only records, so they must not be cached for later eager calls."""
    _skip_unless_runs("lazy_attention", "tilelang", {"device": "cuda", "dtype": torch.bfloat16, "head_dim": 64,
                                                     "gqa": False, "lengths": False, "causal": True,
                                                     "bias_length": 8})
    _skip_unless_runs("mhc_pre", "tilelang", {"device": "cuda", "dtype": torch.bfloat16, "n": 4, "D": 4096})
    g = torch.Generator(device="cuda").manual_seed(1)

    def attn_inputs(B, L):
        q, k, v = (torch.randn(B, 2, L, 64, device="cuda", generator=g).bfloat16().requires_grad_()
                   for _ in range(3))
        bias = (0.5 * torch.randn(2, 8, device="cuda", generator=g)).requires_grad_()
        tau = torch.tensor([-0.9, -0.6], device="cuda").requires_grad_()
        return (q, k, v, bias, tau), torch.randn(B, 2, L, 64, device="cuda", generator=g).bfloat16()

    def mhc_inputs(T):
        x = torch.randn(T, 4, 4096, device="cuda", generator=g).bfloat16().requires_grad_()
        phi = (0.05 * torch.randn(24, 4 * 4096, device="cuda", generator=g)).requires_grad_()
        alpha = torch.tensor([0.8, 1.2, 0.9], device="cuda").requires_grad_()
        bias = (0.3 * torch.randn(24, device="cuda", generator=g)).requires_grad_()
        return (x, phi, alpha, bias), torch.randn(T, 4, 4096, device="cuda", generator=g).bfloat16()

    def attn_step(leaves, do):
        o = kd.lazy_attention(*leaves, backend="tilelang")
        return (o, *torch.autograd.grad(o, leaves, do))

    def mhc_step(leaves, gout):
        h_in, h_post, h_res, x_res = kd.mhc_pre(*leaves, None, backend="tilelang", return_residual=True)
        out = kd.mhc_post(h_in, x_res, h_post, h_res, backend="tilelang")
        return (out, *torch.autograd.grad(out, leaves, gout))

    # compile and load the kernels at other shapes; gamma=None only inside the capture
    attn_step(*attn_inputs(1, 96))
    warm_x, warm_g = mhc_inputs(8)
    h_in, h_post, h_res, x_res = kd.mhc_pre(*warm_x, warm_x[0].new_ones(4 * 4096).float(), backend="tilelang",
                                            return_residual=True)
    torch.autograd.grad(kd.mhc_post(h_in, x_res, h_post, h_res, backend="tilelang"), warm_x, warm_g)
    torch.cuda.synchronize()
    attn, mhc = attn_inputs(3, 200), mhc_inputs(16)
    graph, captured = capture(lambda: attn_step(*attn) + mhc_step(*mhc), warmup=0)
    # eager before any replay: a constant cached during the capture would still hold unwritten memory here
    expected = attn_step(*attn) + mhc_step(*mhc)
    graph.replay()
    torch.cuda.synchronize()
    for i, (got, want) in enumerate(zip(captured, expected)):
        assert torch.equal(got, want), f"output {i}: eager after the capture differs from the replay"
