"""Lazy attention over packed documents: its bench module (the protocol: :mod:`kernel_dispatch.benchmarks.common`).

Two cases of T tokens, q, k, v [T, H, D], causal within each document: ``random`` (document lengths drawn from
64..4096 with ``random.Random(seed)``, the last one cut to fit T) and ``uniform`` (4 documents of T / 4).
Baselines: the fixed-length lazy attention at the uniform case (one [4, H, T/4, D] batch), torch's varlen_attn
and FlexAttention with a document mask (both plain causal attention within documents: no bias, no tau).

Effective TFLOP/s use the FlashAttention convention summed over documents: forward
4 * H * D * sum_d L_d^2 / 2, forward+backward 3.5x that.
"""
from __future__ import annotations

import argparse
import functools
import importlib
import inspect
import itertools
import math
import random
from dataclasses import dataclass
from pathlib import Path

import torch

from .. import registry
from ..benchmarks import plots, report
from ..benchmarks.baselines import NEEDS_CUDA, compiled
from ..benchmarks.common import Candidate, check_record, compare, from_fn, one_int, short_error
from . import lazy_attention_baselines as attn_baselines
from . import lazy_attention_bench as attn_bench
from ._frontend import backend_pair
from .lazy_attention import lazy_attention
from .lazy_attention_varlen import lazy_attention_varlen

NAME = "lazy_attention_varlen"
BASELINES = ("fixed_length", "varlen_attn", "flex_document")
BASELINE_NOTES = {
    "fixed_length": "kernel_dispatch lazy_attention on the uniform case as one [B, H, L, D] batch (B documents of "
                    "L tokens), the backend chosen automatically",
    "varlen_attn": "torch.nn.attention.varlen.varlen_attn (FlashAttention varlen), plain causal attention within "
                   "the same documents (no bias, no tau)",
    "flex_document": "FlexAttention with a document-id block mask, plain causal attention within the same documents "
                     "(no bias, no tau)",
}
CONVENTIONS = {"lazy_attention_varlen_flops": "FlashAttention convention over documents: fwd 4*H*D*sum(L_d^2)/2, "
                                              "fwd+bwd 3.5x fwd"}
SIZE_FLAGS = ("varlen_T",)
DEFAULT = {"T": 16384, "D": (128,), "H": 16, "W": 512, "lengths": (64, 4096)}
QUICK = {"T": 256, "D": (64,), "H": 2, "W": 16, "lengths": (16, 128)}
UNIFORM_DOCS = 4
CHECK_TOKENS = 2048  # the first documents up to this many tokens are compared with golden float64
FWD_NAMES, BWD_NAMES = attn_bench.FWD_NAMES, attn_bench.BWD_NAMES


@dataclass(frozen=True)
class Shape:
    """One case: q, k, v [T, H, D] (H == Hkv), bias [H, W], documents of ``lengths`` (sum T), causal."""

    case: str
    H: int
    D: int
    W: int
    lengths: tuple[int, ...]

    @property
    def T(self) -> int:
        return sum(self.lengths)

    def as_dict(self) -> dict:
        return {"case": self.case, "T": self.T, "docs": len(self.lengths), "H": self.H, "D": self.D, "W": self.W,
                "lengths": list(self.lengths)}

    def label(self) -> str:
        return f"{self.case} T{self.T} D{self.D}"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Its options: --varlen-T, --varlen-seed (it shares --H and --W with lazy attention)."""
    p.add_argument("--varlen-T", dest="varlen_T", type=one_int, help="lazy attention varlen: tokens (default 16K)")
    p.add_argument("--varlen-seed", type=int, default=0, help="lazy attention varlen: seed of the document lengths")


def document_lengths(T: int, lo: int, hi: int, seed: int) -> tuple[int, ...]:
    """Lengths drawn uniformly from lo..hi by random.Random(seed) until they sum to T (the last one cut)."""
    rng, out = random.Random(seed), []
    while sum(out) < T:
        out.append(min(rng.randint(lo, hi), T - sum(out)))
    return tuple(out)


def shapes(args: argparse.Namespace, quick: bool, Ds: tuple[int, ...] | None) -> list[Shape]:
    """Per head dim: the random documents, then UNIFORM_DOCS documents of T / UNIFORM_DOCS."""
    d = QUICK if quick else DEFAULT
    T, H, W = args.varlen_T or d["T"], args.H or d["H"], args.W or d["W"]
    rand = document_lengths(T, *d["lengths"], args.varlen_seed)
    uniform = (T // UNIFORM_DOCS,) * UNIFORM_DOCS
    return [Shape(case, H, D, W, lens) for D in (Ds or d["D"]) for case, lens in (("random", rand),
                                                                                   ("uniform", uniform))]


def flops(s: Shape) -> dict:
    fwd = 4 * s.H * s.D * sum(n * n for n in s.lengths) / 2
    return {"fwd": fwd, "fwd_bwd": 3.5 * fwd}


@dataclass
class Inputs:
    """Leaves that require grad: q, k, v [T, H, D] dtype; bias [H, W], tau [H] fp32. do: upstream grad [T, H, D];
    cu_seqlens [N + 1] int32; max_seqlen: the longest document."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    bias: torch.Tensor
    tau: torch.Tensor
    do: torch.Tensor
    cu_seqlens: torch.Tensor
    max_seqlen: int

    @property
    def leaves(self) -> tuple:
        return self.q, self.k, self.v, self.bias, self.tau


