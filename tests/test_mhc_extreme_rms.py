"""mHC pre's RMS does not overflow or underflow where the result is representable: x far from 1 (fp32 and bf16 reach
3.4e38, whose squares do not fit) gives the same h_in, h_post, h_res and gradients as golden float64 within the
documented tolerances, on every backend that runs here. The old mean(x^2) in fp32 was inf from |x| ~ 2e19 up, and
h_post, h_res silently those of z = 0."""
import pytest
import torch

from kernel_dispatch import declaration, registry
from kernel_dispatch.golden.mhc_pre import inverse_rms
from kernel_dispatch.testing import matrix

OP = "mhc_pre"
CASE = next(c for c in declaration.operator(OP).cases if c.name == "basic")
# x = scale * randn: x^2 overflows fp32 from ~2e19 up. At 1e36 every output and gradient is still a normal fp32
# number (dx ~ inv_rms ~ 1e-36 when dh_in = 0; dh_pre = x . dh_in ~ 1e37); nearer fp32's largest value they leave
# the range themselves.
SCALES = [1e-30, 1e19, 1e30, 1e36]


def _inputs(dtype, scale, zero_dh_in=False):
    inp = matrix.make_inputs(OP, CASE, dtype)
    x = (inp.tensors["x"].double() * scale).to(dtype)
    assert torch.isfinite(x).all()
    grads = (torch.zeros_like(inp.grads[0]),) + inp.grads[1:] if zero_dh_in else inp.grads
    return matrix.Inputs({**inp.tensors, "x": x}, inp.kwargs, grads)


def _params():
    for dtype in (torch.float32, torch.bfloat16):
        for backend in registry.BACKEND_NAMES:
            for scale in SCALES:
                yield pytest.param(backend, dtype, scale, id=f"{backend}-{str(dtype)[6:]}-{scale:g}")


@pytest.mark.parametrize("backend,dtype,scale", list(_params()))
def test_far_from_one_matches_golden_float64(backend, dtype, scale):
    _assert_matches_golden(backend, dtype, _inputs(dtype, scale))


@pytest.mark.parametrize("backend,dtype,scale", [p for p in _params() if p.values[2] <= 1e30])
def test_rms_term_of_dx_survives_without_dh_in(backend, dtype, scale):
    """With dh_in = 0, dx is G @ (phi * gamma) minus the RMS term, both of the size of inv_rms: the RMS term is kept
    (inv_rms^2 alone underflows past an RMS of 2^63). Up to 1e30: further on G = dz * inv_rms nears fp32's smallest
    normal numbers, where the kernels' bf16 (hi, lo) split of G loses the lo piece's bits."""
    _assert_matches_golden(backend, dtype, _inputs(dtype, scale, zero_dh_in=True))


def _assert_matches_golden(backend, dtype, inp):
    reason = matrix.why_not(OP, backend, inp)
    if reason:
        pytest.skip(reason)
    ref = matrix.run(OP, matrix.upcast(inp), "golden")
    failures = matrix.check_backend(OP, backend, matrix.run(OP, inp, backend), ref, dtype)
    assert not failures, "; ".join(failures)


def test_inverse_rms_is_exact_where_plain_fp32_is_finite_and_right_beyond():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 96, generator=g) * torch.logspace(-30, 38, 64)[:, None].clamp(max=1e38)
    got = inverse_rms(x, 1e-6)
    want = torch.rsqrt(x.double().square().mean(-1) + 1e-6)
    assert torch.allclose(got.double(), want, rtol=4 * 2.0 ** -24, atol=0)
    plain = torch.rsqrt(x.square().mean(-1) + 1e-6)
    finite = (x.square().mean(-1) < float("inf"))
    assert torch.equal(got[finite], plain[finite])  # power-of-two scaling: bit for bit the plain formula
    assert (~finite).any() and (plain[~finite] == 0).all()  # where the plain formula overflowed to inv_rms = 0
