"""One autotuned Triton kernel run with a single forced config, checked against golden float64 and a rerun.

Shared by the GPU config tests of every Triton operator (tests/test_triton_*_configs_gpu.py): the autotuner
may pick any config of a kernel's set, so each one must be right and bitwise reproducible on its own.
"""
from __future__ import annotations

import torch

from .cases import Inputs, run, upcast
from .tolerances import rel_err, tolerance

_REF: dict = {}  # golden float64 results per (op, reference key), computed once per test session


def force_config(monkeypatch, tuner, config) -> None:
    """Make ``tuner`` (a triton Autotuner) run ``config`` alone, untuned and uncached, for one test."""
    monkeypatch.setattr(tuner, "configs", [config])
    monkeypatch.setattr(tuner, "cache", {})
    monkeypatch.setattr(tuner, "cache_results", False, raising=False)


def check_right_and_deterministic(op: str, inp: Inputs, dtype: torch.dtype, ref_key, label: str) -> None:
    """Run ``op`` on ``inp`` (activations in ``dtype``) twice through the Triton backend: bitwise equal runs,
    every output and gradient within the tolerance table of golden float64 (computed once per
    ``(op, ref_key)``, so ``ref_key`` must name the inputs); ``label`` names the config in failures."""
    if (op, ref_key) not in _REF:
        _REF[(op, ref_key)] = run(op, upcast(inp), "golden")
    ref = _REF[(op, ref_key)]
    first = run(op, inp, "triton")
    again = run(op, inp, "triton")
    for tensor, value in first.items():
        assert torch.equal(value, again[tensor]), f"{label}: {tensor} differs between two runs"
        err = rel_err(value, ref[tensor])
        tol = tolerance(op, dtype, tensor)
        assert err <= tol, f"{label}: {tensor} rel err {err:.3e} > tol {tol:.3e}"
