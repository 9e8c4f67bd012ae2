"""The cute launchers call every kernel with the arguments its module declares (``ARGS``: count, tensor or python
scalar, dtype), on a machine without a GPU: a fake ``kernel(name)`` records each call in place of the kernel store.
A mismatch would otherwise surface only on a GPU, as a TVM FFI error or worse."""
import contextlib
import importlib

import pytest
import torch

from kernel_dispatch.backends.cute import _kept, lazy_attention_bwd, lazy_attention_fwd
from kernel_dispatch.backends.cute._store import KERNEL_MODULES

DECLARED_DTYPES = {"fp32": (torch.float32,), "int32": (torch.int32,), "fp16/bf16": (torch.float16, torch.bfloat16)}


def check_call(name, args):
    """Assert ``args`` match ``ARGS[name]`` of the kernel's module: a second word ``int`` / ``float`` is a python
    scalar of that type, any other entry a tensor (of the dtype its second word names, where it names one)."""
    declared = importlib.import_module(f"kernel_dispatch.backends.cute.{KERNEL_MODULES[name]}").ARGS[name]
    assert len(args) == len(declared), f"{name}: {len(args)} arguments, ARGS declares {len(declared)}"
    for arg, spec in zip(args, declared):
        kind = spec.split()[1]
        if kind in ("int", "float"):
            assert type(arg) is {"int": int, "float": float}[kind], f"{name}: {spec!r} got {type(arg).__name__}"
        else:
            assert isinstance(arg, torch.Tensor), f"{name}: {spec!r} got {type(arg).__name__}"
            if kind in DECLARED_DTYPES:
                assert arg.dtype in DECLARED_DTYPES[kind], f"{name}: {spec!r} got {arg.dtype}"


@pytest.fixture
def recorded(monkeypatch):
    """The kernels' calls as (name, args), with the launchers' CUDA-only steps replaced for a CPU run."""
    calls = []
    monkeypatch.setattr(lazy_attention_fwd, "sm_count", lambda device: 132)
    monkeypatch.setattr(torch.cuda, "device", lambda device: contextlib.nullcontext())
    return calls, (lambda name: (lambda *args: calls.append((name, args))))


@pytest.mark.parametrize("lengths, causal", [(None, True), ([5, 3], True), ([5, 3], False)])
def test_forward_and_backward_launch_as_declared(recorded, lengths, causal):
    calls, kernel = recorded
    B, H, Hkv, L, D, W = 2, 4, 2, 5, 64, 8
    q = torch.randn(B, H, L, D, dtype=torch.bfloat16)
    k, v = (torch.randn(B, Hkv, L, D, dtype=torch.bfloat16) for _ in range(2))
    bias, tau = torch.randn(H, W), torch.full((H,), -1.0)
    lens = None if lengths is None else torch.tensor(lengths)
    o, lse = lazy_attention_fwd.forward(kernel, q, k, v, bias, tau, 0.125, lens, causal)
    dbias = lazy_attention_bwd.backward(kernel, torch.randn_like(o), q, k, v, bias, tau, o, lse, 0.125, lens,
                                        causal)[3]
    assert [name for name, _ in calls] == ["lse_sm90", "fwd_sm90", "dq_sm90", "dkdv_sm90"]
    for name, args in calls:
        check_call(name, args)
    counters = [args[5] for name, args in calls if name == "lse_sm90"] + [args[8] for name, args in calls
                                                                          if name == "fwd_sm90"]
    assert all(c.shape == (1,) and c.item() == 0 for c in counters)  # each persistent kernel gets a zeroed counter
    assert counters[0].data_ptr() != counters[1].data_ptr()
    lens_index = {"lse_sm90": 3, "fwd_sm90": 5, "dq_sm90": 8, "dkdv_sm90": 8}  # the lengths in each kernel's ARGS
    for name, args in calls:
        assert importlib.import_module(f"kernel_dispatch.backends.cute.{KERNEL_MODULES[name]}").ARGS[name][
            lens_index[name]].split()[0] in ("lengths", "lens")
        expect = [L] * B if lengths is None else lengths
        assert args[lens_index[name]].tolist() == expect, name
    partial = next(args[11] for name, args in calls if name == "dkdv_sm90")
    # entries per distance, then the Rdiv block sums: dq_sm90 zeroes and writes the Partial dkdv_sm90 adds into
    assert partial.shape == (B, H, 1, (min(W, L) if causal else 2 * min(W, L) - 1) + 1)
    assert next(args[11] for name, args in calls if name == "dq_sm90") is partial
    assert dbias.shape == (H, W)


