"""Every shipped config of the autotuned Triton lazy attention kernels, one at a time, on a GPU.

The autotuner may pick any config of a kernel's set, and the matrix runs whichever it picks. So on CUDA each
config of each kernel is forced alone (the autotuner sees a list of
one; the other two kernels stay autotuned), run twice through the public op with autograd on a case
that crosses several blocks (GQA, lengths, L not a block multiple, a bias band of several blocks), and
compared with golden float64 (tolerance table) and with itself (bitwise).
CPU: skipped (marked gpu; the interpreter runs one small config and neither races nor pipelines).
"""
from __future__ import annotations

import pytest
import torch

from .cases import AttnCase, make_inputs
from .forced_config import check_right_and_deterministic, force_config

CUDA = torch.cuda.is_available()
pytestmark = pytest.mark.gpu
KERNELS = ("fwd", "dq", "dkdv")
DTYPES = (torch.bfloat16, torch.float32)  # fp16 runs the configs of bf16 ("half")


def _case(D: int) -> AttnCase:
    return AttnCase(f"configs_d{D}", B=2, H=4, Hkv=2, L=1100, D=D, W=300, lengths=(1100, 777))


def _params():
    if not CUDA:
        skip = pytest.mark.skip(reason="forces compiled configs: CUDA only")
        return [pytest.param(None, None, None, None, marks=skip)]
    from kernel_dispatch.backends.triton import lazy_attention as tk
    out = []
    for kernel in KERNELS:
        for dtype in DTYPES:
            for D in (64, 128):
                for i, _c in enumerate(tk.shipped_configs(kernel, D, dtype)):
                    out.append(pytest.param(kernel, dtype, D, i, id=f"{kernel}-{str(dtype)[6:]}-d{D}-{i}"))
    return out


@pytest.mark.parametrize("kernel,dtype,D,index", _params())
def test_each_config_is_right_and_deterministic(kernel, dtype, D, index, monkeypatch):
    from kernel_dispatch.backends.triton import lazy_attention as tk
    config = tk.shipped_configs(kernel, D, dtype)[index]
    force_config(monkeypatch, tk.KERNELS[kernel], config)
    monkeypatch.delenv(tk.CONFIG_ENV, raising=False)
    inp = make_inputs("lazy_attention", _case(D), dtype, "cuda", seed=5)
    check_right_and_deterministic("lazy_attention", inp, dtype, (dtype, D), f"{kernel} config {config}")
