"""Every shipped config of the autotuned Triton mHC kernels, one at a time, at a size that fills the GPU.

A config with a pipelining race can pass at the small shapes of the matrix and give wrong, run-to-run
different results at T >= 1024 (triton 3.6 pre-forward GEMM configs, docs/gpu-verification.md), and the
autotuner may pick any config of a kernel's set. So on CUDA each config is forced alone (the autotuner
sees a list of one), run twice through the public ops with autograd at T = 2048, n = 4,
D = 1024, and compared with golden float64 (tolerance table) and with itself (bitwise).
CPU: skipped (marked gpu; the interpreter runs one config and neither races nor pipelines).
"""
from __future__ import annotations

import pytest
import torch

from .cases import MHCCase, make_inputs
from .forced_config import check_right_and_deterministic, force_config

CUDA = torch.cuda.is_available()
pytestmark = pytest.mark.gpu
CASE = MHCCase("configs", lead=(2048,), D=1024)
DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _kernels():
    from kernel_dispatch.backends.triton import _mhc_pre_bwd, _mhc_pre_bwd_grad, _mhc_pre_fwd, _mhc_pre_fwd_apply
    from kernel_dispatch.backends.triton import mhc_post
    return {"pre_fwd_gemm": (_mhc_pre_fwd.mhc_pre_fwd_gemm_kernel, _mhc_pre_fwd.gemm_configs),
            "pre_fwd_apply": (_mhc_pre_fwd_apply.mhc_pre_fwd_apply_kernel, lambda k, n: _mhc_pre_fwd_apply.APPLY_CONFIGS),
            "pre_bwd_token": (_mhc_pre_bwd.mhc_pre_bwd_token_kernel, lambda k, n: _mhc_pre_bwd.TOKEN_CONFIGS),
            "pre_bwd_grad": (_mhc_pre_bwd_grad.mhc_pre_bwd_grad_kernel, _mhc_pre_bwd_grad.grad_configs),
            "post_fwd": (mhc_post.mhc_post_fwd_kernel, lambda k, n: mhc_post.FWD_CONFIGS),
            "post_bwd": (mhc_post.mhc_post_bwd_kernel, lambda k, n: mhc_post.BWD_CONFIGS)}


def _params():
    if not CUDA:
        return [pytest.param(None, None, None, marks=pytest.mark.skip(reason="forces compiled configs: CUDA only"))]
    from kernel_dispatch.backends.triton._mhc_common import X_KINDS
    out = []
    for name, (_, configs) in _kernels().items():
        for dtype in DTYPES:
            for i, _c in enumerate(configs(X_KINDS[dtype], 4)):
                out.append(pytest.param(name, dtype, i, id=f"{name}-{str(dtype)[6:]}-{i}"))
    return out


@pytest.mark.parametrize("name,dtype,index", _params())
def test_each_config_is_right_and_deterministic(name, dtype, index, monkeypatch):
    from kernel_dispatch.backends.triton._mhc_common import X_KINDS
    kern, configs = _kernels()[name]
    config = configs(X_KINDS[dtype], 4)[index]
    force_config(monkeypatch, kern, config)
    op = "mhc_post" if name.startswith("post") else "mhc_pre"
    inp = make_inputs(op, CASE, dtype, "cuda", seed=11)
    check_right_and_deterministic(op, inp, dtype, dtype, f"{name} config {config}")