@pytest.mark.parametrize("scale", [-0.5, 0.0, 0.125])
def test_forward_passes_the_kernels_a_positive_scale(recorded, scale):
    """The kernels take the row max on unscaled q.k and fold masked scores as -inf * scale: they get scale > 0 with
    (q', scale') such that q'.k * scale' = q.k * scale, a non-finite q still NaN at scale 0."""
    calls, kernel = recorded
    q = torch.randn(1, 2, 5, 64, dtype=torch.bfloat16)
    q[0, 1, 2, 3] = float("inf")
    k, v = (torch.randn(1, 2, 5, 64, dtype=torch.bfloat16) for _ in range(2))
    lazy_attention_fwd.forward(kernel, q, k, v, torch.randn(2, 8), torch.full((2,), -1.0), scale, None, True)
    for name, args in calls:
        q_passed, scale_passed = args[0], args[-1]
        assert scale_passed > 0, name
        expect = q.float() * scale
        torch.testing.assert_close(q_passed.float() * scale_passed, expect, equal_nan=True, msg=name)


def test_kept_tensors_per_stream(monkeypatch):
    """The launchers keep their lengths and counters per (device, stream, key), at most KEPT_PER_STREAM per
    stream (the oldest dropped in that stream's order), and makes fresh ones while a CUDA graph is being captured."""
    streams = {"now": 7}
    monkeypatch.setattr(torch.cuda, "current_stream",
                        lambda device: type("S", (), {"device_index": 0, "cuda_stream": streams["now"]})())
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(_kept, "_KEPT", {})
    cuda = torch.device("cuda", 0)
    made = []

    def make():
        made.append(torch.zeros(1))
        return made[-1]

    first = _kept.kept(cuda, ("a",), make)
    assert _kept.kept(cuda, ("a",), make) is first and len(made) == 1
    streams["now"] = 8
    assert _kept.kept(cuda, ("a",), make) is not first  # another stream: its own
    for i in range(_kept.KEPT_PER_STREAM):
        _kept.kept(cuda, ("b", i), make)
    assert ("a",) not in _kept._KEPT[(0, 8)]  # the oldest of the stream dropped
    assert len(_kept._KEPT[(0, 8)]) == _kept.KEPT_PER_STREAM
    streams["now"] = 7
    assert _kept.kept(cuda, ("a",), make) is first
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    assert _kept.kept(cuda, ("a",), make) is not first  # a capture: fresh
    count = len(made)
    _kept.kept(torch.device("cpu"), ("a",), make)
    assert len(made) == count + 1  # off CUDA: fresh


@pytest.mark.parametrize("causal, L, W", [(True, 150, 8), (False, 150, 8), (True, 5, 8), (False, 5, 8)])
def test_backward_reads_dbias_and_dtau_from_partial(recorded, causal, L, W):
    """dbias and dtau come from the one Partial both backward kernels write: per 64-row block the dbias entries by
    signed distance (causal 0 .. WP - 1; else -(WP - 1) .. WP - 1 at P0 = WP - 1), then the block's Rdiv sum in the
    last column. Fake kernels fill it with known values; dbias [H, W] must be their sum by |distance| (zero past
    L - 1), dtau [H] the sum of the last column."""
    calls, _ = recorded
    B, H, D = 2, 3, 64
    WP = min(W, L)
    g = torch.Generator().manual_seed(0)

    def kernel(name):
        def run(*args):
            calls.append((name, args))
            if name == "dq_sm90":
                part = args[11]
                part[..., :-1] = 0.0
                part[..., -1] = torch.rand(part.shape[:-1], generator=g)
            elif name == "dkdv_sm90":
                part = args[11]
                part[..., :-1] += torch.rand(part[..., :-1].shape, generator=g)
        return run

    q, k, v, do = (torch.randn(B, H, L, D, dtype=torch.bfloat16) for _ in range(4))
    bias, tau = torch.zeros(H, W), torch.full((H,), -1.0)
    dbias, dtau = lazy_attention_bwd.backward(kernel, do, q, k, v, bias, tau, do, torch.zeros(B, H, L), 0.125, None,
                                              causal)[3:]
    part = next(args[11] for name, args in calls if name == "dkdv_sm90").double()
    assert part.shape[-1] == (WP if causal else 2 * WP - 1) + 1
    by_entry = part.sum((0, 2))  # [H, columns]
    expect = torch.zeros(H, W, dtype=torch.float64)
    for d in range(WP):
        expect[:, d] = by_entry[:, d] if causal else by_entry[:, WP - 1 + d] + (by_entry[:, WP - 1 - d] if d else 0)
    torch.testing.assert_close(dbias.double(), expect, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(dtau.double(), by_entry[:, -1], rtol=1e-6, atol=1e-6)
    assert dbias.shape == (H, W) and dtau.shape == (H,)
