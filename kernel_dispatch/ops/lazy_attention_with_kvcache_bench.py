"""Lazy attention with a KV cache, decoding: its bench module (the protocol: :mod:`kernel_dispatch.benchmarks.common`).

One new query per row (Lq = 1) over a full cache of n tokens: q [B, H, 1, D], k_cache, v_cache [B, Hkv, n, D],
forward only. On a GPU every candidate but golden is timed as a CUDA-graph replay (how a decode step runs), so
the front end's launches and checks cost nothing. The speed of light reads K and V once at the device's copy bandwidth
measured in the same run; the table also gives each time over SDPA cuDNN's at the same shape (plain attention,
no bias, no tau).
"""
from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from pathlib import Path

import torch

from .. import registry
from ..benchmarks import plots, report
from ..benchmarks.baselines import NEEDS_CUDA
from ..benchmarks.common import Candidate, check_record, compare, int_list, short_error
from .lazy_attention_with_kvcache import lazy_attention_with_kvcache

NAME = "lazy_attention_with_kvcache"
BASELINES = ("sdpa_cudnn", "sdpa_flash")
COPY_BANDWIDTH = True
CONVENTIONS = {
    "kvcache_sol": "lazy attention with a KV cache: speed of light = K and V bytes (B*Hkv*n*D each) read once / the "
                   "copy bandwidth; the fraction is that time over the measured one",
}
SIZE_FLAGS = ("kv_shapes",)
DEFAULT = {"shapes": ((1, 4096), (1, 32768), (1, 131072), (16, 4096), (16, 32768), (64, 4096), (64, 16384)),
           "D": (128,), "H": 32, "Hkv": 8, "W": 512}
QUICK = {"shapes": ((1, 64), (2, 128)), "D": (64,), "H": 4, "Hkv": 2, "W": 16}
_SDPA = {"sdpa_flash": "FLASH_ATTENTION", "sdpa_cudnn": "CUDNN_ATTENTION"}


@dataclass(frozen=True)
class Shape:
    """One decode step: q [B, H, 1, D], k_cache, v_cache [B, Hkv, n, D] with every row full (n keys), bias [H, W]."""

    B: int
    n: int
    H: int
    Hkv: int
    D: int
    W: int

    def as_dict(self) -> dict:
        return {"B": self.B, "n": self.n, "H": self.H, "Hkv": self.Hkv, "D": self.D, "W": self.W}

    def label(self) -> str:
        return f"B{self.B} n{self.n} D{self.D}"


def _pairs(text: str) -> tuple[tuple[int, int], ...]:
    """'1x4K,64x16K' -> ((1, 4096), (64, 16384))."""
    out = []
    for item in filter(None, (s.strip() for s in text.split(","))):
        b, sep, n = item.partition("x")
        if not sep:
            raise argparse.ArgumentTypeError(f"expected BxN items like 16x32K, got {item!r}")
        out.append((int_list(b)[0], int_list(n)[0]))
    return tuple(out)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Its option: --kv-shapes (it shares --W with lazy attention)."""
    p.add_argument("--kv-shapes", dest="kv_shapes", type=_pairs,
                   help="lazy attention with a KV cache: batch x cache length, e.g. 1x4K,64x16K")


def shapes(args: argparse.Namespace, quick: bool, Ds: tuple[int, ...] | None) -> list[Shape]:
    d = QUICK if quick else DEFAULT
    return [Shape(B, n, d["H"], d["Hkv"], D, args.W or d["W"]) for D in (Ds or d["D"])
            for B, n in (args.kv_shapes or d["shapes"])]


def kv_bytes(s: Shape, dtype: torch.dtype) -> int:
    return 2 * s.B * s.Hkv * s.n * s.D * torch.empty((), dtype=dtype).element_size()


@dataclass
class Inputs:
    """q [B, H, 1, D], k_cache, v_cache [B, Hkv, n, D] dtype; bias [H, W], tau [H] fp32; seqlens [B] int32 (= n)."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    bias: torch.Tensor
    tau: torch.Tensor
    seqlens: torch.Tensor


