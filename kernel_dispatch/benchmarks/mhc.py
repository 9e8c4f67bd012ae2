"""mHC sweep: one block pre -> identity sublayer -> post, its inputs, candidates, bytes and errors.

Speed of light: the fewest bytes each pass must move, per token, for bf16 activations
(forward: pre 10D + post 18D; backward: pre 26D + post 28D; scaled by the element size for
other dtypes), divided by the device-to-device copy bandwidth measured in the same run. GB/s is
those bytes over the measured time; the fraction of the speed of light is that over the copy rate.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

import kernel_dispatch as kd

from .. import registry
from . import baselines
from .common import Candidate, check_record, compare, short_error

OP = "mhc"
OPS = ("mhc_pre", "mhc_post")
DEFAULT = {"D": (1280, 2560, 4096, 7168), "T": (4096, 16384), "n": 4}
QUICK = {"D": (64, 128), "T": (64,), "n": 4}
CHECK_TOKENS = 1024  # tokens compared with golden float64
BYTES_PER_TOKEN_BF16 = {"fwd": 10 + 18, "bwd": 26 + 28}  # times D
FWD_NAMES, BWD_NAMES = ("out",), ("dx", "dphi", "dalpha", "dbias", "dgamma")


@dataclass(frozen=True)
class Shape:
    """One point: x [T, n, D] activations, phi [n*n + 2n, n*D], gamma [n*D]."""

    T: int
    n: int
    D: int

    def as_dict(self) -> dict:
        return {"T": self.T, "n": self.n, "D": self.D}

    def label(self) -> str:
        return f"T{self.T} n{self.n} D{self.D}"


def shapes(Ds, Ts, n: int) -> list[Shape]:
    """Every (T, D) pair, D-major."""
    return [Shape(T, n, D) for D in Ds for T in Ts]


def min_bytes(s: Shape, dtype: torch.dtype) -> dict:
    """The speed-of-light byte counts {"fwd": ..., "fwd_bwd": ...} of one block at ``s``."""
    es = torch.empty((), dtype=dtype).element_size()
    per = {k: v * s.D * es / 2 for k, v in BYTES_PER_TOKEN_BF16.items()}
    return {"fwd": s.T * per["fwd"], "fwd_bwd": s.T * (per["fwd"] + per["bwd"])}


@dataclass
class Inputs:
    """Leaves that require grad: x [T, n, D] dtype; phi, alpha, bias, gamma fp32; g: upstream grad of out."""

    x: torch.Tensor
    phi: torch.Tensor
    alpha: torch.Tensor
    bias: torch.Tensor
    gamma: torch.Tensor
    g: torch.Tensor

    @property
    def leaves(self) -> tuple:
        return self.x, self.phi, self.alpha, self.bias, self.gamma


def make_inputs(s: Shape, dtype: torch.dtype, device: torch.device, seed: int = 0) -> Inputs:
    """Random inputs at the scales of tests/cases.py."""
    gen = torch.Generator(device=device).manual_seed(seed)
    M = s.n * s.n + 2 * s.n

    def rnd(*shape, dt=torch.float32, scale=1.0):
        return (scale * torch.randn(*shape, generator=gen, device=device)).to(dt)

    x = rnd(s.T, s.n, s.D, dt=dtype).requires_grad_()
    phi = rnd(M, s.n * s.D, scale=0.05).requires_grad_()
    alpha = (torch.tensor([0.8, 1.2, 0.9], device=device) + rnd(3, scale=0.1)).requires_grad_()
    bias = rnd(M, scale=0.3).requires_grad_()
    gamma = (1 + rnd(s.n * s.D, scale=0.1)).requires_grad_()
    return Inputs(x, phi, alpha, bias, gamma, rnd(s.T, s.n, s.D, dt=dtype))


def block(backend: str):
    """fn(x, phi, alpha, bias, gamma) -> out [T, n, D]: mhc_pre, identity sublayer, mhc_post, wired as
    kernel_dispatch.nn.MHC wires them (x reaches post through pre's residual output, so the two
    gradients of x are summed inside the pre backward kernel)."""
    def fn(x, phi, alpha, bias, gamma):
        h_in, h_post, h_res, x_res = kd.mhc_pre(x, phi, alpha, bias, gamma, backend=backend, return_residual=True)
        return kd.mhc_post(h_in, x_res, h_post, h_res, backend=backend)
    return fn


class Reference:
    """Golden float64 on the first tokens, computed once per shape.

    Tokens are independent and parameter gradients are sums over tokens, so with the upstream
    gradient zero past the slice the slice's outputs and every gradient equal the sliced problem's.
    """

    def __init__(self, t: Inputs, s: Shape):
        self.t, self.l = t, min(s.T, CHECK_TOKENS)
        self._ref = None
        self.g = torch.zeros_like(t.g)
        self.g[:self.l] = t.g[:self.l]

    def describe(self) -> str:
        return f"golden float64 on the first {self.l} token(s)"

    def ref(self) -> dict:
        if self._ref is None:
            t = self.t
            leaves = [t.x[:self.l].detach().double().requires_grad_()]
            leaves += [p.detach().double().requires_grad_() for p in (t.phi, t.alpha, t.bias, t.gamma)]
            out = block("golden")(*leaves)
            grads = torch.autograd.grad(out, leaves, t.g[:self.l].double())
            self._ref = dict(zip(FWD_NAMES + BWD_NAMES, (out.detach(),) + grads))
        return self._ref

    def check(self, fn) -> dict:
        """Errors of fn(x, phi, alpha, bias, gamma) -> out against the reference (forward, then backward)."""
        leaves = [p.detach().clone().requires_grad_() for p in self.t.leaves]
        out = fn(*leaves)
        ref = self.ref()
        fwd = compare({"out": out[:self.l]}, {"out": ref["out"]})
        try:
            dx, *dparams = torch.autograd.grad(out, leaves, self.g)
            got = dict(zip(BWD_NAMES, [dx[:self.l]] + dparams))
            bwd = compare(got, {n: ref[n] for n in BWD_NAMES})
        except Exception as e:  # the forward's errors still count
            bwd = short_error(e)
        return check_record(self.describe(), FWD_NAMES, BWD_NAMES, fwd, bwd)


def why_not(name: str, s: Shape, dtype: torch.dtype, device: torch.device) -> list[str]:
    """The registry's reasons for both halves; a reason both share is listed once, unprefixed."""
    meta = {"device": device.type, "dtype": dtype, "n": s.n, "D": s.D}
    pre, post = (registry.why_not(op, name, meta) for op in OPS)
    common = [r for r in pre if r in post]
    return common + [f"mhc_pre: {r}" for r in pre if r not in common] + [
        f"mhc_post: {r}" for r in post if r not in common]


