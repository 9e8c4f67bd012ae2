"""mhc_pre(..., return_residual=True): x reaches mhc_post through pre, and the pre backward adds the
residual path's gradient of x inside its own dx (backend ``backward(..., dx_acc=...)``).

fp32: every backend that can run here is compared with golden float64 of the plain block (x passed
to both halves, autograd adding the two gradients), within the mhc_pre tolerances. bf16: the block
composes two ops (df is rounded to bf16 before it reaches pre), so it is compared with the same
backend's plain block instead: only dx may differ by its one rounding (one sum instead of two), the
other gradients only by summation order (fp32-level). The residual output is x itself.
"""
from __future__ import annotations

import pytest
import torch

import kernel_dispatch as kd
from kernel_dispatch import BACKEND_NAMES, registry

from .cases import MHCCase, make_inputs, upcast
from .tolerances import rel_err, tolerance

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
CASES = [MHCCase("residual", lead=(3, 5), D=24), MHCCase("residual_noncontig_nogamma", D=40, gamma=False,
                                                         noncontig=True)]


def _block(inp, gout, backend, residual: bool):
    t = {k: v.detach().clone().requires_grad_() for k, v in inp.tensors.items()}
    x, gamma = t["x"], t.get("gamma")
    if residual:
        h_in, h_post, h_res, x_res = kd.mhc_pre(x, t["phi"], t["alpha"], t["bias"], gamma, backend=backend,
                                                return_residual=True)
        assert x_res.shape == x.shape and torch.equal(x_res, x), "the residual output is not x"
    else:
        h_in, h_post, h_res = kd.mhc_pre(x, t["phi"], t["alpha"], t["bias"], gamma, backend=backend)
        x_res = x
    out = kd.mhc_post(h_in, x_res, h_post, h_res, backend=backend)
    leaves = [x, t["phi"], t["alpha"], t["bias"]] + ([gamma] if gamma is not None else [])
    grads = torch.autograd.grad(out, leaves, gout.to(out.dtype))
    names = ["dx", "dphi", "dalpha", "dbias"] + (["dgamma"] if gamma is not None else [])
    return {"out": out.detach(), **dict(zip(names, grads))}


@pytest.mark.parametrize("backend", BACKEND_NAMES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_residual_block_matches_golden_float64(case, dtype, backend):
    meta = {"device": DEVICE, "dtype": dtype, "n": case.n, "D": case.D}
    reasons = registry.why_not("mhc_pre", backend, meta) + registry.why_not("mhc_post", backend, meta)
    if reasons:
        pytest.skip(f"{backend}: " + "; ".join(reasons))
    inp = make_inputs("mhc_pre", case, dtype, DEVICE, seed=5)
    x = inp.tensors["x"]
    gen = torch.Generator(device="cpu").manual_seed(6)
    gout = torch.randn(x.shape, generator=gen).to(dtype).to(DEVICE)
    if dtype == torch.float32:
        ref = _block(upcast(inp), gout.double(), "golden", residual=False)
    else:
        ref = _block(inp, gout, backend, residual=False)
    got = _block(inp, gout, backend, residual=True)
    tf32 = getattr(registry.impl("mhc_pre", backend).caps, "tf32", False)
    for name, value in got.items():
        tol_dtype = dtype if (dtype == torch.float32 or name == "dx") else torch.float32
        tol = tolerance("mhc_post" if name == "out" else "mhc_pre", tol_dtype, name, tf32)
        err = rel_err(value, ref[name])
        assert err <= tol, f"{name}: rel err {err:.3e} > tol {tol:.3e}"


def test_return_residual_must_be_bool():
    inp = make_inputs("mhc_pre", CASES[0], torch.float32, "cpu")
    t = inp.tensors
    with pytest.raises(TypeError, match="return_residual"):
        kd.mhc_pre(t["x"], t["phi"], t["alpha"], t["bias"], t.get("gamma"), return_residual=1)


def test_unused_residual_output_costs_no_gradient():
    """The plain outputs alone still backpropagate (no gradient arrives for the residual output)."""
    inp = make_inputs("mhc_pre", CASES[0], torch.float64, "cpu")
    t = {k: v.clone().requires_grad_() for k, v in inp.tensors.items()}
    h_in, h_post, h_res, _ = kd.mhc_pre(t["x"], t["phi"], t["alpha"], t["bias"], t["gamma"], backend="golden",
                                        return_residual=True)
    dx, = torch.autograd.grad(h_in.sum() + h_post.sum() + h_res.sum(), [t["x"]])
    h_in2, h_post2, h_res2 = kd.mhc_pre(t["x"], t["phi"], t["alpha"], t["bias"], t["gamma"], backend="golden")
    dx2, = torch.autograd.grad(h_in2.sum() + h_post2.sum() + h_res2.sum(), [t["x"]])
    assert torch.equal(dx, dx2)
