"""The cute forward's LSE kernel folds its bias-band tiles in the exp domain (its table holds exp2 of the log2-domain
bias) where every bias of the head's table is within ``EXP_RANGE``, and takes per-tile tables of the log2-domain bias
otherwise. Both paths against golden float64, the forward and its gradients (the backward reads the stored LSE), with
one head per bias range: the usual, wide but inside the range, past it, and a distance masked by a bias of -1e4."""
import pytest
import torch

from kernel_dispatch.backends.cute._exp_band import EXP_RANGE
from kernel_dispatch.ops.lazy_attention_cases import away_from_kink
from kernel_dispatch.testing.matrix import Inputs, check_backend, run, upcast, why_not

pytestmark = pytest.mark.gpu

LOG2E = 1.4426950408889634


def head_biases(W: int, g: torch.Generator) -> torch.Tensor:
    """[4, W] fp32: 0.5 randn; scaled to a log2 magnitude of 0.9 EXP_RANGE (the exp path); to 1.8 EXP_RANGE (the
    per-tile tables); 0.5 randn with every seventh distance at -1e4 (the per-tile tables)."""
    base = torch.randn(4, W, generator=g)
    inside = base[1] * (0.9 * EXP_RANGE / LOG2E) / base[1].abs().max()
    past = base[2] * (1.8 * EXP_RANGE / LOG2E) / base[2].abs().max()
    masked = 0.5 * base[3]
    masked[::7] = -1e4
    return torch.stack([0.5 * base[0], inside, past, masked])


@pytest.mark.parametrize("scale", [None, 0.0], ids=["default_scale", "zero_scale"])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("D", [64, 128])
def test_band_fold_paths_match_golden(D, causal, scale):
    """One head per bias range (:func:`head_biases`); scale 0 too (the launcher's q * 0 with scale 1)."""
    B, H, L, W = 2, 4, 700, 300
    g = torch.Generator().manual_seed(D)

    def rnd(*shape):
        return torch.randn(*shape, generator=g).to(torch.bfloat16)

    q, k, v, do = (rnd(B, H, L, D) for _ in range(4))
    bias = head_biases(W, g)
    lengths = torch.tensor([L, 433])
    if scale == 0:  # every score 0: no q moves a row off the relu kink, a positive tau keeps every row off it
        tau = torch.tensor([0.2, 0.3, 0.1, 0.25])
    else:
        tau = torch.tensor([-1.0, -0.5, 0.2, -1.0])
        away_from_kink(q, k, bias, tau, lengths, causal, rnd)  # a relu kink makes the gradients ill-conditioned
    q, k, v, do, bias, tau = (t.cuda() for t in (q, k, v, do, bias, tau))
    kwargs = {"causal": causal, "lengths": lengths.cuda()} | ({} if scale is None else {"scale": scale})
    inp = Inputs({"q": q, "k": k, "v": v, "bias": bias, "tau": tau}, kwargs, (do,))
    reason = why_not("lazy_attention", "cute", inp)
    if reason:
        pytest.skip(reason)
    got = run("lazy_attention", inp, "cute")
    ref = run("lazy_attention", upcast(inp), "golden")
    assert got["o"].isfinite().all()
    assert check_backend("lazy_attention", "cute", got, ref, torch.bfloat16) == []
