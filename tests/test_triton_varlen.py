"""Run hygiene of the Triton lazy_attention_varlen launchers, beyond the equivalence matrix (which checks every
declared case against golden float64).

- Reruns: the backward run twice gives bitwise equal dq, dk, dv, dbias and dtau (the dtau and dbias partials are
  summed in a fixed order; under the interpreter programs run one at a time, so this checks the launcher's
  reductions; tests/test_determinism_gpu.py reruns every case on a GPU, where programs race).
- Every output element is written: output buffers are poisoned with NaN before launch.
- The dbias partial sums split over several dq launches (a few heads each) when they would not fit SCRATCH_ELEMS.
- The CUDA block shapes: the interpreter runs small blocks; here the shipped block shapes run once through the
  interpreter too, so the per-(document, query block) partial-sum rows are checked at the sizes the GPU runs.
- A document too long for the kernels' int32 offsets is an error naming the argument.
"""
from __future__ import annotations

import pytest
import torch
import triton

from kernel_dispatch.backends.triton import lazy_attention as tk
from kernel_dispatch.backends.triton import lazy_attention_varlen as tv
from kernel_dispatch.ops.lazy_attention_varlen_cases import VarlenCase, make_inputs
from kernel_dispatch.testing.matrix import rel_err, tolerance

from .cases import run, upcast
from .triton_blocks import cuda_block_configs, pin_blocks

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
OP = "lazy_attention_varlen"
GRADS = ("dq", "dk", "dv", "dbias", "dtau")


def _args(inp):
    t, kw = inp.tensors, inp.kwargs
    return (t["q"], t["k"], t["v"], t["bias"], t["tau"], t["cu_seqlens"], kw["max_seqlen"],
            t["q"].shape[-1] ** -0.5, kw["causal"])


def _kernels(inp) -> tuple[dict, torch.Tensor]:
    q, k, v, bias, tau, cu, max_seqlen, scale, causal = _args(inp)
    o, lse = tv.forward(q, k, v, bias, tau, cu, max_seqlen, scale, causal)
    grads = tv.backward(inp.grads[0], q, k, v, bias, tau, o, lse, cu, max_seqlen, scale, causal)
    return {"o": o, **dict(zip(GRADS, grads))}, lse


def _check_against_golden(got: dict, inp, dtype) -> None:
    ref = run(OP, upcast(inp), "golden")
    for name, value in got.items():
        assert torch.isfinite(value).all(), f"{name}: not every element written (NaN/inf left)"
        err, tol = rel_err(value, ref[name]), tolerance(OP, dtype, name)
        assert err <= tol, f"{name}: rel err {err:.3e} > tol {tol:.3e}"


# boundaries inside every block size the kernels use, empty and one-token documents, GQA
RERUN = VarlenCase("rerun", docs=(0, 37, 1, 70, 0, 19, 45), H=4, Hkv=2, D=16, W=24)


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "noncausal"])
def test_backward_rerun_is_bitwise_equal(causal):
    case = VarlenCase(RERUN.name, docs=RERUN.docs, H=RERUN.H, Hkv=RERUN.Hkv, D=RERUN.D, W=RERUN.W, causal=causal)
    inp = make_inputs(case, torch.float32, DEVICE, seed=3)
    q, k, v, bias, tau, cu, max_seqlen, scale, causal = _args(inp)
    o, lse = tv.forward(q, k, v, bias, tau, cu, max_seqlen, scale, causal)
    first = tv.backward(inp.grads[0], q, k, v, bias, tau, o, lse, cu, max_seqlen, scale, causal)
    again = tv.backward(inp.grads[0], q, k, v, bias, tau, o, lse, cu, max_seqlen, scale, causal)
    for name, a, b in zip(GRADS, first, again):
        assert torch.equal(a, b), f"{name} differs between two runs on the same inputs"


POISON_CASES = [
    VarlenCase("poison_causal_tau_le_m1", docs=(1, 0, 23, 9), H=2, Hkv=1, D=16, W=6, tau=(-1.5, -1.0)),
    VarlenCase("poison_noncausal_d128", docs=(5, 31, 1), H=2, Hkv=2, D=128, W=9, causal=False),
]


