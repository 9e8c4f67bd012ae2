"""Run hygiene of the Triton lazy attention kernels, beyond the equivalence matrix.

Determinism on a GPU is tests/test_determinism_gpu.py (every backend, every case).

- Every output element is written: output buffers are poisoned with NaN before launch, and every
  element must come back finite and right (padded rows, the first causal row with tau <= -1).
- The CUDA block configs: under the interpreter the launcher uses small blocks; here the shipped
  CUDA block shapes run once through the interpreter too, so the region and dbias-segment logic
  is tested with the block shapes that the GPU runs.
"""
from __future__ import annotations

import pytest
import torch

from kernel_dispatch.backends.triton import lazy_attention as tk

from .cases import AttnCase, make_inputs, run, upcast
from .tolerances import rel_err, tolerance
from .triton_blocks import cuda_block_configs, pin_blocks

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"


def _args(inp):
    t = inp.tensors
    c = inp.kwargs
    scale = t["q"].shape[-1] ** -0.5
    return t["q"], t["k"], t["v"], t["bias"], t["tau"], scale, c.get("lengths"), c["causal"]


def _golden(inp):
    return run("lazy_attention", upcast(inp), "golden")


def _check_against_golden(got: dict, ref: dict, dtype) -> None:
    for name, value in got.items():
        tol = tolerance("lazy_attention", dtype, name)
        assert torch.isfinite(value).all(), f"{name}: not every element written (NaN/inf left)"
        err = rel_err(value, ref[name])
        assert err <= tol, f"{name}: rel err {err:.3e} > tol {tol:.3e}"


def _run_kernels(inp):
    q, k, v, bias, tau, scale, lengths, causal = _args(inp)
    o, lse = tk.forward(q, k, v, bias, tau, scale, lengths, causal)
    dq, dk, dv, dbias, dtau = tk.backward(inp.grads[0], q, k, v, bias, tau, o, lse, scale, lengths, causal)
    return {"o": o, "dq": dq, "dk": dk, "dv": dv, "dbias": dbias, "dtau": dtau}, lse


POISON_CASES = [
    AttnCase("poison_lengths_tau_le_m1", B=3, H=2, Hkv=1, L=45, D=16, W=6, lengths=(45, 20, 1), tau=(-1.5, -1.0)),
    AttnCase("poison_noncausal_lengths_d128", B=2, H=2, Hkv=2, L=37, D=128, W=9, causal=False, lengths=(37, 5)),
]


@pytest.mark.parametrize("case", POISON_CASES, ids=lambda c: c.name)
def test_every_output_element_is_written(case, monkeypatch):
    def poisoned(*shape, dtype, device):
        return torch.full(shape, float("nan"), dtype=dtype, device=device)

    monkeypatch.setattr(tk, "_empty", poisoned)
    inp = make_inputs("lazy_attention", case, torch.float32, DEVICE, seed=1)
    got, lse = _run_kernels(inp)
    assert torch.isfinite(lse).all(), "lse: not every element written"
    _check_against_golden(got, _golden(inp), torch.float32)
    lengths = inp.kwargs.get("lengths")
    if lengths is not None:
        for b, n in enumerate(lengths.tolist()):
            for name in ("o", "dq"):
                assert (got[name][b, :, n:] == 0).all(), f"{name}: rows past lengths[{b}] = {n} are not zero"
            for name in ("dk", "dv"):
                assert (got[name][b, :, n:] == 0).all(), f"{name}: keys past lengths[{b}] = {n} are not zero"
    if case.causal and case.tau is not None:
        for h, t in enumerate(case.tau):
            if t <= -1:
                assert (got["o"][:, h, 0] == 0).all(), f"o: first causal row of head {h} (tau {t}) is not zero"


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "noncausal"])
@pytest.mark.parametrize("per_launch", ["head_slices", "batch_groups"])
def test_dbias_scratch_in_chunks(per_launch, causal, monkeypatch):
    """dq launches over (b, h) chunks when the dbias partial sums would not fit SCRATCH_ELEMS."""
    case = AttnCase("chunks", B=3, H=3, Hkv=1, L=40, D=16, W=12, causal=causal, lengths=(40, 23, 40))
    inp = make_inputs("lazy_attention", case, torch.float32, DEVICE, seed=4)
    blk = tk.dq_block(inp.tensors["q"])
    n_blocks, seg = -(-case.L // blk), -(-case.W // blk) * (1 if causal else 2)
    per_bh = n_blocks * seg * blk
    monkeypatch.setattr(tk, "SCRATCH_ELEMS", 2 * per_bh if per_launch == "head_slices" else 3 * per_bh)
    chunks = tk._bh_chunks(case.B, case.H, per_bh)
    assert len(chunks) > 1 and (per_launch == "batch_groups") == all((b1 - b0) % case.H == 0 for b0, b1 in chunks)
    got, _ = _run_kernels(inp)
    _check_against_golden(got, _golden(inp), torch.float32)


@pytest.mark.skipif(not tk.INTERPRET, reason="on a GPU the CUDA block shapes run natively (the matrix, "
                                              "tests/test_triton_attn_configs_gpu.py)")
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "noncausal"])
@pytest.mark.parametrize("fwd_blocks,dq_block,dkdv_blocks", cuda_block_configs())
def test_cuda_block_shapes_under_interpreter(fwd_blocks, dq_block, dkdv_blocks, causal, monkeypatch):
    pin_blocks(monkeypatch, fwd_blocks, dq_block, dkdv_blocks)
    case = AttnCase("cuda_blocks", B=2, H=2, Hkv=1, L=300, D=16, W=70, causal=causal, lengths=(300, 141))
    inp = make_inputs("lazy_attention", case, torch.float32, DEVICE, seed=2)
    got, _ = _run_kernels(inp)
    _check_against_golden(got, _golden(inp), torch.float32)