def make_inputs(s: Shape, dtype: torch.dtype, device: torch.device, seed: int = 0) -> Inputs:
    """Random q, k, v, bias (scale 0.5), tau = -1."""
    g = torch.Generator(device=device).manual_seed(seed)

    def rnd(*shape, dt=dtype, scale=1.0):
        return (scale * torch.randn(*shape, generator=g, device=device)).to(dt)

    q, k, v = (rnd(s.T, s.H, s.D).requires_grad_() for _ in range(3))
    bias = rnd(s.H, s.W, dt=torch.float32, scale=0.5).requires_grad_()
    tau = torch.full((s.H,), -1.0, device=device).requires_grad_()
    cu = torch.tensor([0, *itertools.accumulate(s.lengths)], dtype=torch.int32, device=device)
    return Inputs(q, k, v, bias, tau, rnd(s.T, s.H, s.D), cu, max(s.lengths))


class Reference:
    """Golden float64 on the first tokens: the whole documents that fit in CHECK_TOKENS (or the first CHECK_TOKENS
    of the first document). Causal rows depend only on earlier keys of their document, and the upstream gradient
    is zero past the slice, so every output and gradient of the slice equals that of the sliced problem."""

    def __init__(self, t: Inputs, s: Shape):
        cu = [0, *itertools.accumulate(s.lengths)]
        self.l = max((c for c in cu if c <= CHECK_TOKENS), default=0) or min(CHECK_TOKENS, s.T)
        self.cu = [c for c in cu if c < self.l] + [self.l]
        self.t, self._ref = t, None
        self.do = torch.zeros_like(t.do)
        self.do[:self.l] = t.do[:self.l]

    def describe(self) -> str:
        return f"golden float64 on the first {self.l} token(s) ({len(self.cu) - 1} document(s))"

    def ref(self) -> dict:
        if self._ref is None:
            t = self.t
            leaves = [x[:self.l].detach().double().requires_grad_() for x in (t.q, t.k, t.v)]
            leaves += [p.detach().double().requires_grad_() for p in (t.bias, t.tau)]
            cu = torch.tensor(self.cu, dtype=torch.int32, device=t.q.device)
            o = lazy_attention_varlen(*leaves, cu, backend="golden")
            grads = torch.autograd.grad(o, leaves, t.do[:self.l].double())
            self._ref = dict(zip(FWD_NAMES + BWD_NAMES, (o.detach(),) + grads))
        return self._ref

    def check(self, fn) -> dict:
        """Errors of fn(q, k, v, bias, tau) -> O [T, H, D] against the reference (forward, then backward)."""
        leaves = [x.detach().clone().requires_grad_() for x in self.t.leaves]
        o = fn(*leaves)
        ref = self.ref()
        fwd = compare({"o": o[:self.l]}, {"o": ref["o"]})
        try:
            dq, dk, dv, dbias, dtau = torch.autograd.grad(o, leaves, self.do)
            got = {"dq": dq[:self.l], "dk": dk[:self.l], "dv": dv[:self.l], "dbias": dbias, "dtau": dtau}
            bwd = compare(got, {n: ref[n] for n in BWD_NAMES})
        except Exception as e:  # the forward's errors still count
            bwd = short_error(e)
        return check_record(self.describe(), FWD_NAMES, BWD_NAMES, fwd, bwd)


def dense_reason(s: Shape, device: torch.device) -> str | None:
    """Why golden (dense per group of equal-length documents) is skipped at ``s``, or None."""
    counts: dict[int, int] = {}
    for n in s.lengths:
        counts[n] = counts.get(n, 0) + 1
    return max((attn_bench.dense_reason(attn_bench.Shape(b, s.H, n, s.D, s.W), device) or ""
                for n, b in counts.items()), key=len) or None


