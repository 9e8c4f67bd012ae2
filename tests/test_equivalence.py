"""The equivalence matrix: operator x backend x dtype x case x direction, against golden float64.

Generated from the declarations: every declared operator, every registered backend, every declared case.
A case the backend cannot run here is skipped with the registry's reasons. Tensors the declaration names in
``per_head`` are also checked head by head, so a kernel right for head 0 only fails. Large ("big") cases
(``gpu_only``: realistic sizes, the kernels' head dims and feature sizes) are marked ``gpu`` and run on a CUDA
device only. Parameters run case by case, so each golden float64 reference is computed once for every backend.
Declarations made after collection (a test's own operator) run through :func:`check_case`.
"""
from __future__ import annotations

import functools

import pytest
import torch

from kernel_dispatch import declaration, registry
from kernel_dispatch.testing import matrix

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@functools.lru_cache(maxsize=8)
def _reference(op: str, case, dtype: torch.dtype):
    inp = matrix.make_inputs(op, case, dtype, DEVICE)
    return inp, matrix.run(op, matrix.upcast(inp), "golden")


@functools.lru_cache(maxsize=8)
def _result(op: str, backend: str, case, dtype: torch.dtype):
    inp, _ = _reference(op, case, dtype)
    return matrix.run(op, inp, backend)


def why_skip(op: str, backend: str, case, dtype: torch.dtype) -> str | None:
    """Why this cell of the matrix cannot run here, or None."""
    if case.gpu_only and DEVICE != "cuda":
        return "realistic size: runs on a CUDA device only"
    inp, _ = _reference(op, case, dtype)
    return matrix.why_not(op, backend, inp)


def check_case(op: str, backend: str, case, dtype: torch.dtype, direction: str) -> list[str]:
    """Failures of one cell against golden float64 (an empty list: it passes)."""
    decl = declaration.operator(op)
    _, ref = _reference(op, case, dtype)
    got = _result(op, backend, case, dtype)
    names = [n for n in ref if (n in decl.outputs) == (direction == "forward")]
    return matrix.check_backend(op, backend, got, ref, dtype, names)


def params(ops=None):
    for op in ops or declaration.operators():
        decl = declaration.operator(op)
        directions = ("forward", "backward") if decl.gradients else ("forward",)
        for case in decl.cases:
            marks = (pytest.mark.gpu,) if case.gpu_only else ()
            for dtype in DTYPES:
                for backend in registry.BACKEND_NAMES:
                    for direction in directions:
                        yield pytest.param(op, backend, case, dtype, direction, marks=marks,
                                           id=f"{op}-{backend}-{case.name}-{str(dtype)[6:]}-{direction}")


@pytest.mark.parametrize("op,backend,case,dtype,direction", list(params()))
def test_matches_golden_float64(op, backend, case, dtype, direction):
    reason = why_skip(op, backend, case, dtype)
    if reason:
        pytest.skip(reason)
    failures = check_case(op, backend, case, dtype, direction)
    assert not failures, "; ".join(failures)
