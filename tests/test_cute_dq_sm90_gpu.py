"""GPU check of the Hopper backward kernel ``dq_sm90`` (TMA + wgmma, warp-specialised, one sweep X/Y form; built and
stored, not yet used by the cute backend): dQ, Delta and Rdiv against golden in float64, next to the shipped ``dq``
kernel on the same inputs (O and LSE from the shipped cute forward).

The new kernel passes a case when each output's error is at most twice the shipped kernel's plus one rounding step
(of q's dtype for dQ, of fp32 for Delta and Rdiv). Run the smoke test alone first: a synchronisation bug in a
warp-specialised kernel hangs rather than fails, so it runs in a child process with a time limit.

    KERNEL_DISPATCH_CUTE_KERNELS=DIR [KERNEL_DISPATCH_CUTE_RUNTIME=RT] pytest -m gpu -s tests/test_cute_dq_sm90_gpu.py
"""
import math
import os
import subprocess
import sys

import pytest
import torch

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
    pytest.skip("dq_sm90 needs a Hopper GPU (sm_90)", allow_module_level=True)

from kernel_dispatch.backends.cute import _store  # noqa: E402
from kernel_dispatch.backends.cute._kernel_key import KernelKey  # noqa: E402
from kernel_dispatch.backends.cute.lazy_attention_bwd import _rows  # noqa: E402
from kernel_dispatch.backends.cute.lazy_attention_fwd import forward as fwd_launch  # noqa: E402
from kernel_dispatch.golden import lazy_attention as golden  # noqa: E402

_NAMES = {torch.float16: "float16", torch.bfloat16: "bfloat16"}
ROWS = 64  # LP multiple (shipped dq: 64; dq_sm90.ROW_MULTIPLE = 64)


def _fn(which, D, dtype, causal):
    return _store.function(KernelKey(which, D, _NAMES[dtype], causal))