def _fixed_length(s: Shape, t: Inputs, ref: Reference) -> Candidate:
    """lazy_attention on the uniform case as [B, H, L, D] leaves of its own; checked through a varlen-layout view."""
    if len(set(s.lengths)) != 1:
        return Candidate("fixed_length", reason="only at the uniform case (documents of one length)")
    B, L = len(s.lengths), s.lengths[0]
    shape4 = attn_bench.Shape(B, s.H, L, s.D, s.W)
    fwd, bwd = backend_pair("lazy_attention", attn_bench.meta(shape4, t.q.dtype, t.q.device), None)

    def dense(x):
        return x.detach().view(B, L, s.H, s.D).transpose(1, 2).contiguous().requires_grad_()

    q, k, v = dense(t.q), dense(t.k), dense(t.v)

    def as_varlen(q, k, v, bias, tau):  # the checked function: [T, H, D] in and out
        o = lazy_attention(*(x.view(B, L, s.H, s.D).transpose(1, 2) for x in (q, k, v)), bias, tau)
        return o.transpose(1, 2).reshape(s.T, s.H, s.D)

    leaves = (q, k, v, t.bias, t.tau)
    do = t.do.view(B, L, s.H, s.D).transpose(1, 2).contiguous()
    return Candidate("fixed_length", forward=lambda: lazy_attention(*leaves),
                     fwd_bwd=lambda: torch.autograd.grad(lazy_attention(*leaves), leaves, do),
                     check=lambda: ref.check(as_varlen), note=f"auto backend: fwd {fwd}, bwd {bwd}")


def varlen_attn_fn():
    """torch.nn.attention.varlen.varlen_attn, or None where this torch has none."""
    try:
        mod = importlib.import_module("torch.nn.attention.varlen")
    except ImportError:
        return None
    return getattr(mod, "varlen_attn", None)


def _varlen_attn(s: Shape, t: Inputs) -> Candidate:
    note = "plain causal attention within documents, no bias/tau"
    fn = varlen_attn_fn()
    if fn is None:
        return Candidate("varlen_attn", reason=f"torch {torch.__version__} has no torch.nn.attention.varlen."
                         "varlen_attn (SDPA per document is not a substitute: one launch per document)", note=note)
    if t.q.device.type != "cuda":
        return Candidate("varlen_attn", reason=NEEDS_CUDA, note=note)
    params = inspect.signature(fn).parameters
    causal = {"is_causal": True} if "is_causal" in params else {"window_size": (-1, 0)}
    scale = 1.0 / math.sqrt(s.D)

    def forward():
        return fn(t.q, t.k, t.v, t.cu_seqlens, t.cu_seqlens, t.max_seqlen, t.max_seqlen, scale=scale, **causal)

    return Candidate("varlen_attn", forward=forward,
                     fwd_bwd=lambda: torch.autograd.grad(forward(), (t.q, t.k, t.v), t.do), note=note)


@functools.cache
def _document_mask(lengths: tuple[int, ...], device: str):
    from torch.nn.attention.flex_attention import create_block_mask

    doc = torch.repeat_interleave(torch.arange(len(lengths), device=device),
                                  torch.tensor(lengths, device=device))

    def mask_mod(b, h, q_idx, kv_idx):
        return (doc[q_idx] == doc[kv_idx]) & (q_idx >= kv_idx)

    T = sum(lengths)
    return create_block_mask(mask_mod, B=None, H=None, Q_LEN=T, KV_LEN=T, device=device)


def _flex(q, k, v, block_mask, scale, kernel_options):
    """flex_attention, compiled apart from lazy attention's FlexAttention baseline (its own recompile budget)."""
    from torch.nn.attention.flex_attention import flex_attention

    return flex_attention(q, k, v, block_mask=block_mask, scale=scale, kernel_options=kernel_options)


def _flex_document(s: Shape, t: Inputs) -> Candidate:
    cand = Candidate("flex_document", note="plain causal attention within documents (document-id block mask), "
                                           "no bias/tau")
    if t.q.device.type != "cuda":
        cand.reason = NEEDS_CUDA
        return cand
    flex = compiled(_flex)
    mask = _document_mask(s.lengths, str(t.q.device))
    scale = 1.0 / math.sqrt(s.D)

    def forward(options):  # [T, H, D] as [1, H, T, D]
        return flex(*(x.transpose(0, 1)[None] for x in (t.q, t.k, t.v)), mask, scale, options)

    do = t.do.transpose(0, 1)[None]
    cand.forward = attn_baselines.with_smaller_tiles(forward, (s.D, "fwd"), cand, "fwd")
    cand.fwd_bwd = attn_baselines.with_smaller_tiles(
        lambda o: torch.autograd.grad(forward(o), (t.q, t.k, t.v), do), (s.D, "fwd_bwd"), cand, "fwd+bwd")
    return cand


