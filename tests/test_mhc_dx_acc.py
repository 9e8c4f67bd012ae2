"""Every backend's mHC pre backward with an incoming gradient of x (``dx_acc``, the residual path).

``backward(..., dx_acc=...)`` must return dx = (its own dx) + dx_acc, added in fp32 inside the
kernel that writes dx and rounded once; compared with golden float64 ``backward(..., dx_acc=...)``
under the dx tolerance of the table. Contiguous and non-contiguous dx_acc, 16-bit and fp32 x, every
backend the registry can run here (reasons otherwise); a bad dx_acc is refused by name.
"""
from __future__ import annotations

import pytest
import torch

from kernel_dispatch import BACKEND_NAMES, registry
from kernel_dispatch.golden import mhc_pre as gpre

from .cases import MHCCase, make_inputs
from .tolerances import rel_err, tolerance

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
HP = (20, 2.0, 1e-6, 1e-6, 1e-6)  # sinkhorn_iters, post_mult, norm_eps, pre_eps, sinkhorn_eps
NAMES = ("dx", "dphi", "dalpha", "dbias", "dgamma")


def _dx_acc(shape, dtype, noncontig: bool, seed: int) -> torch.Tensor:
    g = torch.Generator(device="cpu").manual_seed(seed)
    if noncontig:  # [T, n, D] viewed from a [T, D, n] buffer: no unit stride on D
        return (3 * torch.randn(shape[0], shape[2], shape[1], generator=g)).to(dtype).to(DEVICE).transpose(1, 2)
    return (3 * torch.randn(*shape, generator=g)).to(dtype).to(DEVICE)


def _backend(case, dtype, backend):
    """The backend's mhc_pre kernels module, or skip with the registry's reasons."""
    reasons = registry.why_not("mhc_pre", backend, {"device": DEVICE, "dtype": dtype, "n": case.n, "D": case.D})
    if reasons:
        pytest.skip(f"{backend}: " + "; ".join(reasons))
    return registry.kernels("mhc_pre", backend)


@pytest.mark.parametrize("backend", BACKEND_NAMES)
@pytest.mark.parametrize("noncontig", [False, True], ids=["contig", "noncontig"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=["bf16", "fp16", "fp32"])
def test_dx_acc_is_added_before_the_one_rounding(dtype, noncontig, backend):
    case = MHCCase("residual", lead=(37,), n=4, D=40, noncontig=noncontig)
    tpre = _backend(case, dtype, backend)
    t = make_inputs("mhc_pre", case, dtype, DEVICE, seed=5).tensors
    x, phi, alpha, bias, gamma = t["x"], t["phi"], t["alpha"], t["bias"], t.get("gamma")
    grads = make_inputs("mhc_pre", case, dtype, DEVICE, seed=5).grads
    _, _, _, z, inv_rms = tpre.forward(x, phi, alpha, bias, gamma, *HP)
    dx_acc = _dx_acc(x.shape, dtype, noncontig, seed=6)
    assert noncontig == (not dx_acc.is_contiguous())
    got = tpre.backward(*grads, x, phi, alpha, bias, gamma, z, inv_rms, *HP, dx_acc=dx_acc)

    d = lambda v: None if v is None else v.double()  # noqa: E731
    ref = gpre.backward(*(d(g) for g in grads), d(x), d(phi), d(alpha), d(bias), d(gamma), d(z), d(inv_rms), *HP,
                        dx_acc=d(dx_acc))
    assert got[0].dtype == dtype and got[0].is_contiguous() and got[0].data_ptr() != dx_acc.data_ptr()
    for name, value, want in zip(NAMES, got, ref):
        if want is None:
            continue
        err, tol = rel_err(value, want), tolerance("mhc_pre", dtype, name)
        assert err <= tol, f"{name}: rel err {err:.3e} > tol {tol:.3e}"
    # dx_acc must really be in there (it dominates dx here), not just within tolerance of it
    without = tpre.backward(*grads, x, phi, alpha, bias, gamma, z, inv_rms, *HP)[0]
    assert rel_err(got[0], without.double() + dx_acc.double()) < 0.05


@pytest.mark.parametrize("backend", BACKEND_NAMES)
def test_dx_acc_checked(backend):
    case = MHCCase("residual_bad", lead=(5,), n=4, D=16)
    dtype = torch.float32 if backend != "tilelang" else torch.bfloat16
    tpre = _backend(case, dtype, backend)
    t = make_inputs("mhc_pre", case, dtype, DEVICE).tensors
    grads = make_inputs("mhc_pre", case, dtype, DEVICE).grads
    args = (t["x"], t["phi"], t["alpha"], t["bias"], None)
    _, _, _, z, inv_rms = tpre.forward(*args, *HP)
    with pytest.raises(ValueError, match="dx_acc"):
        tpre.backward(*grads, *args, z, inv_rms, *HP, dx_acc=torch.zeros(5, 4, 15, dtype=dtype, device=DEVICE))
    with pytest.raises(TypeError, match="dx_acc"):
        tpre.backward(*grads, *args, z, inv_rms, *HP, dx_acc=torch.zeros(5, 4, 16, dtype=torch.float16, device=DEVICE))