def make_inputs(s: Shape, dtype: torch.dtype, device: torch.device, seed: int = 0) -> Inputs:
    """Random q, caches and bias (scale 0.5), tau = -1; no tensor requires grad (forward only)."""
    g = torch.Generator(device=device).manual_seed(seed)

    def rnd(*shape, dt=dtype, scale=1.0):
        return (scale * torch.randn(*shape, generator=g, device=device)).to(dt)

    return Inputs(rnd(s.B, s.H, 1, s.D), rnd(s.B, s.Hkv, s.n, s.D), rnd(s.B, s.Hkv, s.n, s.D),
                  rnd(s.H, s.W, dt=torch.float32, scale=0.5), torch.full((s.H,), -1.0, device=device),
                  torch.full((s.B,), s.n, dtype=torch.int32, device=device))


class Reference:
    """Golden float64 on the first batch row."""

    def __init__(self, t: Inputs, s: Shape):
        self.t, self._ref = t, None

    def ref(self) -> torch.Tensor:
        if self._ref is None:
            t = self.t
            self._ref = lazy_attention_with_kvcache(*(x[:1].double() for x in (t.q, t.k, t.v)), t.bias.double(),
                                                    t.tau.double(), t.seqlens[:1], backend="golden")
        return self._ref

    def check(self, fn) -> dict:
        """Errors of fn() -> O [B, H, 1, D] on its first row (forward only)."""
        return check_record("golden float64 on the first batch row", ("o",), (),
                            compare({"o": fn()[:1]}, {"o": self.ref()}), {})


def graphed(fn):
    """fn, and on CUDA a replay of it captured in a CUDA graph (captured at the first call, after two warm-up runs
    on a side stream). Returns a callable that yields fn's output."""
    state = {}

    def run():
        if "graph" not in state:
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                for _ in range(2):
                    fn()
            torch.cuda.current_stream().wait_stream(s)
            state["graph"] = torch.cuda.CUDAGraph()
            with torch.cuda.graph(state["graph"]):
                state["out"] = fn()
        state["graph"].replay()
        return state["out"]
    return run


def _timed(name: str, fn, ref: Reference, note: str, cuda: bool) -> Candidate:
    run = graphed(fn) if cuda else fn
    return Candidate(name, forward=run, check=lambda: ref.check(run),
                     note="; ".join(filter(None, (note, "CUDA-graph replay" if cuda else ""))))


