"""The cute kernels' first GPU check, in a child process with a time limit.

The cute kernels are warp-specialised (a TMA producer warp, consumer warpgroups taking turns through named barriers,
mbarrier pipelines): a synchronisation bug hangs the GPU instead of failing an assertion. This test runs one forward
and backward per head dim and mask through ``backend="cute"``, at a small shape and at one where every persistent
forward CTA takes several tiles (B=4, H=16, L=4096: a pipeline state that the tile loop fails to carry hangs only
once a CTA takes several tiles), in a child process that is killed after 120 s, so a hang fails here and the
numerics are left to the equivalence matrix (tests/test_equivalence.py). Run it first:

    pytest -m gpu tests/test_cute_hang_guard_gpu.py && pytest -m "gpu or not gpu" tests/test_equivalence.py -k cute
"""
import os
import subprocess
import sys

import pytest
import torch

from kernel_dispatch import registry

pytestmark = pytest.mark.gpu

CHILD = """
import torch, kernel_dispatch as kd
# (B, H, Hkv, L, lengths): small, then enough query blocks that every persistent forward CTA takes several tiles
SHAPES = ((2, 4, 2, 300, [300, 201]), (4, 16, 16, 4096, None))
for B, H, Hkv, L, lens in SHAPES:
    for D in (64, 128):
        for causal in (True, False):
            g = torch.Generator(device="cuda").manual_seed(D)
            q, k, v = (torch.randn(B, h, L, D, device="cuda", generator=g).to(torch.bfloat16).requires_grad_()
                       for h in (H, Hkv, Hkv))
            # a bias past the LSE kernel's exp range (_exp_band.EXP_RANGE) sends it to per-tile tables
            bias = torch.full((H, 40), 30.0 if (D == 64) == causal else 0.0, device="cuda", requires_grad=True)
            tau = torch.full((H,), -1.0, device="cuda", requires_grad=True)
            lengths = None if lens is None else torch.tensor(lens, device="cuda")
            o = kd.lazy_attention(q, k, v, bias, tau, causal=causal, lengths=lengths, backend="cute")
            o.float().square().sum().backward()
            grads = (q.grad, k.grad, v.grad, bias.grad, tau.grad)
            torch.cuda.synchronize()
            assert all(torch.isfinite(t).all() for t in (o, *grads)), (B, L, D, causal)
print("done")
"""


def test_forward_and_backward_finish_within_a_time_limit():
    meta = dict(device="cuda", dtype=torch.bfloat16, head_dim=128, causal=True)
    reasons = registry.why_not("lazy_attention", "cute", meta)
    if reasons:
        pytest.skip(f"cute cannot run lazy_attention here: {'; '.join(reasons)}")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        done = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=120, cwd=root)
    except subprocess.TimeoutExpired:
        pytest.fail("the cute kernels did not finish within 120 s: a pipeline or barrier wait that never completes")
    assert done.returncode == 0 and "done" in done.stdout, done.stderr[-4000:]
