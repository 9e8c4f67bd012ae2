"""GPU check of the Hopper forward ``fwd_sm90`` (TMA + wgmma, warp-specialised; built and stored, not yet used by the
cute backend): O and LSE against golden in float64, next to the shipped ``fwd`` kernel on the same inputs.

The new kernel passes a case when its error is at most twice the shipped kernel's plus one rounding step of the
output dtype (the shipped kernel passed the equivalence matrix on an H100, docs/cute-backend.md), and the LSE is
the golden float64 one within fp32 rounding of the score range. Run the smoke test alone first: a synchronisation
bug in a warp-specialised kernel hangs rather than fails, so it runs in a child process with a time limit.

    KERNEL_DISPATCH_CUTE_KERNELS=DIR [KERNEL_DISPATCH_CUTE_RUNTIME=RT] pytest -m gpu tests/test_cute_fwd_sm90_gpu.py
"""
import math
import os
import subprocess
import sys

import pytest
import torch

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
    pytest.skip("fwd_sm90 needs a Hopper GPU (sm_90)", allow_module_level=True)

from kernel_dispatch.backends.cute import _store  # noqa: E402
from kernel_dispatch.backends.cute._kernel_key import KernelKey  # noqa: E402
from kernel_dispatch.backends.cute.lazy_attention_fwd import forward as launch  # noqa: E402
from kernel_dispatch.golden import lazy_attention as golden  # noqa: E402

_NAMES = {torch.float16: "float16", torch.bfloat16: "bfloat16"}


def _kernel(which: str, D: int, dtype, causal: bool):
    key = KernelKey(which, D, _NAMES[dtype], causal)
    return lambda _name: _store.function(key)  # the launcher asks for "fwd"; the arguments are the same


def _inputs(B, H, Hkv, L, D, W, dtype, tau_value, lengths, nan_padding, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(B, H, L, D, device="cuda", generator=g).to(dtype)
    k = torch.randn(B, Hkv, L, D, device="cuda", generator=g).to(dtype)
    v = torch.randn(B, Hkv, L, D, device="cuda", generator=g).to(dtype)
    bias = torch.randn(H, W, device="cuda", generator=g) * 0.5
    tau = torch.full((H,), tau_value, device="cuda")
    lens = None if lengths is None else torch.tensor(lengths, dtype=torch.int32, device="cuda")
    if nan_padding and lens is not None:
        pad = torch.arange(L, device="cuda")[None, :] >= lens[:, None]
        for t in (q, k, v):
            t.masked_fill_(pad.view(B, 1, L, 1), float("nan"))
    return q, k, v, bias, tau, lens


def _run_case(B, H, Hkv, L, D, W, dtype, causal, tau_value, lengths, nan_padding=False):
    q, k, v, bias, tau, lens = _inputs(B, H, Hkv, L, D, W, dtype, tau_value, lengths, nan_padding)
    scale = 1.0 / math.sqrt(D)
    o_new, lse_new = launch(_kernel("fwd_sm90", D, dtype, causal), q, k, v, bias, tau, scale, lens, causal)
    o_old, lse_old = launch(_kernel("fwd", D, dtype, causal), q, k, v, bias, tau, scale, lens, causal)
    torch.cuda.synchronize()
    o_ref, lse_ref = golden.forward(q.double(), k.double(), v.double(), bias.double(), tau.double(), scale, lens,
                                    causal)
    if lens is not None:  # rows >= lengths[b]: O exactly zero in every backend
        pad = torch.arange(L, device="cuda")[None, :] >= lens[:, None]
        assert (o_new.float()[pad.view(B, 1, L, 1).expand_as(o_new)] == 0).all(), "padded rows not zero"
    ulp = torch.finfo(dtype).eps * max(1.0, o_ref.abs().max().item())
    err_new = (o_new.double() - o_ref).abs().nan_to_num(float("inf")).max().item()
    err_old = (o_old.double() - o_ref).abs().nan_to_num(float("inf")).max().item()
    assert err_new <= 2 * err_old + ulp, f"O: fwd_sm90 error {err_new:.3g}, shipped fwd {err_old:.3g}"
    finite = torch.isfinite(lse_ref)
    assert torch.equal(torch.isfinite(lse_new), finite) and torch.equal(lse_new[~finite], lse_ref[~finite].float())
    lse_tol = 4 * torch.finfo(torch.float32).eps * (lse_ref[finite].abs().max().item() + 8.0) if finite.any() else 0
    lse_err = (lse_new.double()[finite] - lse_ref[finite]).abs().max().item() if finite.any() else 0.0
    assert lse_err <= max(lse_tol, 2 * (lse_old.double()[finite] - lse_ref[finite]).abs().max().item()), lse_err


def test_smoke_in_a_child_process_with_a_time_limit():
    """One small causal case; a hang (a pipeline or barrier bug) fails here after 120 s instead of stalling."""
    code = ("import tests.test_cute_fwd_sm90_gpu as t, torch;"
            "t._run_case(1, 2, 1, 300, 128, 40, torch.bfloat16, True, -1.0, None); print('ok')")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert done.returncode == 0 and "ok" in done.stdout, done.stderr[-4000:]


CASES = [
    # B, H, Hkv, L, W, causal, tau, lengths
    (1, 2, 1, 1, 8, True, -1.0, None),  # one query, one key
    (2, 4, 2, 128, 16, True, -1.0, None),  # exactly one tile
    (2, 4, 2, 300, 40, True, -1.0, None),  # partial last tiles
    (2, 4, 4, 1000, 512, True, -0.5, None),
    (2, 4, 2, 777, 2000, True, 0.5, None),  # W > L, tau > 0
    (2, 4, 2, 777, 64, False, -1.0, None),
    (2, 4, 2, 700, 100, True, -2.0, [700, 259]),  # padding, tau < -1
    (2, 4, 2, 700, 100, False, -1.0, [1, 390]),
    (3, 2, 1, 256, 30, True, -1.0, [0, 128, 129]),  # an empty row, tile-edge lengths
]


@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", CASES, ids=[f"case{i}" for i in range(len(CASES))])
def test_fwd_sm90_matches_golden_like_the_shipped_forward(case, dtype, D):
    B, H, Hkv, L, W, causal, tau, lengths = case
    _run_case(B, H, Hkv, L, D, W, dtype, causal, tau, lengths)


@pytest.mark.parametrize("causal", [True, False])
def test_nan_in_padding_never_reaches_valid_rows(causal):
    _run_case(2, 4, 2, 500, 128, 50, torch.bfloat16, causal, -1.0, [500, 201], nan_padding=True)