def _sdpa(name: str, s: Shape, t: Inputs, ref: Reference) -> Candidate:
    note = "plain attention, no bias/tau, GQA by enable_gqa"
    if t.q.device.type != "cuda":
        return Candidate(name, reason=NEEDS_CUDA, note=note)
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = getattr(SDPBackend, _SDPA[name])
    scale = 1.0 / math.sqrt(s.D)

    def call(k, v, **gqa):
        with sdpa_kernel([backend]):
            return torch.nn.functional.scaled_dot_product_attention(t.q, k, v, scale=scale, **gqa)

    try:
        call(t.k, t.v, enable_gqa=True)
        fn = lambda: call(t.k, t.v, enable_gqa=True)  # noqa: E731
    except RuntimeError as e:  # this SDPA backend takes no GQA: K and V repeated to H heads (4x the bytes read)
        k, v = (x.repeat_interleave(s.H // s.Hkv, dim=1) for x in (t.k, t.v))
        fn = lambda: call(k, v)  # noqa: E731
        note = f"plain attention, no bias/tau, GQA by K/V repeated to H heads (enable_gqa: {short_error(e)})"
    cand = _timed(name, fn, ref, note, True)
    cand.check = None  # a different function: nothing to compare with lazy attention's golden
    return cand


def candidate(name: str, s: Shape, t: Inputs, ref: Reference) -> Candidate:
    """The candidate ``name`` (a backend, or SDPA restricted to one backend) at ``s``."""
    if name in _SDPA:
        return _sdpa(name, s, t, ref)
    if name not in registry.BACKEND_NAMES:
        return Candidate(name, reason="not a lazy attention KV-cache backend or baseline")
    meta = {"device": t.q.device.type, "dtype": t.q.dtype, "head_dim": s.D, "gqa": s.H != s.Hkv,
            "bias_length": s.W, "q_len": 1}
    reasons = registry.why_not(NAME, name, meta)
    if reasons:
        return Candidate(name, reason="; ".join(reasons))

    def fn():
        return lazy_attention_with_kvcache(t.q, t.k, t.v, t.bias, t.tau, t.seqlens, backend=name)
    # golden reads the key counts on the host, which a CUDA graph cannot capture: it runs eagerly
    return _timed(name, fn, ref, "", t.q.device.type == "cuda" and name != "golden")


def metrics(s: Shape, rec: dict, copy_gbps: float | None = None) -> dict:
    """The K and V bytes, their GB/s and the fraction of the speed of light."""
    nbytes = kv_bytes(s, getattr(torch, rec["dtype"]))
    out = {"fwd_bytes": nbytes}
    r = rec.get("fwd")
    if r and "median_ms" in r:
        out["fwd_gbps"] = nbytes / (r["median_ms"] * 1e-3) / 1e9
        if copy_gbps:
            out["fwd_sol"] = out["fwd_gbps"] / copy_gbps
    return out


# ----------------------------------------------------------------------------- report, plot


def heading(records: list[dict], run: dict) -> str:
    return (f"Lazy attention with a KV cache, decode Lq = 1 ({records[0]['dtype']}; copy bandwidth "
            f"{report.num(run.get('copy_gbps'))} GB/s)")


def _key(r: dict) -> tuple:
    s = r["shape"]
    return s["D"], s["B"], s["n"]


def table(records: list[dict]) -> str:
    """Markdown table: one row per shape x backend, with the time over SDPA cuDNN's at that shape."""
    cudnn = {_key(r): r["fwd"]["median_ms"] for r in records
             if r["backend"] == "sdpa_cudnn" and "median_ms" in (r.get("fwd") or {})}
    header = ["B", "cache n", "H/Hkv×D (W)", "backend", "fwd ms", "GB/s", "SOL", "× cuDNN", "max abs err",
              "rel err", "notes"]
    rows = []
    for r in sorted(records, key=_key):
        s, m, t = r["shape"], r["metrics"], (r.get("fwd") or {}).get("median_ms")
        ratio = t / cudnn[_key(r)] if t and _key(r) in cudnn else None
        err = (r.get("check") or {}).get("fwd") or {}
        rows.append([str(s["B"]), str(s["n"]), f"{s['H']}/{s['Hkv']}×{s['D']} ({s['W']})", r["backend"],
                     report.time_cell(r["fwd"]), report.num(m.get("fwd_gbps")), report.pct(m.get("fwd_sol")),
                     report.num(ratio, 3), report.num(err.get("max_abs"), 2), report.num(err.get("rel"), 2),
                     report.notes(r)])
    return report.markdown_table(header, rows)


PLOT_FILE = "lazy_attention_with_kvcache_sol.png"
PLOT_TITLE = "Lazy attention with a KV cache, decode"


def plot(records: list[dict], path: Path, title: str) -> Path | None:
    """Fraction of the speed of light (top) and median time (bottom, log) vs cache length, one panel per batch."""
    Bs = sorted({r["shape"]["B"] for r in records})
    if not Bs:
        return None
    plt = plots.pyplot()
    fig, axes = plots.grid(plt, len(Bs), title)
    styles = plots.styles(records)
    for row, (y_of, ylabel) in enumerate(((lambda r: r["metrics"].get("fwd_sol"), "fraction of the speed of light"),
                                          (lambda r: (r.get("fwd") or {}).get("median_ms"), "median time (ms)"))):
        panels = plots.series(records, lambda r: r["shape"]["B"], lambda r: r["shape"]["n"], y_of)
        for col, B in enumerate(Bs):
            ax = axes[row][col]
            plots.draw(ax, panels.get(B, {}), styles)
            ax.set_xscale("log", base=2)
            if row:
                ax.set_yscale("log")
            else:
                plots.fraction_axis(ax)
            ax.set_title(f"B = {B}")
            ax.set_xlabel("cache length n")
            ax.set_ylabel(ylabel)
    return plots.save(plt, fig, path)