@pytest.mark.parametrize("case", POISON_CASES, ids=lambda c: c.name)
def test_every_output_element_is_written(case, monkeypatch):
    def poisoned(*shape, dtype, device):
        return torch.full(shape, float("nan"), dtype=dtype, device=device)

    monkeypatch.setattr(tv, "_empty", poisoned)
    inp = make_inputs(case, torch.float32, DEVICE, seed=1)
    got, lse = _kernels(inp)
    assert torch.isfinite(lse).all(), "lse: not every element written"
    _check_against_golden(got, inp, torch.float32)
    if case.causal and case.tau is not None:
        cu = inp.tensors["cu_seqlens"].tolist()
        for h, t in enumerate(case.tau):
            if t <= -1:
                firsts = [a for a, b in zip(cu, cu[1:]) if b > a]
                assert (got["o"][firsts, h] == 0).all(), f"o: a document's first row of head {h} (tau {t}) is not 0"


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "noncausal"])
def test_dbias_partials_in_head_chunks(causal, monkeypatch):
    case = VarlenCase("chunks", docs=(40, 3, 0, 23), H=3, Hkv=1, D=16, W=12, causal=causal)
    inp = make_inputs(case, torch.float32, DEVICE, seed=4)
    blk = tk.dq_block(inp.tensors["q"])
    rows = len(case.docs) + triton.cdiv(case.T, blk)
    per_head = rows * triton.cdiv(min(case.W, max(case.docs)), blk) * (1 if causal else 2) * blk
    monkeypatch.setattr(tv, "SCRATCH_ELEMS", per_head)  # one head per launch
    dq_heads = []

    def counting(kernel, grid, *args, **kwargs):
        if kernel is tk.KERNELS["dq"]:
            dq_heads.append(grid[2])
        tv_launch(kernel, grid, *args, **kwargs)

    tv_launch = tv.launch
    monkeypatch.setattr(tv, "launch", counting)
    got, _ = _kernels(inp)
    assert dq_heads == [1] * case.H, f"dq launches over {dq_heads} heads, expected one head each"
    _check_against_golden(got, inp, torch.float32)


@pytest.mark.slow
@pytest.mark.skipif(not tk.INTERPRET, reason="on a GPU the CUDA block shapes run natively (the matrix)")
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "noncausal"])
@pytest.mark.parametrize("fwd_blocks,dq_block,dkdv_blocks", cuda_block_configs())
def test_cuda_block_shapes_under_interpreter(fwd_blocks, dq_block, dkdv_blocks, causal, monkeypatch):
    pin_blocks(monkeypatch, fwd_blocks, dq_block, dkdv_blocks)
    # documents shorter than a block, across block boundaries, and one spanning several blocks
    case = VarlenCase("cuda_blocks", docs=(30, 0, 150, 1, 97), H=2, Hkv=1, D=16, W=70, causal=causal)
    inp = make_inputs(case, torch.float32, DEVICE, seed=2)
    got, _ = _kernels(inp)
    _check_against_golden(got, inp, torch.float32)


def test_int32_offsets_overflow_is_an_error():
    T, H, D = 8, 2, 16
    q = torch.zeros(T, H, D)
    cu = torch.tensor([0, T], dtype=torch.int32)
    with pytest.raises(ValueError, match="q: a document of"):
        tv.forward(q, q, q, torch.zeros(H, 4), torch.zeros(H), cu, 2**31 // (H * D), 0.25, True)


def _documents(inp):
    cu = inp.tensors["cu_seqlens"].tolist()
    return [(a, b) for a, b in zip(cu, cu[1:]) if b > a]


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "noncausal"])
def test_each_document_equals_the_fixed_length_kernels_bitwise(causal):
    """A document's rows of O, LSE, dQ, dK, dV are the fixed-length kernels' on that document alone, bit for bit
    (the same tiles in the same order; only the base addresses differ); dbias and dtau sum the documents."""
    case = VarlenCase(RERUN.name, docs=RERUN.docs, H=RERUN.H, Hkv=RERUN.Hkv, D=RERUN.D, W=RERUN.W, causal=causal)
    inp = make_inputs(case, torch.float32, DEVICE, seed=5)
    got, lse = _kernels(inp)
    q, k, v, bias, tau, _, _, scale, causal = _args(inp)
    do = inp.grads[0]
    dbias, dtau = torch.zeros_like(bias), torch.zeros_like(tau)
    for a, b in _documents(inp):
        doc = [t[a:b].transpose(0, 1)[None] for t in (q, k, v, do)]
        o_d, lse_d = tk.forward(*doc[:3], bias, tau, scale, None, causal)
        dq_d, dk_d, dv_d, db_d, dt_d = tk.backward(doc[3], *doc[:3], bias, tau, o_d, lse_d, scale, None, causal)
        for name, whole, alone in (("o", got["o"], o_d), ("dq", got["dq"], dq_d), ("dk", got["dk"], dk_d),
                                   ("dv", got["dv"], dv_d)):
            assert torch.equal(whole[a:b], alone[0].transpose(0, 1)), f"{name}: document [{a}, {b}) differs"
        assert torch.equal(lse[:, a:b], lse_d[0]), f"lse: document [{a}, {b}) differs"
        dbias += db_d
        dtau += dt_d
    torch.testing.assert_close(got["dbias"], dbias, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got["dtau"], dtau, rtol=1e-5, atol=1e-6)
