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


class _FakeKernel:
    """Stands in for an autotuned kernel: ``fn.warmup`` returns a compiled kernel needing ``needs[BLOCK]`` bytes."""

    __name__ = "fake_kernel"

    arg_names = ["HEAD_DIM", "BLOCK"]

    def __init__(self, needs: dict):
        self.needs, self.fn = needs, self

    def warmup(self, grid, **kwargs):
        from types import SimpleNamespace
        return SimpleNamespace(metadata=SimpleNamespace(shared=self.needs[kwargs["BLOCK"]]))


def test_configs_that_do_not_fit_the_device_are_left_out(monkeypatch):
    import torch
    import triton

    from kernel_dispatch.backends.triton import _autotune
    monkeypatch.setattr(_autotune, "shared_memory_limit", lambda index: 101376)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "a small GPU")
    configs = [triton.Config({"BLOCK": b}, num_warps=4, num_stages=2) for b in (128, 64, 32)]
    kernel = _FakeKernel({128: 180000, 64: 101376, 32: 40000})
    # the autotuner's prune hook passes launch options (the grid) with the kernel's arguments
    launch = {"HEAD_DIM": 64, "grid": (7, 1, 1)}
    assert [c.kwargs["BLOCK"] for c in _autotune.fitting(kernel, configs, launch)] == [64, 32]
    with pytest.raises(_autotune.NoFittingConfig, match="fake_kernel.*101376 bytes"):
        _autotune.fitting(kernel, configs[:1], {"HEAD_DIM": 64})


def test_a_device_below_the_needs_gets_a_reason(monkeypatch):
    from types import SimpleNamespace

    import torch

    from kernel_dispatch.backends.triton import _fit
    monkeypatch.setattr(_fit, "NEEDS", {"lazy_attention": 99000})
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    for limit, expected in ((65536, True), (99000, False), (232448, False)):
        props = SimpleNamespace(name="some GPU", shared_memory_per_block_optin=limit, shared_memory_per_block=49152)
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index, p=props: p)
        reason = _fit.unfit_reason("lazy_attention", {"device": "cuda"})
        assert (reason is not None) == expected, (limit, reason)
        if expected:
            assert "65536 bytes of shared memory per block" in reason and "99000" in reason
    assert _fit.unfit_reason("lazy_attention", {"device": "cpu"}) is None


def test_lazy_attention_needs_depend_on_dtype_and_head_dim(monkeypatch):
    """An RTX-class GPU (101376 bytes per block) runs bf16 and fp16 at head dim 128 but not fp32 at 128: its dK/dV
    kernel's smallest config needs 106752 bytes there (sm_89 build), so the registry gives the reason."""
    from types import SimpleNamespace

    import torch

    from kernel_dispatch.backends.triton import _fit
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    props = SimpleNamespace(name="RTX-like", shared_memory_per_block_optin=101376, shared_memory_per_block=49152)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: props)
    for op in ("lazy_attention", "lazy_attention_varlen"):
        for dtype, head_dim, refused in ((torch.float32, 128, True), (torch.float32, 64, False),
                                         (torch.bfloat16, 128, False), (torch.float16, 32, False)):
            reason = _fit.unfit_reason(op, {"device": "cuda", "dtype": dtype, "head_dim": head_dim})
            assert (reason is not None) == refused, (op, dtype, head_dim, reason)
            if refused:
                assert "101376 bytes" in reason and "106752" in reason


def test_a_pinned_config_launches_with_a_key_argument_left_at_its_default(monkeypatch):
    """KERNEL_DISPATCH_TRITON_CONFIG=i: a launch that leaves a key argument at its default (the fixed-length attention
    kernels' VARLEN) runs config i of the fitting ones."""
    import torch
    import triton

    from kernel_dispatch.backends.triton import _autotune
    configs = [triton.Config({"BLOCK": b}, num_warps=4, num_stages=2) for b in (64, 32)]
    launched = []

    class Pinned:
        arg_names, keys = ["X", "HEAD_DIM"], ["HEAD_DIM", "VARLEN"]

        def __init__(self):
            self.configs, self.fn = configs, self

        def class_configs(self, args):
            return configs

        def __getitem__(self, grid):
            return lambda *args, **kwargs: launched.append(kwargs["BLOCK"])

    monkeypatch.setenv(_autotune.CONFIG_ENV, "1")
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(_autotune, "fitting", lambda kernel, cs, named: cs)
    _autotune.launch(Pinned(), (1,), torch.zeros(1), HEAD_DIM=64)
    assert launched == [32]
