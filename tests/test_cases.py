"""The test inputs themselves: lazy attention cases keep every score off the Elastic-Softmax relu kink.

At a score within fp32 rounding of P + tau/i = 0 the gradient depends on which side rounding lands, so an
exactly rounded fp32 evaluation misses a rounding-derived tolerance there (docs/gpu-verification.md, "Test
inputs off the relu kink"). ``make_inputs`` redraws the query rows that hold such a score; these tests hold
it to that.
"""
import pytest
import torch

from .cases import ATTN_CASES, KINK_MARGIN, away_from_kink, rows_near_kink, make_inputs

SMALL = [c for c in ATTN_CASES if not c.gpu_only]


@pytest.mark.parametrize("case", SMALL, ids=[c.name for c in SMALL])
@pytest.mark.parametrize("dtype", (torch.float32, torch.float16, torch.bfloat16), ids=lambda d: str(d)[6:])
def test_inputs_keep_scores_off_the_kink(case, dtype):
    inp = make_inputs("lazy_attention", case, dtype)
    t = inp.tensors
    assert rows_near_kink(t["q"], t["k"], t["bias"], t["tau"], inp.kwargs.get("lengths"), case.causal,
                          case.scale) == []


def test_a_score_on_the_kink_is_redrawn():
    """Row 1 with two equal scores has P = 1/2 on both keys; tau = -1 puts them exactly on the kink (i = 2)."""
    g = torch.Generator().manual_seed(0)
    q = torch.zeros(1, 1, 4, 8)
    k = torch.randn(1, 1, 4, 8, generator=g)
    q[0, 0, 2:] = torch.randn(2, 8, generator=g)
    bias, tau = torch.zeros(1, 1), torch.tensor([-1.0])
    near = rows_near_kink(q, k, bias, tau, None, True)
    assert [(b, h, rows.tolist()) for b, h, rows in near] == [(0, 0, [1])]
    before = q.clone()
    away_from_kink(q, k, bias, tau, None, True, lambda *shape: torch.randn(*shape, generator=g))
    assert rows_near_kink(q, k, bias, tau, None, True) == []
    assert not torch.equal(q[0, 0, 1], before[0, 0, 1]), "the row on the kink was not redrawn"
    assert torch.equal(q[0, 0, [0, 2, 3]], before[0, 0, [0, 2, 3]]), "rows off the kink changed"
    assert KINK_MARGIN > 0


def test_one_key_rows_are_exempt():
    """Row 0 (one visible key, P = 1 exactly) at tau = -1 sits on the kink by construction and stays."""
    q, k = torch.randn(1, 1, 3, 8), torch.randn(1, 1, 3, 8)
    near = rows_near_kink(q, k, torch.zeros(1, 1), torch.tensor([-1.0]), None, True)
    assert all(0 not in rows.tolist() for _, _, rows in near)
