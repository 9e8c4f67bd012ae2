"""The cute forward's persistent kernels take their tiles from counters that the launcher keeps per (device, stream)
and that each kernel's last tile claim sets back to zero: calls of different sizes, on the default stream and on
another, give the same bits as the first call, and every kept counter is zero once the device is idle."""
import pytest
import torch

import kernel_dispatch as kd
from kernel_dispatch import registry
from kernel_dispatch.backends.cute import _kept

pytestmark = pytest.mark.gpu


def inputs(B: int, H: int, L: int, D: int, seed: int):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v = (torch.randn(B, H, L, D, device="cuda", generator=g).to(torch.bfloat16) for _ in range(3))
    return q, k, v, 0.5 * torch.randn(H, 64, device="cuda", generator=g), torch.full((H,), -1.0, device="cuda")


def test_repeated_calls_reuse_zeroed_counters():
    meta = dict(device="cuda", dtype=torch.bfloat16, head_dim=128, causal=True)
    reasons = registry.why_not("lazy_attention", "cute", meta)
    if reasons:
        pytest.skip(f"cute cannot run lazy_attention here: {'; '.join(reasons)}")
    shapes = [(4, 16, 4096, 128, 0), (2, 4, 300, 64, 1)]  # many tiles per CTA; fewer tiles than SMs
    cases = [inputs(*s) for s in shapes]
    first = [kd.lazy_attention(*c, causal=True, backend="cute") for c in cases]
    side = torch.cuda.Stream()
    for _ in range(3):
        for c, o in zip(cases, first):
            assert torch.equal(kd.lazy_attention(*c, causal=True, backend="cute"), o)
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                o_side = kd.lazy_attention(*c, causal=True, backend="cute")
            side.synchronize()
            assert torch.equal(o_side, o)
    torch.cuda.synchronize()
    counters = [store[("counters",)] for store in _kept._KEPT.values() if ("counters",) in store]
    assert len(counters) >= 2  # the default stream's pair and the side stream's
    assert all(int(c.abs().sum()) == 0 for c in counters)
