"""The Triton mHC pre forward (split-K GEMM -> mix -> apply) beyond the equivalence matrix.

- Every shipped CUDA tile config of the GEMM and of the apply kernel runs once through the
  interpreter (the launchers use one small config there), with the GEMM forced to 3 K splits of
  a D that no tile divides, so one split is partial and one empty.
- z and inv_rms (the residuals the matrix does not compare) against golden float64.
- CUDA only: the forward run twice is bitwise equal (the K splits are summed in a fixed order).
"""
from __future__ import annotations

import pytest
import torch

from kernel_dispatch.backends.triton import _mhc_pre_fwd as pre_fwd
from kernel_dispatch.backends.triton import _mhc_pre_fwd_apply as pre_apply
from kernel_dispatch.backends.triton import mhc_pre as tpre
from kernel_dispatch.backends.triton._mhc_common import INTERPRET, X_KINDS
from kernel_dispatch.golden import mhc_pre as golden

from .cases import MHCCase, make_inputs
from .tolerances import rel_err, tolerance

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
HP = (20, 2.0, 1e-6, 1e-6, 1e-6)  # sinkhorn_iters, post_mult, norm_eps, pre_eps, sinkhorn_eps
NAMES = ("h_in", "h_post", "h_res", "z", "inv_rms")
TOL_NAME = {"z": "h_post", "inv_rms": "h_post"}  # residuals: the bound of h_post = sigmoid(a1 z + b)


def _params(x):
    t = x.tensors
    return t["x"], t["phi"], t["alpha"], t["bias"], t.get("gamma")


def _check_forward(case: MHCCase, dtype: torch.dtype) -> None:
    inp = make_inputs("mhc_pre", case, dtype, DEVICE, seed=2)
    got = tpre.forward(*_params(inp), *HP)
    ref = golden.forward(*(None if t is None else t.double() for t in _params(inp)), *HP)
    for name, g, r in zip(NAMES, got, ref):
        assert torch.isfinite(g).all(), f"{name}: not every element written"
        err, tol = rel_err(g, r), tolerance("mhc_pre", dtype, TOL_NAME.get(name, name))
        assert err <= tol, f"{case.name} {name}: rel err {err:.3e} > tol {tol:.3e}"


def _config_params():
    params = []
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        gemm, apply = pre_fwd.gemm_configs(X_KINDS[dtype], 4), pre_apply.APPLY_CONFIGS
        for i in range(max(len(gemm), len(apply))):
            marks = () if dtype == torch.bfloat16 else pytest.mark.slow
            params.append(pytest.param(dtype, gemm[i % len(gemm)], apply[i % len(apply)],
                                       id=f"{str(dtype)[6:]}-{i}", marks=marks))
    return params


@pytest.mark.skipif(not INTERPRET, reason="the CUDA configs run natively in the GPU checks")
@pytest.mark.parametrize("dtype,gemm_cfg,apply_cfg", _config_params())
def test_cuda_configs_under_interpreter(dtype, gemm_cfg, apply_cfg, monkeypatch):
    monkeypatch.setattr(pre_fwd.mhc_pre_fwd_gemm_kernel, "configs", [gemm_cfg])
    monkeypatch.setattr(pre_apply.mhc_pre_fwd_apply_kernel, "configs", [apply_cfg])
    monkeypatch.setattr(tpre, "_fwd_splits", lambda T, D, device: 3)
    _check_forward(MHCCase("fwd_configs", lead=(70,), n=4, D=200, noncontig=True), dtype)


@pytest.mark.parametrize("case", [MHCCase("splits", lead=(9,), n=4, D=520),
                                  MHCCase("two_streams_no_gamma", lead=(5,), n=2, D=264, gamma=False)],
                         ids=lambda c: c.name)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_residuals_match_golden(case, dtype):
    _check_forward(case, dtype)


@pytest.mark.skipif(not CUDA, reason="determinism of the compiled kernels needs a CUDA device")
def test_forward_is_bitwise_deterministic():
    inp = make_inputs("mhc_pre", MHCCase("determinism", lead=(4099,), n=4, D=1024), torch.bfloat16, DEVICE, seed=3)
    assert tpre._fwd_splits(4099, 1024, inp.tensors["x"].device) > 1, "the case must use several K splits"
    first = tpre.forward(*_params(inp), *HP)
    for _ in range(3):
        for name, a, b in zip(NAMES, first, tpre.forward(*_params(inp), *HP)):
            assert torch.equal(a, b), f"mhc_pre forward {name} differs between two runs on the same inputs"
