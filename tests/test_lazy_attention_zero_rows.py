"""tau = -1 exactly: rows with one visible key are exactly zero on every backend."""
import pytest

from kernel_dispatch import registry
from kernel_dispatch.testing import matrix

from .cases import ATTN_CASES
from .test_equivalence import DEVICE, DTYPES

ONE_KEY_CASE = next(c for c in ATTN_CASES if c.name == "tau_minus1_one_key_rows")


@pytest.mark.parametrize("backend", registry.BACKEND_NAMES)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
def test_one_key_rows_at_tau_minus1_are_exactly_zero(backend, dtype):
    """tau = -1 exactly: a row with one visible key has P = 1 and A = relu(1 - 1) = 0, so its output
    row is exactly zero (SPEC: with tau <= -1 the first causal row is all zero); an ulp of rounding in
    the recomputed P must not leak through the relu (nor into dtau, checked by the matrix)."""
    inp = matrix.make_inputs("lazy_attention", ONE_KEY_CASE, dtype, DEVICE)
    reason = matrix.why_not("lazy_attention", backend, inp)
    if reason:
        pytest.skip(reason)
    o = matrix.run("lazy_attention", inp, backend, backward=False)["o"]
    assert (o[:, :, 0] == 0).all(), "o: the first causal row is not exactly zero at tau = -1"
    assert (o[1] == 0).all(), "o: batch 1 (lengths = 1: row 0 has one key, the rest is padding) is not zero"
