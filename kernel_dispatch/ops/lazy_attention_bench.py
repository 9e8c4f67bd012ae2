"""Lazy attention's bench module (the protocol: :mod:`kernel_dispatch.benchmarks.common`): the sweep's shapes,
inputs, candidates, FLOP count and correctness against golden, its table, plot and README summary rows.

Effective TFLOP/s use the FlashAttention convention for causal attention of q [B, H, L, D]:
forward 4*B*H*L^2*D / 2 (the two matrix products, halved for the causal mask), backward 2.5x the
forward, forward+backward 3.5x. Lazy attention does more work than that (two sweeps over the keys),
so these are effective rates, comparable with the SDPA and FlexAttention rows of the same shape.
"""
from __future__ import annotations

import argparse
import math
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import torch

from .. import registry
from ..benchmarks import plots, report
from ..benchmarks.common import Candidate, check_record, compare, from_fn, int_list, one_int, short_error
from . import lazy_attention_baselines as baselines
from .lazy_attention import lazy_attention

NAME = "lazy_attention"
BASELINES = baselines.BASELINES
BASELINE_NOTES = baselines.NOTES
CONVENTIONS = {
    "lazy_attention_flops": "causal FlashAttention convention: fwd 4*B*H*L^2*D/2, bwd 2.5x fwd, fwd+bwd 3.5x fwd",
}
SIZE_FLAGS = ("L",)
D_HELP = ("head dims", "64,128")
DEFAULT = {"L": (1024, 2048, 4096, 8192, 16384, 32768), "D": (64, 128), "H": 16, "tokens": 16384, "W": 512}
QUICK = {"L": (64, 128), "D": (64,), "H": 2, "tokens": 128, "W": 16}
LONG_L = 32768  # from here on only the fastest backends run (time budget of the default sweep)
FASTEST = ("triton", "tilelang", "cute", "sdpa_flash", "sdpa_cudnn")
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


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Its options: --L, --H, --tokens, --W (sizes like '1K' accepted)."""
    p.add_argument("--L", type=int_list, help="lazy attention sequence lengths, e.g. 1K,4K,32K")
    p.add_argument("--H", type=one_int, help="lazy attention heads (default 16)")
    p.add_argument("--tokens", type=one_int, help="lazy attention B*L per point; B = tokens // L (default 16K)")
    p.add_argument("--W", type=one_int, help="lazy attention bias length (default 512)")


def shapes(args: argparse.Namespace, quick: bool, Ds: tuple[int, ...] | None) -> list[Shape]:
    """The sweep: every (D, L), B = tokens // L (at least 1), so every L moves the same number of tokens."""
    d = QUICK if quick else DEFAULT
    H, tokens, W = args.H or d["H"], args.tokens or d["tokens"], args.W or d["W"]
    return [Shape(max(1, tokens // L), H, L, D, W) for D in (Ds or d["D"]) for L in (args.L or d["L"])]


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
            o = lazy_attention(*leaves, backend="golden")
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


def candidate(name: str, s: Shape, t: Inputs, ref: Reference) -> Candidate:
    """The candidate ``name`` (a backend or a baseline of :mod:`.lazy_attention_baselines`) at shape ``s``."""
    device = t.q.device
    scale = 1.0 / math.sqrt(s.D)
    if name in ("golden", "golden_compile") and dense_reason(s, device):
        return Candidate(name, reason=dense_reason(s, device))
    if s.L >= LONG_L and name not in FASTEST:
        return Candidate(name, reason=f"L >= {LONG_L}: only {', '.join(FASTEST)} run (time budget)")
    if name == "golden_compile":
        return from_fn(name, baselines.golden_compile(scale), t.leaves, t.do, ref, "compiled golden")
    if name == "flex":
        return baselines.flex(t.q, t.k, t.v, t.bias, t.do, scale)
    if name in BASELINES:
        return baselines.sdpa(name, t.q, t.k, t.v, t.do, scale)
    reasons = registry.why_not(NAME, name, meta(s, t.q.dtype, device))
    if reasons:
        return Candidate(name, reason="; ".join(reasons))
    return from_fn(name, lambda q, k, v, bias, tau: lazy_attention(q, k, v, bias, tau, backend=name), t.leaves, t.do,
                   ref)


def metrics(s: Shape, rec: dict, copy_gbps: float | None = None) -> dict:
    """Effective TFLOP/s of each timed direction of a record."""
    f = flops(s)
    out = {}
    for key in ("fwd", "fwd_bwd"):
        r = rec.get(key)
        if r and "median_ms" in r:
            out[f"{key}_tflops"] = f[key] / (r["median_ms"] * 1e-3) / 1e12
    return out


# ----------------------------------------------------------------------------- report, plot, README rows


def heading(records: list[dict], run: dict) -> str:
    return f"Lazy attention (causal, {records[0]['dtype']})"


def table(records: list[dict]) -> str:
    """Markdown table of lazy attention records (one row per shape x backend)."""
    header = ["B×H×L×D (W)", "backend", "fwd ms", "fwd TFLOP/s", "fwd+bwd ms", "fwd+bwd TFLOP/s",
              "peak MiB fwd / f+b", "max abs err fwd / bwd", "rel err fwd / bwd", "notes"]
    rows = []
    for r in sorted(records, key=lambda r: (r["shape"]["D"], r["shape"]["L"])):
        s, m = r["shape"], r["metrics"]
        rows.append([f"{s['B']}×{s['H']}×{s['L']}×{s['D']} ({s['W']})", r["backend"], report.time_cell(r["fwd"]),
                     report.num(m.get("fwd_tflops"), 3), report.time_cell(r["fwd_bwd"]),
                     report.num(m.get("fwd_bwd_tflops"), 3), report.peak_cell(r), report.err_cell(r, "max_abs"),
                     report.err_cell(r, "rel"), report.notes(r)])
    return report.markdown_table(header, rows)


PLOT_FILE = "lazy_attention_time.png"
PLOT_TITLE = "Lazy attention"


def main_sweep(records: list[dict]) -> tuple[int, list[dict]]:
    """The run's main sweep: its most common B * L (the tokens of a point) and the records with B = max(1, tokens
    // L); a point of another batch size at the same L (a --tokens run merged in) is left out."""
    tokens = Counter(r["shape"]["B"] * r["shape"]["L"] for r in records).most_common(1)[0][0]
    return tokens, [r for r in records if r["shape"]["B"] == max(1, tokens // r["shape"]["L"])]


def plot(records: list[dict], path: Path, title: str) -> Path | None:
    """Median time (ms, log) vs L (log) per backend; columns are head dims, rows fwd and fwd+bwd; the points of
    :func:`main_sweep` (the others are in the table)."""
    if not records:
        return None
    tokens, records = main_sweep(records)
    Ds = sorted({r["shape"]["D"] for r in records})
    plt = plots.pyplot()
    fig, axes = plots.grid(plt, len(Ds), title)
    styles = plots.styles(records)
    for row, (key, label) in enumerate(plots.DIRECTIONS):
        panels = plots.series(records, lambda r: r["shape"]["D"], lambda r: r["shape"]["L"],
                              lambda r, key=key: (r.get(key) or {}).get("median_ms"))
        for col, D in enumerate(Ds):
            ax = axes[row][col]
            plots.draw(ax, panels.get(D, {}), styles)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_title(f"D = {D}, {label}")
            ax.set_xlabel(f"L (B = {tokens} // L, at least 1)")
            ax.set_ylabel("median time (ms)")
    return plots.save(plt, fig, path)


# The README's speed summary: the issues' target shape, each backend and baseline in one row.
SUMMARY_SHAPE = {"B": 4, "H": 16, "L": 4096, "D": 128, "W": 512}
SUMMARY_ROWS = {"cute": "cute", "tilelang": "tilelang", "triton": "triton",
                "sdpa_cudnn": "SDPA cuDNN: plain causal attention (no bias, no Elastic-Softmax)",
                "flex": "FlexAttention: bias as score_mod (no Elastic-Softmax), bias gradient included"}


def summary(records: list[dict]) -> str:
    """The README's rows: forward and forward+backward ms at SUMMARY_SHAPE."""
    def ms(r, key):
        t = (r or {}).get(key) or {}
        return "—" if "median_ms" not in t else f"{t['median_ms']:.4g}"

    a = SUMMARY_SHAPE
    lines = [f"| lazy attention, bf16, causal, B={a['B']} H={a['H']} L={a['L']} D={a['D']} W={a['W']} "
             "| fwd ms | fwd+bwd ms |", "|---|---|---|"]
    for backend, label in SUMMARY_ROWS.items():
        r = next((r for r in records if r["backend"] == backend
                  and all(r["shape"].get(k) == v for k, v in a.items())), None)
        lines.append(f"| {label} | {ms(r, 'fwd')} | {ms(r, 'fwd_bwd')} |")
    return "\n".join(lines)