def _inputs(B, H, Hkv, L, D, W, dtype, tau_value, lengths, nan_padding, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(B, H, L, D, device="cuda", generator=g).to(dtype)
    k = torch.randn(B, Hkv, L, D, device="cuda", generator=g).to(dtype)
    v = torch.randn(B, Hkv, L, D, device="cuda", generator=g).to(dtype)
    do = torch.randn(B, H, L, D, device="cuda", generator=g).to(dtype)
    bias = torch.randn(H, W, device="cuda", generator=g) * 0.5
    tau = torch.full((H,), tau_value, device="cuda")
    lens = None if lengths is None else torch.tensor(lengths, dtype=torch.int32, device="cuda")
    if nan_padding and lens is not None:
        pad = torch.arange(L, device="cuda")[None, :] >= lens[:, None]
        for t in (q, k, v, do):
            t.masked_fill_(pad.view(B, 1, L, 1), float("nan"))
    return q, k, v, do, bias, tau, lens


def _launch(which, do, q, k, v, bias, tau, o, lse, scale, lens, causal):
    """The launcher's padding (lazy_attention_bwd.backward) then one kernel: (dq, delta, rdiv) sliced to L rows.
    dq_sm90 also gets D0 = rowsum(dO * O) in fp32."""
    B, H, L, D = q.shape
    dev, dt = q.device, q.dtype
    LP = -(-L // ROWS) * ROWS
    if lens is None:
        lens_i = torch.full((B,), L, dtype=torch.int32, device=dev)
        pad_mask = None
    else:
        lens_i = lens.to(torch.int32).contiguous()
        pad_mask = torch.arange(LP, device=dev)[None, :] >= lens_i[:, None]
    qp, kp, vp, dop = (_rows(t, dt, L, LP, pad_mask) for t in (q, k, v, do))
    lse_p = torch.zeros(B, H, LP, dtype=torch.float32, device=dev)
    lse_p[..., :L] = lse
    delta = torch.full((B, H, LP), float("nan"), dtype=torch.float32, device=dev)
    rdiv = torch.full((B, H, LP), float("nan"), dtype=torch.float32, device=dev)
    dq = torch.full((B, H, LP, D), float("nan"), dtype=dt, device=dev)
    bias32, tau32 = bias.float().contiguous(), tau.float().contiguous()
    fn = _fn(which, D, dt, causal)
    if which == "dq":
        fn(qp, kp, vp, dop, lse_p, bias32, tau32, lens_i, dq, delta, rdiv, float(scale))
    else:
        d0 = torch.zeros(B, H, LP, dtype=torch.float32, device=dev)
        d0[..., :L] = (do.float() * o.float()).sum(-1)
        fn(qp, kp, vp, dop, lse_p, d0, bias32, tau32, lens_i, dq, delta, rdiv, float(scale))
    return dq[:, :, :L], delta[..., :L], rdiv[..., :L]


def _reference(do, q, k, v, bias, tau, scale, lens, causal):
    """float64: o, lse (golden.forward), dq (golden.backward), Delta and Rdiv (golden's formulas)."""
    d = [t.double() for t in (do, q, k, v)]
    if lens is not None:
        pad = torch.arange(q.shape[2], device="cuda")[None, :] >= lens[:, None]
        d = [t.masked_fill(pad.view(t.shape[0], 1, -1, 1), 0) for t in d]
    do64, q64, k64, v64 = d
    o, lse = golden.forward(q64, k64, v64, bias.double(), tau.double(), scale, lens, causal)
    dq = golden.backward(do64, q64, k64, v64, bias.double(), tau.double(), o, lse, scale, lens, causal)[0]
    s, valid, i, row_valid = golden._scores(q64, k64, bias.double(), scale, lens, causal, torch.float64)
    p = torch.where(row_valid, torch.exp(s - lse[..., None]), 0)
    mk = ((p + tau.double().view(1, -1, 1, 1) / i) > 0) & valid
    groups = q.shape[1] // k.shape[1]
    da = do64 @ v64.repeat_interleave(groups, dim=1).transpose(-1, -2)
    dp = da * mk
    delta = (p * dp).sum(-1)
    rdiv = (dp.sum(-1, keepdim=True) / i).squeeze(-1)
    return dq, delta, rdiv


def _err(a, ref):
    return (a.double() - ref).abs().nan_to_num(float("inf")).max().item() if ref.numel() else 0.0


def _run_case(B, H, Hkv, L, D, W, dtype, causal, tau_value, lengths, nan_padding=False):
    q, k, v, do, bias, tau, lens = _inputs(B, H, Hkv, L, D, W, dtype, tau_value, lengths, nan_padding)
    scale = 1.0 / math.sqrt(D)
    qz, kz, vz, doz = ((t if lens is None else t.masked_fill(
        (torch.arange(L, device="cuda")[None, :] >= lens[:, None]).view(B, 1, L, 1), 0)) for t in (q, k, v, do))
    o, lse = fwd_launch(lambda _n: _fn("fwd", D, dtype, causal), qz, kz, vz, bias, tau, scale, lens, causal)
    new = _launch("dq_sm90", do, q, k, v, bias, tau, o, lse, scale, lens, causal)
    old = _launch("dq", do, q, k, v, bias, tau, o, lse, scale, lens, causal)
    torch.cuda.synchronize()
    ref = _reference(do, q, k, v, bias, tau, scale, lens, causal)
    if lens is not None:  # rows >= lengths[b]: exactly zero
        pad = torch.arange(L, device="cuda")[None, :] >= lens[:, None]
        assert (new[0].float()[pad.view(B, 1, L, 1).expand_as(new[0])] == 0).all(), "padded dQ rows not zero"
        assert (new[1][pad.view(B, 1, L).expand_as(new[1])] == 0).all(), "padded Delta rows not zero"
        assert (new[2][pad.view(B, 1, L).expand_as(new[2])] == 0).all(), "padded Rdiv rows not zero"
    report = []
    for name, a, b_, r, eps in (("dQ", new[0], old[0], ref[0], torch.finfo(dtype).eps),
                                ("Delta", new[1], old[1], ref[1], torch.finfo(torch.float32).eps),
                                ("Rdiv", new[2], old[2], ref[2], torch.finfo(torch.float32).eps)):
        e_new, e_old = _err(a, r), _err(b_, r)
        tol = 2 * e_old + eps * max(1.0, r.abs().max().item() if r.numel() else 0.0)
        report.append(f"{name} new {e_new:.3g} old {e_old:.3g}")
        assert e_new <= tol, f"{name}: dq_sm90 error {e_new:.3g}, shipped dq {e_old:.3g} (tolerance {tol:.3g})"
    print(" ".join(report))


def test_smoke_in_a_child_process_with_a_time_limit():
    """One small causal case; a hang (a pipeline or barrier bug) fails here after 120 s instead of stalling."""
    code = ("import tests.test_cute_dq_sm90_gpu as t, torch;"
            "t._run_case(1, 2, 1, 300, 128, 40, torch.bfloat16, True, -1.0, None); print('ok')")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert done.returncode == 0 and "ok" in done.stdout, done.stdout[-2000:] + done.stderr[-4000:]


CASES = [
    # B, H, Hkv, L, W, causal, tau, lengths
    (1, 2, 1, 1, 8, True, -1.0, None),  # one query, one key
    (2, 4, 2, 128, 16, True, -1.0, None),  # exactly one block
    (2, 4, 2, 300, 40, True, -1.0, None),  # partial last tiles
    (2, 4, 4, 1000, 512, True, -0.5, None),
    (2, 4, 2, 777, 2000, True, 0.5, None),  # W > L, tau > 0
    (2, 4, 2, 777, 64, False, -1.0, None),
    (2, 4, 2, 700, 100, True, -2.0, [700, 259]),  # padding, tau < -1
    (2, 4, 2, 700, 100, False, -1.0, [1, 390]),
    (3, 2, 1, 256, 30, True, -1.0, [0, 128, 129]),  # an empty row, tile-edge lengths
    (2, 8, 2, 520, 64, False, -0.5, [64, 520]),  # GQA 4, non-causal, tile-edge length
    (1, 2, 1, 2048, 512, True, -1.0, None),  # 32 key tiles: the K/V ring wraps several times
]


@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", CASES, ids=[f"case{i}" for i in range(len(CASES))])
def test_dq_sm90_matches_golden_like_the_shipped_dq(case, dtype, D):
    B, H, Hkv, L, W, causal, tau, lengths = case
    _run_case(B, H, Hkv, L, D, W, dtype, causal, tau, lengths)


@pytest.mark.parametrize("causal", [True, False])
def test_nan_in_padding_never_reaches_valid_rows(causal):
    _run_case(2, 4, 2, 500, 128, 50, torch.bfloat16, causal, -1.0, [500, 201], nan_padding=True)


def test_bitwise_rerun():
    B, H, Hkv, L, D, W = 2, 4, 2, 900, 128, 100
    q, k, v, do, bias, tau, lens = _inputs(B, H, Hkv, L, D, W, torch.bfloat16, -1.0, [900, 433], False)
    o = torch.randn_like(q)
    lse = torch.randn(B, H, L, device="cuda").abs() + 3
    for causal in (True, False):
        a = _launch("dq_sm90", do, q, k, v, bias, tau, o, lse, 0.1, lens, causal)
        b = _launch("dq_sm90", do, q, k, v, bias, tau, o, lse, 0.1, lens, causal)
        for x, y in zip(a, b):
            assert torch.equal(x.view(torch.uint8) if x.dtype != torch.float32 else x.view(torch.int32),
                               y.view(torch.uint8) if y.dtype != torch.float32 else y.view(torch.int32))


def test_timing_printout():
    """B=4, H=16, L=4096, D=128, bf16, causal, W=512, tau=-1: CUDA events, median of 30, next to the shipped dq."""
    B, H, Hkv, L, D, W = 4, 16, 16, 4096, 128, 512
    dtype = torch.bfloat16
    q, k, v, do, bias, tau, lens = _inputs(B, H, Hkv, L, D, W, dtype, -1.0, None, False)
    scale = 1.0 / math.sqrt(D)
    o, lse = fwd_launch(lambda _n: _fn("fwd", D, dtype, True), q, k, v, bias, tau, scale, None, True)
    lens_i = torch.full((B,), L, dtype=torch.int32, device="cuda")
    vec = lambda: torch.empty(B, H, L, dtype=torch.float32, device="cuda")  # noqa: E731
    dq, delta, rdiv = torch.empty_like(q), vec(), vec()
    d0 = (do.float() * o.float()).sum(-1)
    calls = {
        "dq": lambda: _fn("dq", D, dtype, True)(q, k, v, do, lse, bias, tau, lens_i, dq, delta, rdiv, scale),
        "dq_sm90": lambda: _fn("dq_sm90", D, dtype, True)(q, k, v, do, lse, d0, bias, tau, lens_i, dq, delta, rdiv,
                                                          scale),
    }
    out = []
    for name, f in calls.items():
        for _ in range(3):
            f()
        times = []
        for _ in range(30):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            f()
            e.record()
            e.synchronize()
            times.append(s.elapsed_time(e))
        out.append(f"{name} {sorted(times)[15]:.3f} ms")
    print("timing B=4 H=16 L=4096 D=128 bf16 causal W=512:", ", ".join(out))
