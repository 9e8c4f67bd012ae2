"""The mHC block's bench module (the protocol: :mod:`kernel_dispatch.benchmarks.common`), named by mhc_pre's
declaration: one block pre -> identity sublayer -> post, its inputs, candidates, bytes and errors, its table,
plot and README summary rows.

Speed of light: the fewest bytes each pass must move, per token, for bf16 activations
(forward: pre 10D + post 18D; backward: pre 26D + post 28D; scaled by the element size for
other dtypes), divided by the device-to-device copy bandwidth measured in the same run. GB/s is
those bytes over the measured time; the fraction of the speed of light is that over the copy rate.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import torch

from .. import registry
from ..benchmarks import plots, report
from ..benchmarks.baselines import compiled, dynamic
from ..benchmarks.common import Candidate, check_record, compare, from_fn, int_list, one_int, short_error
from ..golden import mhc_post as golden_post
from ..golden import mhc_pre as golden_pre
from .mhc_post import mhc_post
from .mhc_pre import mhc_pre

NAME = "mhc"
OPS = ("mhc_pre", "mhc_post")
BASELINES = ("golden_compile",)
BASELINE_NOTES = {"golden_compile": "torch.compile of the golden forward, backward derived by autograd"}
COPY_BANDWIDTH = True
CONVENTIONS = {
    "mhc_bytes": "minimum bytes per token, bf16: fwd pre 10D + post 18D, bwd pre 26D + post 28D "
                 "(x element size / 2 for other dtypes)",
    "mhc_sol": "fraction of the speed of light = (minimum bytes / copy bandwidth) / measured time",
    "mhc_block": "mhc_pre -> identity -> mhc_post wired as kernel_dispatch.nn.MHC wires them: x reaches post "
                 "through pre's residual output (return_residual=True), so the pre backward adds post's gradient "
                 "of x inside its dx kernel (the 26D bytes of the pre backward count that read)",
}
SIZE_FLAGS = ("T",)
D_HELP = ("hidden sizes", "1280,7168")
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


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Its options: --T, --n (sizes like '16K' accepted)."""
    p.add_argument("--T", type=int_list, help="mHC token counts")
    p.add_argument("--n", type=one_int, help="mHC streams (default 4)")


def shapes(args: argparse.Namespace, quick: bool, Ds: tuple[int, ...] | None) -> list[Shape]:
    """Every (T, D) pair, D-major."""
    d = QUICK if quick else DEFAULT
    n = args.n or d["n"]
    return [Shape(T, n, D) for D in (Ds or d["D"]) for T in (args.T or d["T"])]


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
    """Random inputs at the scales of the matrix's cases (mhc_cases.make_pre_inputs)."""
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
        h_in, h_post, h_res, x_res = mhc_pre(x, phi, alpha, bias, gamma, backend=backend, return_residual=True)
        return mhc_post(h_in, x_res, h_post, h_res, backend=backend)
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


def _golden_block(x, phi, alpha, bias, gamma):
    h_in, h_post, h_res, _, _ = golden_pre.forward(x, phi, alpha, bias, gamma, 20, 2.0, 1e-6, 1e-6, 1e-6)
    return golden_post.forward(h_in, x, h_post, h_res)


def golden_compile():
    """fn(x, phi, alpha, bias, gamma) -> out [T, n, D]: compiled golden pre -> identity -> post; T, D symbolic."""
    block_compiled = compiled(_golden_block)

    def fn(x, phi, alpha, bias, gamma):
        return block_compiled(dynamic(x, 0, 2), dynamic(phi, 1), alpha, bias, dynamic(gamma, 0))
    return fn


def candidate(name: str, s: Shape, t: Inputs, ref: Reference) -> Candidate:
    """The candidate ``name`` (a backend, or golden_compile) at shape ``s``."""
    if name == "golden_compile":
        return from_fn(name, golden_compile(), t.leaves, t.g, ref, "compiled golden")
    if name not in registry.BACKEND_NAMES:
        return Candidate(name, reason="not an mHC backend or baseline")
    reasons = why_not(name, s, t.x.dtype, t.x.device)
    if reasons:
        return Candidate(name, reason="; ".join(reasons))
    return from_fn(name, block(name), t.leaves, t.g, ref)


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


