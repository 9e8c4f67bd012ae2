"""The Triton autotuners tune once per size class, not once for every size (CPU).

The best tiles depend on the token count (mHC) and the sequence length (lazy attention) (docs/gpu-verification.md),
so every autotuned kernel's key must hold the size class, and the class must be the power-of-two band of the size.
"""
from __future__ import annotations

import pytest


def _mhc_tuners():
    from kernel_dispatch.backends.triton import _mhc_pre_bwd, _mhc_pre_bwd_grad, _mhc_pre_fwd, _mhc_pre_fwd_apply
    from kernel_dispatch.backends.triton import mhc_post
    return {"pre_fwd_gemm": _mhc_pre_fwd.mhc_pre_fwd_gemm_kernel,
            "pre_fwd_apply": _mhc_pre_fwd_apply.mhc_pre_fwd_apply_kernel,
            "pre_bwd_token": _mhc_pre_bwd.mhc_pre_bwd_token_kernel,
            "pre_bwd_grad": _mhc_pre_bwd_grad.mhc_pre_bwd_grad_kernel,
            "post_fwd": mhc_post.mhc_post_fwd_kernel, "post_bwd": mhc_post.mhc_post_bwd_kernel}


@pytest.mark.parametrize("name", list(_mhc_tuners()))
def test_mhc_keys_hold_the_size_class(name):
    assert "T_CLASS" in _mhc_tuners()[name].keys, f"{name}: autotune key {_mhc_tuners()[name].keys} lacks T_CLASS"


@pytest.mark.parametrize("kernel", ["fwd", "dq", "dkdv"])
def test_attention_keys_hold_the_size_class(kernel):
    from kernel_dispatch.backends.triton import lazy_attention as tk
    tuner = tk.KERNELS[kernel]
    assert "L_CLASS" in tuner.keys, f"{kernel}: autotune key {tuner.keys} lacks L_CLASS"


def test_size_class_is_the_power_of_two_band():
    from kernel_dispatch.backends.triton._autotune import size_class
    assert [size_class(n) for n in (1, 2, 3, 4, 4095, 4096, 8191, 8192, 16384)] == [1, 2, 2, 3, 12, 13, 13, 14, 15]
    assert size_class(0) == 1