def candidate(name: str, s: Shape, t: Inputs, ref: Reference) -> Candidate:
    """The candidate ``name`` (a backend, or golden_compile) at shape ``s``."""
    if name in baselines.MHC:
        fn, note = baselines.golden_compile_mhc(), "compiled golden"
    elif name in kd.BACKEND_NAMES:
        reasons = why_not(name, s, t.x.dtype, t.x.device)
        if reasons:
            return Candidate(name, reason="; ".join(reasons))
        fn, note = block(name), ""
    else:
        return Candidate(name, reason="not an mHC backend (attention-only baseline)")
    return Candidate(name, forward=lambda: fn(*t.leaves),
                     fwd_bwd=lambda: torch.autograd.grad(fn(*t.leaves), t.leaves, t.g),
                     check=lambda: ref.check(fn), note=note)


def metrics(s: Shape, rec: dict, copy_gbps: float | None = None) -> dict:
    """GB/s of the speed-of-light bytes and their fraction of the copy bandwidth, per timed direction."""
    nbytes = min_bytes(s, getattr(torch, rec["dtype"]))
    out = {"fwd_bytes": nbytes["fwd"], "fwd_bwd_bytes": nbytes["fwd_bwd"]}
    for key in ("fwd", "fwd_bwd"):
        r = rec.get(key)
        if r and "median_ms" in r:
            gbps = nbytes[key] / (r["median_ms"] * 1e-3) / 1e9
            out[f"{key}_gbps"] = gbps
            if copy_gbps:
                out[f"{key}_sol"] = gbps / copy_gbps
    return out