def candidate(name: str, s: Shape, t: Inputs, ref: Reference) -> Candidate:
    """The candidate ``name`` (a backend, or a name of BASELINES) at ``s``."""
    if name == "fixed_length":
        return _fixed_length(s, t, ref)
    if name == "varlen_attn":
        return _varlen_attn(s, t)
    if name == "flex_document":
        return _flex_document(s, t)
    if name not in registry.BACKEND_NAMES:
        return Candidate(name, reason="not a lazy attention varlen backend or baseline")
    if name == "golden" and dense_reason(s, t.q.device):
        return Candidate(name, reason=dense_reason(s, t.q.device))
    meta = {"device": t.q.device.type, "dtype": t.q.dtype, "head_dim": s.D, "gqa": False, "causal": True,
            "bias_length": s.W}
    reasons = registry.why_not(NAME, name, meta)
    if reasons:
        return Candidate(name, reason="; ".join(reasons))

    def fn(q, k, v, bias, tau):
        return lazy_attention_varlen(q, k, v, bias, tau, t.cu_seqlens, max_seqlen=t.max_seqlen, backend=name)
    return from_fn(name, fn, t.leaves, t.do, ref)


def metrics(s: Shape, rec: dict, copy_gbps: float | None = None) -> dict:
    """Effective TFLOP/s of each timed direction."""
    f = flops(s)
    return {f"{key}_tflops": f[key] / (rec[key]["median_ms"] * 1e-3) / 1e12
            for key in ("fwd", "fwd_bwd") if rec.get(key) and "median_ms" in rec[key]}


# ----------------------------------------------------------------------------- report, plot


def heading(records: list[dict], run: dict) -> str:
    return f"Lazy attention over packed documents (causal, {records[0]['dtype']})"


def table(records: list[dict]) -> str:
    """Markdown table: one row per case x backend."""
    header = ["case", "T (docs, longest)", "H×D (W)", "backend", "fwd ms", "fwd TFLOP/s", "fwd+bwd ms",
              "fwd+bwd TFLOP/s", "peak MiB fwd / f+b", "max abs err fwd / bwd", "rel err fwd / bwd", "notes"]
    rows = []
    for r in sorted(records, key=lambda r: (r["shape"]["D"], r["shape"]["case"])):
        s, m = r["shape"], r["metrics"]
        rows.append([s["case"], f"{s['T']} ({s['docs']}, {max(s['lengths'])})", f"{s['H']}×{s['D']} ({s['W']})",
                     r["backend"], report.time_cell(r["fwd"]), report.num(m.get("fwd_tflops"), 3),
                     report.time_cell(r["fwd_bwd"]), report.num(m.get("fwd_bwd_tflops"), 3), report.peak_cell(r),
                     report.err_cell(r, "max_abs"), report.err_cell(r, "rel"), report.notes(r)])
    return report.markdown_table(header, rows)


PLOT_FILE = "lazy_attention_varlen_time.png"
PLOT_TITLE = "Lazy attention over packed documents"
CASES = ("random", "uniform")


def plot(records: list[dict], path: Path, title: str) -> Path | None:
    """Median time (ms, log) per backend at each case; columns are head dims, rows fwd and fwd+bwd."""
    Ds = sorted({r["shape"]["D"] for r in records})
    if not Ds:
        return None
    plt = plots.pyplot()
    fig, axes = plots.grid(plt, len(Ds), title)
    styles = plots.styles(records)
    for row, (key, label) in enumerate(plots.DIRECTIONS):
        panels = plots.series(records, lambda r: r["shape"]["D"], lambda r: CASES.index(r["shape"]["case"]),
                              lambda r, key=key: (r.get(key) or {}).get("median_ms"))
        for col, D in enumerate(Ds):
            ax = axes[row][col]
            plots.draw(ax, panels.get(D, {}), styles)
            ax.set_yscale("log")
            ax.set_xticks(range(len(CASES)), CASES)
            ax.set_xlim(-0.5, len(CASES) - 0.5)
            ax.set_title(f"D = {D}, {label}")
            ax.set_xlabel("documents")
            ax.set_ylabel("median time (ms)")
    return plots.save(plt, fig, path)
