"""The equivalence matrix: operator x backend x dtype x shape x direction, against golden float64.

Generated from the registry: every registered backend of every operator appears; a case the
backend cannot run here is skipped with the registry's reasons. Gradients of per-head tensors
(dq, dk, dv) are checked head by head, so a kernel right for head 0 only fails.
GPU-only cases (realistic sizes, the kernels' head dims and feature sizes) are marked ``gpu``.
Parameters run case by case, so each golden float64 reference is computed once for every backend.
"""
from __future__ import annotations

import functools

import pytest
import torch

from kernel_dispatch import BACKEND_NAMES, OPERATORS, registry

from .cases import CASES, Inputs, make_inputs, meta, run, upcast
from .tolerances import rel_err, tolerance

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
PER_HEAD = {"dq", "dk", "dv", "o"}


@functools.lru_cache(maxsize=8)
def _reference(op: str, case, dtype: torch.dtype):
    inp = make_inputs(op, case, dtype, DEVICE)
    return inp, run(op, upcast(inp), "golden")


@functools.lru_cache(maxsize=8)
def _result(op: str, backend: str, case, dtype: torch.dtype):
    inp, _ = _reference(op, case, dtype)
    return run(op, inp, backend)


def _params():
    for op in OPERATORS:
        for case in CASES[op]:
            marks = (pytest.mark.gpu,) if case.gpu_only else ()
            for dtype in DTYPES:
                for backend in BACKEND_NAMES:
                    for direction in ("forward", "backward"):
                        yield pytest.param(op, backend, case, dtype, direction, marks=marks,
                                           id=f"{op}-{backend}-{case.name}-{str(dtype)[6:]}-{direction}")


@pytest.mark.parametrize("op,backend,case,dtype,direction", list(_params()))
def test_matches_golden_float64(op, backend, case, dtype, direction):
    reasons = registry.why_not(op, backend, meta(op, case, dtype, DEVICE))
    if reasons:
        pytest.skip(f"{backend}: " + "; ".join(reasons))
    _, ref = _reference(op, case, dtype)
    got = _result(op, backend, case, dtype)
    tf32 = getattr(registry.impl(op, backend).caps, "tf32", False)
    names = [n for n in ref if (n in _FORWARD[op]) == (direction == "forward")]
    failures = []
    for name in names:
        tol = tolerance(op, dtype, name, tf32)
        assert got[name].shape == ref[name].shape, f"{name}: shape {tuple(got[name].shape)} != {tuple(ref[name].shape)}"
        err = rel_err(got[name], ref[name])
        if err > tol:
            failures.append(f"{name}: rel err {err:.3e} > tol {tol:.3e}")
        if op == "lazy_attention" and name in PER_HEAD:
            for h in range(got[name].shape[1]):
                eh = rel_err(got[name][:, h], ref[name][:, h])
                if eh > tol:
                    failures.append(f"{name} head {h}: rel err {eh:.3e} > tol {tol:.3e}")
    assert not failures, "; ".join(failures)


_FORWARD = {"lazy_attention": {"o"}, "mhc_pre": {"h_in", "h_post", "h_res"}, "mhc_post": {"out"}}


ONE_KEY_CASE = next(c for c in CASES["lazy_attention"] if c.name == "tau_minus1_one_key_rows")


@pytest.mark.parametrize("backend", BACKEND_NAMES)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
def test_one_key_rows_at_tau_minus1_are_exactly_zero(backend, dtype):
    """tau = -1 exactly: a row with one visible key has P = 1 and A = relu(1 - 1) = 0, so its output
    row is exactly zero (SPEC: with tau <= -1 the first causal row is all zero); an ulp of rounding in
    the recomputed P must not leak through the relu (nor into dtau, checked by the matrix)."""
    case = ONE_KEY_CASE
    reasons = registry.why_not("lazy_attention", backend, meta("lazy_attention", case, dtype, DEVICE))
    if reasons:
        pytest.skip(f"{backend}: " + "; ".join(reasons))
    o = _result("lazy_attention", backend, case, dtype)["o"]
    assert (o[:, :, 0] == 0).all(), "o: the first causal row is not exactly zero at tau = -1"
    assert (o[1] == 0).all(), "o: batch 1 (lengths = 1: row 0 has one key, the rest is padding) is not zero"
