"""Lazy attention sweep: shapes, inputs, candidates, FLOP count and correctness against golden.

Effective TFLOP/s use the FlashAttention convention for causal attention of q [B, H, L, D]:
forward 4*B*H*L^2*D / 2 (the two matrix products, halved for the causal mask), backward 2.5x the
forward, forward+backward 3.5x. Lazy attention does more work than that (two sweeps over the keys),
so these are effective rates, comparable with the SDPA and FlexAttention rows of the same shape.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

import kernel_dispatch as kd

from .. import registry
from . import baselines
from .common import Candidate, check_record, compare, short_error

OP = "lazy_attention"
DEFAULT = {"L": (1024, 2048, 4096, 8192, 16384, 32768), "D": (64, 128), "H": 16, "tokens": 16384, "W": 512}
QUICK = {"L": (64, 128), "D": (64,), "H": 2, "tokens": 128, "W": 16}
LONG_L = 32768  # from here on only the fastest backends run (time budget of the default sweep)
FASTEST = ("triton", "tilelang", "sdpa_flash", "sdpa_cudnn")
CHECK_SLICE = (1, 4, 2048)  # batches, heads, tokens compared with golden float64
DENSE_COPIES = 12  # [B, H, L, L] fp32 tensors alive at the golden backward's peak (estimate)
FWD_NAMES, BWD_NAMES = ("o",), ("dq", "dk", "dv", "dbias", "dtau")


@dataclass(frozen=True)
class Shape:
    """One point of the sweep: q, k, v [B, H, L, D], bias [H, W], causal, no padding, H == Hkv."""

    B: int
    H: int
    L: int
    D: int
    W: int

    def as_dict(self) -> dict:
        return {"B": self.B, "H": self.H, "L": self.L, "D": self.D, "W": self.W}

    def label(self) -> str:
        return f"{self.B}x{self.H}x{self.L}x{self.D}"


def shapes(Ls, Ds, H: int, tokens: int, W: int) -> list[Shape]:
    """The sweep: B = tokens // L (at least 1), so every L moves the same number of tokens."""
    return [Shape(max(1, tokens // L), H, L, D, W) for D in Ds for L in Ls]


def flops(s: Shape) -> dict:
    """Conventional FLOP counts (see the module docstring): {"fwd": ..., "fwd_bwd": ...}."""
    fwd = 4 * s.B * s.H * s.L * s.L * s.D / 2
    return {"fwd": fwd, "fwd_bwd": 3.5 * fwd}


def _dense_budget(device: torch.device) -> int:
    if device.type == "cuda":
        return int(0.6 * torch.cuda.get_device_properties(device).total_memory)
    return 4 * 2**30


def dense_reason(s: Shape, device: torch.device) -> str | None:
    """Why a dense O(L^2) implementation (golden, compiled golden) is skipped at ``s``, or None."""
    need = DENSE_COPIES * s.B * s.H * s.L * s.L * 4
    budget = _dense_budget(device)
    if need > budget:
        return f"dense O(L^2) reference too large (~{need / 2**30:.0f} GiB > {budget / 2**30:.0f} GiB budget)"
    return None


@dataclass
class Inputs:
    """Leaves that require grad: q, k, v [B, H, L, D] dtype; bias [H, W], tau [H] fp32; do: upstream grad."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    bias: torch.Tensor
    tau: torch.Tensor
    do: torch.Tensor

    @property
    def leaves(self) -> tuple:
        return self.q, self.k, self.v, self.bias, self.tau


def make_inputs(s: Shape, dtype: torch.dtype, device: torch.device, seed: int = 0) -> Inputs:
    """Random inputs; tau spread over [-1.3, -0.7] per head (around the usual -1, never exactly -1)."""
    g = torch.Generator(device=device).manual_seed(seed)

    def rnd(*shape, dt=dtype, scale=1.0):
        return (scale * torch.randn(*shape, generator=g, device=device, dtype=torch.float32)).to(dt)

    q, k, v = (rnd(s.B, s.H, s.L, s.D).requires_grad_() for _ in range(3))
    bias = rnd(s.H, s.W, dt=torch.float32, scale=0.5).requires_grad_()
    tau = (torch.linspace(-1.3, -0.7, s.H + 2, device=device)[1:-1]).requires_grad_()
    return Inputs(q, k, v, bias, tau, rnd(s.B, s.H, s.L, s.D))


class Reference:
    """Golden float64 on a slice (first batches, heads, tokens), computed once per shape.

    Causal rows m < l depend only on keys n < l, so with the upstream gradient zero outside the
    slice, every output and gradient of the slice equals that of the sliced problem.
    """

    def __init__(self, t: Inputs, s: Shape):
        self.t = t
        self.b, self.h, self.l = (min(n, cap) for n, cap in zip((s.B, s.H, s.L), CHECK_SLICE))
        self._ref = None
        self.do = torch.zeros_like(t.do)
        self.do[:self.b, :self.h, :self.l] = t.do[:self.b, :self.h, :self.l]

    def describe(self) -> str:
        return f"golden float64 on the first {self.b} batch(es), {self.h} head(s), {self.l} token(s)"

    def _cut(self, x):
        return x[:self.b, :self.h, :self.l]

    def ref(self) -> dict:
        if self._ref is None:
            t = self.t
            leaves = [self._cut(x).detach().double().requires_grad_() for x in (t.q, t.k, t.v)]
            leaves += [p[:self.h].detach().double().requires_grad_() for p in (t.bias, t.tau)]
            o = kd.lazy_attention(*leaves, backend="golden")
            grads = torch.autograd.grad(o, leaves, self._cut(t.do).double())
            self._ref = dict(zip(FWD_NAMES + BWD_NAMES, (o.detach(),) + grads))
        return self._ref

    def check(self, fn) -> dict:
        """Errors of fn(q, k, v, bias, tau) -> O against the reference (forward, then backward)."""
        leaves = [x.detach().clone().requires_grad_() for x in self.t.leaves]
        o = fn(*leaves)
        ref = self.ref()
        fwd = compare({"o": self._cut(o)}, {"o": ref["o"]})
        try:
            dq, dk, dv, dbias, dtau = torch.autograd.grad(o, leaves, self.do)
            got = {"dq": self._cut(dq), "dk": self._cut(dk), "dv": self._cut(dv), "dbias": dbias[:self.h],
                   "dtau": dtau[:self.h]}
            bwd = compare(got, {n: ref[n] for n in BWD_NAMES})
        except Exception as e:  # the forward's errors still count
            bwd = short_error(e)
        return check_record(self.describe(), FWD_NAMES, BWD_NAMES, fwd, bwd)


def meta(s: Shape, dtype: torch.dtype, device: torch.device) -> dict:
    """What the registry needs to decide whether a backend can run ``s``."""
    return {"device": device.type, "dtype": dtype, "head_dim": s.D, "gqa": False, "lengths": False,
            "causal": True, "bias_length": s.W}


def _from_fn(name: str, fn, t: Inputs, ref: Reference, note: str = "") -> Candidate:
    return Candidate(name, forward=lambda: fn(*t.leaves),
                     fwd_bwd=lambda: torch.autograd.grad(fn(*t.leaves), t.leaves, t.do),
                     check=lambda: ref.check(fn), note=note)


def candidate(name: str, s: Shape, t: Inputs, ref: Reference) -> Candidate:
    """The candidate ``name`` (a backend or a baseline of :mod:`baselines`) at shape ``s``."""
    device = t.q.device
    scale = 1.0 / math.sqrt(s.D)
    if name in ("golden", "golden_compile") and dense_reason(s, device):
        return Candidate(name, reason=dense_reason(s, device))
    if s.L >= LONG_L and name not in FASTEST:
        return Candidate(name, reason=f"L >= {LONG_L}: only {', '.join(FASTEST)} run (time budget)")
    if name in baselines.ATTENTION:
        if name == "golden_compile":
            return _from_fn(name, baselines.golden_compile_attention(scale), t, ref, "compiled golden")
        if name == "flex":
            return baselines.flex(t.q, t.k, t.v, t.bias, t.do, scale)
        return baselines.sdpa(name, t.q, t.k, t.v, t.do, scale)
    reasons = registry.why_not(OP, name, meta(s, t.q.dtype, device))
    if reasons:
        return Candidate(name, reason="; ".join(reasons))
    return _from_fn(name, lambda q, k, v, bias, tau: kd.lazy_attention(q, k, v, bias, tau, backend=name), t, ref)


def metrics(s: Shape, rec: dict) -> dict:
    """Effective TFLOP/s of each timed direction of a record."""
    f = flops(s)
    out = {}
    for key in ("fwd", "fwd_bwd"):
        r = rec.get(key)
        if r and "median_ms" in r:
            out[f"{key}_tflops"] = f[key] / (r["median_ms"] * 1e-3) / 1e12
    return out
