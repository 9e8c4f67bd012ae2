"""Every backend that declares itself deterministic gives bitwise equal outputs and gradients when its forward and
backward run twice on the same inputs, for every declared operator and case (realistic sizes included), on a CUDA
device.

Generated like the equivalence matrix. Each run starts with the caching allocator's free blocks filled with NaN
bytes (``poison_cuda_cache``), and the inputs are finite, so an output element a kernel never writes fails here as
NaN instead of passing by reusing the previous run's memory.
CPU: skipped (marked ``gpu``; the interpreter runs programs one at a time, so it cannot race).
"""
from __future__ import annotations

import pytest
import torch

from kernel_dispatch import declaration, registry
from kernel_dispatch.testing import matrix

DTYPES = (torch.float32, torch.float16, torch.bfloat16)

pytestmark = pytest.mark.gpu


def _params():
    for op in declaration.operators():
        for case in declaration.operator(op).cases:
            for dtype in DTYPES:
                for backend in registry.BACKEND_NAMES:
                    yield pytest.param(op, backend, case, dtype, id=f"{op}-{backend}-{case.name}-{str(dtype)[6:]}")


@pytest.mark.parametrize("op,backend,case,dtype", list(_params()))
def test_rerun_is_bitwise_equal(op, backend, case, dtype):
    inp = matrix.make_inputs(op, case, dtype, "cuda")
    reason = matrix.why_not(op, backend, inp)
    if reason:
        pytest.skip(reason)
    if not registry.impl(op, backend).caps.deterministic:
        pytest.skip(f"{backend}: declares {op} not deterministic")
    results = []
    for _ in range(2):
        matrix.poison_cuda_cache()
        results.append(matrix.run(op, inp, backend))
    first, again = results
    for name, value in first.items():
        assert torch.isfinite(value).all(), f"{name}: NaN or inf in the output (an element left unwritten?)"
        assert torch.equal(value, again[name]), (
            f"{name} differs between two runs on the same inputs (max abs {(value - again[name]).abs().max():.3e})")
