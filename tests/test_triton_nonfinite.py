"""The Triton lazy attention kernels with extreme and non-finite inputs, against golden (interpreter on the CPU).

- A large bias (exp2 of it overflows fp32 on its own) at a distance >= 1 with L not a multiple of the tile: the
  tile's rows past L must not form the exponential of their unloaded LSE (they did, and 0 * inf gave NaN in dK,
  dV and dbias).
- A bias of 1e7 at distance 1 (scores beyond 2^24, where one fp32 ulp is >= 1): the dominant key's P must be 1 in the
  backward, which recovers LSE2 from the stored natural-log LSE; a round trip one ulp high made it 1/2 (dq wrong
  by 15x, silently), one ulp low made it 2, and on the GPU an FFMA-fused conversion made it inf.
- A NaN in q, k, v, bias or tau: the outputs are NaN exactly where golden's are (a NaN score poisons its row; the
  relu must keep NaN, not turn it into 0).
"""
from __future__ import annotations

import pytest
import torch

from kernel_dispatch.backends.triton import lazy_attention as tk
from kernel_dispatch.golden import lazy_attention as golden

from .tolerances import rel_err, tolerance

NAMES = ("o", "dq", "dk", "dv", "dbias", "dtau")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # the CPU runs the kernels through the interpreter


def _inputs(L: int, D: int = 16, H: int = 1, W: int = 2, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"q": torch.randn(1, H, L, D, generator=g), "k": torch.randn(1, H, L, D, generator=g),
            "v": torch.randn(1, H, L, D, generator=g), "bias": 0.5 * torch.randn(H, W, generator=g),
            "tau": torch.full((H,), -0.5), "do": torch.randn(1, H, L, D, generator=g)}


def _run(impl, t: dict, causal: bool) -> dict:
    t = {name: x.to(DEVICE) for name, x in t.items()}
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


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_dominant_bias_beyond_two_to_the_24(seed):
    """Causal only: each row then has one key at distance 1. Without the causal mask a row's keys at m - 1 and
    m + 1 both carry the bias, and two scores near 1.4e7 differ by less than fp32 resolves there (one ulp is 1 in
    log2 units): no fp32 kernel can match float64 on such a row."""
    t = _inputs(6, seed=seed)
    t["bias"] = torch.tensor([[0.0, 1e7]])
    got, ref = _run(tk, t, True), _golden(t, True)
    for name in NAMES:
        err, tol = rel_err(got[name], ref[name]), tolerance("lazy_attention", torch.float32, name)
        assert err <= tol, f"{name}: rel err {err:.3e} > tol {tol:.3e}"


# (input, index of the element made NaN)
NAN_AT = [("q", (0, 0, 3, 1)), ("k", (0, 1, 2, 0)), ("v", (0, 0, 4, 5)), ("bias", (1, 1)), ("tau", (0,))]


def _with_nan(name: str, index: tuple) -> dict:
    t = _inputs(L=7, H=2, W=3, seed=1)
    t[name][index] = float("nan")
    return t


@pytest.mark.parametrize("name,index", NAN_AT, ids=[n for n, _ in NAN_AT])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_nan_in_forward_where_golden(name, index, causal):
    t = _with_nan(name, index)
    got, ref = _run(tk, t, causal)["o"], _golden(t, causal)["o"]
    assert torch.isnan(ref).any(), "the case must make golden's output NaN somewhere"
    assert torch.equal(torch.isnan(got), torch.isnan(ref)), (
        f"o: NaN at {torch.isnan(got).nonzero().tolist()}, golden at {torch.isnan(ref).nonzero().tolist()}")
    finite = ~torch.isnan(ref)
    assert rel_err(got[finite], ref[finite]) <= tolerance("lazy_attention", torch.float32, "o")


@pytest.mark.parametrize("name,index", NAN_AT, ids=[n for n, _ in NAN_AT])
def test_nan_in_backward_where_golden(name, index):
    """Without a causal mask every key is visited by every row, so the NaN positions of golden's dense backward are
    the kernels' too."""
    t = _with_nan(name, index)
    got, ref = _run(tk, t, False), _golden(t, False)
    for out in NAMES[1:]:
        assert torch.equal(torch.isnan(got[out]), torch.isnan(ref[out])), (
            f"{out}: NaN at {torch.isnan(got[out]).nonzero().tolist()}, "
            f"golden at {torch.isnan(ref[out]).nonzero().tolist()}")