# ----------------------------------------------------------------------------- report, plot, README rows


def heading(records: list[dict], run: dict) -> str:
    return (f"mHC block: pre -> identity -> post ({records[0]['dtype']}; copy bandwidth "
            f"{report.num(run.get('copy_gbps'))} GB/s)")


def table(records: list[dict]) -> str:
    """Markdown table of mHC block records (one row per shape x backend)."""
    header = ["T", "n", "D", "backend", "fwd ms", "fwd GB/s", "fwd SOL", "fwd+bwd ms", "fwd+bwd GB/s",
              "fwd+bwd SOL", "peak MiB fwd / f+b", "max abs err fwd / bwd", "rel err fwd / bwd", "notes"]
    rows = []
    for r in sorted(records, key=lambda r: (r["shape"]["D"], r["shape"]["T"])):
        s, m = r["shape"], r["metrics"]
        rows.append([str(s["T"]), str(s["n"]), str(s["D"]), r["backend"], report.time_cell(r["fwd"]),
                     report.num(m.get("fwd_gbps")), report.pct(m.get("fwd_sol")), report.time_cell(r["fwd_bwd"]),
                     report.num(m.get("fwd_bwd_gbps")), report.pct(m.get("fwd_bwd_sol")), report.peak_cell(r),
                     report.err_cell(r, "max_abs"), report.err_cell(r, "rel"), report.notes(r)])
    return report.markdown_table(header, rows)


PLOT_FILE = "mhc_sol.png"
PLOT_TITLE = "mHC block pre -> post"


def plot(records: list[dict], path: Path, title: str) -> Path | None:
    """Fraction of the speed of light vs D per backend; columns are token counts T, rows fwd and fwd+bwd."""
    Ts = sorted({r["shape"]["T"] for r in records})
    if not Ts:
        return None
    plt = plots.pyplot()
    fig, axes = plots.grid(plt, len(Ts), title)
    styles = plots.styles(records)
    for row, (key, label) in enumerate(plots.DIRECTIONS):
        panels = plots.series(records, lambda r: r["shape"]["T"], lambda r: r["shape"]["D"],
                              lambda r, key=key: r["metrics"].get(f"{key}_sol"))
        for col, T in enumerate(Ts):
            ax = axes[row][col]
            plots.draw(ax, panels.get(T, {}), styles)
            plots.fraction_axis(ax)
            ax.set_title(f"T = {T}, {label}")
            ax.set_xlabel("D (hidden size)")
            ax.set_ylabel("fraction of the speed of light")
    return plots.save(plt, fig, path)


# The README's speed summary: the block at its two largest widths, each backend and baseline in one row.
SUMMARY_SHAPE = {"T": 16384, "n": 4, "D": (4096, 7168)}
SUMMARY_ROWS = {"tilelang": "tilelang", "triton": "triton", "golden_compile": "torch.compile of golden"}


def summary(records: list[dict]) -> str:
    """The README's rows: the fraction of the speed of light of each direction at SUMMARY_SHAPE."""
    m = SUMMARY_SHAPE
    head = " | ".join(f"D={d} fwd | D={d} fwd+bwd" for d in m["D"])
    lines = [f"| mHC block (pre, identity, post), bf16, T={m['T']} n={m['n']}: fraction of the speed of light "
             f"| {head} |", "|---|" + "---|" * (2 * len(m["D"]))]
    for backend, label in SUMMARY_ROWS.items():
        cells = []
        for d in m["D"]:
            shape = {"T": m["T"], "n": m["n"], "D": d}
            r = next((r for r in records if r["backend"] == backend
                      and all(r["shape"].get(k) == v for k, v in shape.items())), None)
            cells += [report.pct(((r or {}).get("metrics") or {}).get(f"{key}_sol")) for key in ("fwd", "fwd_bwd")]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
