"""The Triton lazy attention kernels with extreme and non-finite inputs, against golden (interpreter on the CPU).

- A large bias (exp2 of it overflows fp32 on its own) at a distance >= 1 with L not a multiple of the tile: the
  tile's rows past L must not form the exponential of their unloaded LSE (0 * inf would give NaN in dK, dV and
  dbias).
"""
from __future__ import annotations

import pytest
import torch

from kernel_dispatch.backends.triton import lazy_attention as tk
from kernel_dispatch.golden import lazy_attention as golden

from .tolerances import rel_err, tolerance

NAMES = ("o", "dq", "dk", "dv", "dbias", "dtau")


def _inputs(L: int, D: int = 16, H: int = 1, W: int = 2, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"q": torch.randn(1, H, L, D, generator=g), "k": torch.randn(1, H, L, D, generator=g),
            "v": torch.randn(1, H, L, D, generator=g), "bias": 0.5 * torch.randn(H, W, generator=g),
            "tau": torch.full((H,), -0.5), "do": torch.randn(1, H, L, D, generator=g)}


def _run(impl, t: dict, causal: bool) -> dict:
    scale = t["q"].shape[-1] ** -0.5
    args = (t["q"], t["k"], t["v"], t["bias"], t["tau"])
    o, lse = impl.forward(*args, scale, None, causal)
    grads = impl.backward(t["do"], *args, o, lse, scale, None, causal)
    return dict(zip(NAMES, (o, *grads)))


def _golden(t: dict, causal: bool) -> dict:
    return _run(golden, {name: x.double() for name, x in t.items()}, causal)


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("L", [5, 8, 40])
def test_large_bias_past_the_last_row(L, causal):
    t = _inputs(L)
    t["bias"] = torch.full((1, 2), 90.0)
    got, ref = _run(tk, t, causal), _golden(t, causal)
    for name in NAMES:
        assert torch.isfinite(got[name]).all(), f"{name}: not finite"
        err, tol = rel_err(got[name], ref[name]), tolerance("lazy_attention", torch.float32, name)
        assert err <= tol, f"{name}: rel err {err:.3e} > tol {tol:.3e}"
