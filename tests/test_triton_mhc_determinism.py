"""Run hygiene of the Triton mHC kernels, beyond the equivalence matrix.

Determinism on a GPU is tests/test_determinism_gpu.py (every backend, every case).

- Every output element is written: every buffer the launchers allocate is poisoned with NaN.
- Stream counts the matrix does not cover (n = 1 and 8), and token splits of the grad kernel
  that do not divide T.
- The CUDA tile configs: under the interpreter the launchers use one small config; here every
  shipped CUDA config runs once through the interpreter too, so the tile logic is tested with
  the tile shapes that the GPU runs.
"""
from __future__ import annotations

import pytest
import torch

from kernel_dispatch.backends.triton import _mhc_pre_bwd as pre_bwd
from kernel_dispatch.backends.triton import _mhc_pre_bwd_grad as pre_grad
from kernel_dispatch.backends.triton import _mhc_pre_fwd as pre_fwd
from kernel_dispatch.backends.triton import mhc_post as tpost
from kernel_dispatch.backends.triton import mhc_pre as tpre
from kernel_dispatch.backends.triton._mhc_common import INTERPRET, X_KINDS

from .cases import MHCCase, make_inputs, run, upcast
from .tolerances import rel_err, tolerance

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"


def _check(op: str, case: MHCCase, dtype: torch.dtype, seed: int = 0) -> None:
    """Triton through the public op (forward and backward) against golden float64, with the tolerance table."""
    inp = make_inputs(op, case, dtype, DEVICE, seed=seed)
    got, ref = run(op, inp, "triton"), run(op, upcast(inp), "golden")
    for name, value in got.items():
        assert torch.isfinite(value).all(), f"{op} {name}: not every element written (NaN/inf left)"
        err, tol = rel_err(value, ref[name]), tolerance(op, dtype, name)
        assert err <= tol, f"{op} {case.name} {name}: rel err {err:.3e} > tol {tol:.3e}"


@pytest.mark.parametrize("op", ["mhc_pre", "mhc_post"])
def test_every_output_element_is_written(op, monkeypatch):
    def poisoned(*shape, dtype, device):
        return torch.full(shape, float("nan"), dtype=dtype, device=device)

    monkeypatch.setattr(tpre, "_empty", poisoned)
    monkeypatch.setattr(tpost, "_empty", poisoned)
    _check(op, MHCCase("poison", lead=(37,), n=4, D=40), torch.float32, seed=1)


@pytest.mark.parametrize("op", ["mhc_pre", "mhc_post"])
@pytest.mark.parametrize("case", [MHCCase("one_stream", lead=(3, 5), n=1, D=48),
                                  MHCCase("eight_streams", lead=(19,), n=8, D=24, noncontig=True)],
                         ids=lambda c: c.name)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_stream_counts_outside_the_matrix(op, case, dtype):
    _check(op, case, dtype)


def test_grad_token_splits_that_do_not_divide_t(monkeypatch):
    monkeypatch.setattr(tpre, "_grad_splits", lambda T, n, D, device: (4, 16))  # 16 + 16 + 16 + 2 tokens
    _check("mhc_pre", MHCCase("splits", lead=(50,), n=4, D=24), torch.float32)


def _cuda_config_params():
    params = []
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        kind = X_KINDS[dtype]
        fwd, grad = pre_fwd.gemm_configs(kind, 4), pre_grad.grad_configs(kind, 4)
        tok, pf, pb = pre_bwd.TOKEN_CONFIGS, tpost.FWD_CONFIGS, tpost.BWD_CONFIGS
        for i in range(max(len(fwd), len(grad), len(tok), len(pf), len(pb))):
            cfgs = (fwd[i % len(fwd)], tok[i % len(tok)], grad[i % len(grad)], pf[i % len(pf)], pb[i % len(pb)])
            marks = () if dtype == torch.bfloat16 else pytest.mark.slow
            params.append(pytest.param(dtype, cfgs, id=f"{str(dtype)[6:]}-{i}", marks=marks))
    return params


@pytest.mark.skipif(not INTERPRET, reason="on a GPU the CUDA configs run natively "
                                           "(tests/test_triton_mhc_configs_gpu.py)")
@pytest.mark.parametrize("dtype,cfgs", _cuda_config_params())
def test_cuda_configs_under_interpreter(dtype, cfgs, monkeypatch):
    kernels = (pre_fwd.mhc_pre_fwd_gemm_kernel, pre_bwd.mhc_pre_bwd_token_kernel, pre_grad.mhc_pre_bwd_grad_kernel,
               tpost.mhc_post_fwd_kernel, tpost.mhc_post_bwd_kernel)
    for kernel, cfg in zip(kernels, cfgs):
        monkeypatch.setattr(kernel, "configs", [cfg])
    monkeypatch.setattr(tpre, "_grad_splits", lambda T, n, D, device: (2, 64))
    _check("mhc_pre", MHCCase("cuda_configs", lead=(70,), n=4, D=72), dtype)  # two token splits, D % 64 != 0
    _check("mhc_post", MHCCase("cuda_configs", lead=(9,), n=4, D=72), dtype)
