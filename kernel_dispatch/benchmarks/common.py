"""The bench module protocol, the discovery of bench modules, and one candidate (a kernel_dispatch backend or a
baseline at one shape): how it is run, and its errors.

A candidate that cannot run carries its reason; one that raises becomes an ``{"error": ...}``
entry in its record, never the end of the sweep.

Bench modules
-------------
An operator's declaration names its bench module (``Operator.bench``: an import path or the module object
itself; see :mod:`kernel_dispatch.declaration`); :func:`modules` finds them, and ``python -m
kernel_dispatch.bench``, the report, the plots and the docs call them by the ``op`` of each record. Several
operators may share one bench module (one that benchmarks a block of them). A bench module provides:

- ``NAME``: the ``op`` of its records, its ``--ops`` name and its ``--D NAME=...`` key (``"mhc"``).
- ``BASELINES``: names of the baselines it runs beside the backends, in run order (may be empty).
- ``add_arguments(parser)``: adds its own command-line options (each flag unique across bench modules).
- ``shapes(args, quick, Ds) -> list``: the sweep for the parsed ``args``; ``quick``: the CPU smoke;
  ``Ds``: the ``--D`` values given for it, or None. A shape has ``as_dict()`` (the record's ``shape``)
  and ``label()``.
- ``make_inputs(shape, dtype, device) -> inputs``; ``Reference(inputs, shape)``: the golden float64
  reference, computed lazily; ``candidate(name, shape, inputs, reference) -> Candidate`` for every
  backend of ``registry.BACKEND_NAMES`` and every name of ``BASELINES``.
- ``metrics(shape, record, copy_gbps) -> dict``: its figures of merit from a timed record (``copy_gbps``:
  the device copy bandwidth when ``COPY_BANDWIDTH`` asked for it, else None).

and optionally:

- ``COPY_BANDWIDTH`` (False): measure the device-to-device copy bandwidth before the sweep.
- ``SIZE_FLAGS`` (()): its options that size a sweep small enough for a CPU run (``("L",)``).
- ``D_HELP`` (None): (what ``--D`` sets for it, an example) for the ``--D`` help.
- ``CONVENTIONS`` ({}): key -> how to read its numbers (the JSON's ``conventions`` and the docs page).
- ``BASELINE_NOTES`` ({}): baseline name -> what it is, for the docs page (a baseline described by several
  bench modules is described by the first).
- ``heading(records, run) -> str``: the title of its table (default: ``NAME``); ``run`` is the whole JSON.
- ``table(records) -> str``: its markdown table (default: :func:`kernel_dispatch.benchmarks.report.generic_table`).
- ``PLOT_FILE``, ``PLOT_TITLE``, ``plot(records, path, title) -> Path | None``: its PNG plot.
- ``summary(records) -> str``: its rows of the README's speed summary (a markdown table).
"""
from __future__ import annotations

import argparse
import importlib
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch

from .. import declaration, registry
from .timing import Timer


def modules() -> dict[str, Any]:
    """Every bench module named by a declared operator, by NAME, in declaration order."""
    out: dict[str, Any] = {}
    for op in declaration.operators():
        bench = declaration.operator(op).bench
        if bench is None:
            continue
        mod = importlib.import_module(bench) if isinstance(bench, str) else bench
        out.setdefault(mod.NAME, mod)
    return out


def int_list(text: str) -> tuple[int, ...]:
    """A command-line list of sizes: '1K,2048,32k' -> (1024, 2048, 32768)."""
    out = []
    for item in filter(None, (s.strip() for s in text.split(","))):
        mult = 1024 if item[-1] in "kK" else 1
        try:
            out.append(int(item[:-1] if mult > 1 else item) * mult)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected comma-separated integers (1K = 1024), got {item!r}") from None
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return tuple(out)


def one_int(text: str) -> int:
    """A command-line size: '16K' -> 16384."""
    return int_list(text)[0]


def option(mod: Any, name: str, default: Any = None) -> Any:
    """An optional attribute of a bench module (see the protocol above), or ``default``."""
    return getattr(mod, name, default)


def baselines() -> tuple[str, ...]:
    """Every baseline of every bench module, each once, in module order."""
    return tuple(dict.fromkeys(b for mod in modules().values() for b in mod.BASELINES))


@dataclass
class Candidate:
    """One way to compute an operator on the inputs of one sweep point.

    name: a kernel_dispatch backend (``registry.BACKEND_NAMES``) or a baseline name.
    reason: why it cannot run here (None when it can).
    forward / fwd_bwd: run once (forward only; forward then backward of every input).
    check: returns errors against the golden float64 reference, see :func:`compare`.
    note: what the reader must know to read its numbers (e.g. 'plain attention, no bias').
    """

    name: str
    reason: str | None = None
    forward: Callable[[], object] | None = None
    fwd_bwd: Callable[[], object] | None = None
    check: Callable[[], dict] | None = None
    note: str = ""

    @property
    def kind(self) -> str:
        return "kernel" if self.name in registry.BACKEND_NAMES else "baseline"


def from_fn(name: str, fn: Callable, leaves: tuple, grad_out: torch.Tensor, reference: Any,
            note: str = "") -> Candidate:
    """The candidate that runs ``fn(*leaves)`` (forward), its gradient of every leaf for the upstream
    ``grad_out`` (forward+backward), and ``reference.check(fn)``."""
    return Candidate(name, forward=lambda: fn(*leaves),
                     fwd_bwd=lambda: torch.autograd.grad(fn(*leaves), leaves, grad_out),
                     check=lambda: reference.check(fn), note=note)


def short_error(e: BaseException) -> str:
    """One line naming the exception, at most 300 characters."""
    lines = [s for s in str(e).strip().splitlines() if s.strip()]
    msg = f"{type(e).__name__}: {lines[0] if lines else ''}"
    return msg if len(msg) <= 300 else msg[:297] + "..."


def _guard(thunk: Callable[[], dict], timer: Timer) -> dict:
    try:
        return thunk()
    except Exception as e:  # a failing backend is a row in the table, never the end of the run
        timer.release()
        return {"error": short_error(e)}


def run_candidates(cands: list[Candidate], timer: Timer) -> list[dict]:
    """Measure the candidates of one sweep point: the forwards of all of them in alternation
    (:meth:`Timer.measure_interleaved`), then the forward+backward steps, then each one's correctness check.

    Both directions run with autograd recording: the forward is that of a training step (residuals kept,
    as every kernel_dispatch forward does), and one compiled graph serves both timings.

    Returns per candidate, in order, {"backend", "kind", "reason", "note", "fwd", "fwd_bwd", "check",
    "seconds"}; fwd and fwd_bwd are :meth:`Timer.measure` dicts, ``{"error": ...}`` or None (not run);
    seconds is the wall time of the whole point.
    """
    t0 = time.perf_counter()
    recs = [{"backend": c.name, "kind": c.kind, "reason": c.reason, "note": c.note,
             "fwd": None, "fwd_bwd": None, "check": None} for c in cands]
    for key, attr in (("fwd", "forward"), ("fwd_bwd", "fwd_bwd")):
        fns = {i: getattr(c, attr) for i, c in enumerate(cands) if c.reason is None and getattr(c, attr)}
        with torch.enable_grad():
            timed = timer.measure_interleaved(fns)
        for i, got in timed.items():
            recs[i][key] = {"error": short_error(got)} if isinstance(got, Exception) else got
        timer.release()
    for c, rec in zip(cands, recs):
        if c.reason is None and c.check is not None and "error" not in (rec["fwd"] or {}):
            rec["check"] = _guard(c.check, timer)
        rec["note"] = c.note  # a run may add to it (a baseline's fallback settings)
    seconds = round(time.perf_counter() - t0, 2)
    for rec in recs:
        rec["seconds"] = seconds
    timer.release()
    return recs


def compare(got: dict[str, torch.Tensor], ref: dict[str, torch.Tensor]) -> dict[str, dict]:
    """Per tensor: max_abs = max |got - ref| and rel = ||got - ref|| / ||ref|| (Frobenius), in float64."""
    out = {}
    for name, r in ref.items():
        g = got[name].detach().to(torch.float64)
        r = r.detach().to(torch.float64)
        if g.shape != r.shape:
            out[name] = {"error": f"shape {tuple(g.shape)} != reference {tuple(r.shape)}"}
            continue
        diff = g - r
        den = r.norm().item()
        rel = diff.norm().item() / den if den > 0 else diff.norm().item()
        if not torch.isfinite(g).all():
            rel = float("inf")
        out[name] = {"max_abs": diff.abs().max().item() if diff.numel() else 0.0, "rel": rel}
    return out


def worst(per_tensor: dict[str, dict], names) -> dict | None:
    """The entry of ``names`` with the largest relative error, with its tensor name."""
    rows = [dict(per_tensor[n], tensor=n) for n in names if n in per_tensor]
    if not rows:
        return None
    bad = [r for r in rows if "error" in r]
    return bad[0] if bad else max(rows, key=lambda r: r["rel"])


def check_record(reference: str, fwd_names, bwd_names, errors_fwd: dict, errors_bwd: dict | str) -> dict:
    """The record of one correctness check: the reference described, worst forward/backward error, all tensors."""
    tensors = dict(errors_fwd)
    rec = {"reference": reference, "fwd": worst(errors_fwd, fwd_names)}
    if isinstance(errors_bwd, str):
        rec["bwd"] = {"error": errors_bwd}
    else:
        tensors.update(errors_bwd)
        rec["bwd"] = worst(errors_bwd, bwd_names)
    rec["tensors"] = tensors
    return rec


def sweep(mod, shapes, names, dtype: torch.dtype, timer: Timer, progress=None, on_record=None,
          copy_gbps: float | None = None) -> list[dict]:
    """Run every candidate ``names`` at every shape of bench module ``mod`` (see the protocol above).

    ``copy_gbps`` goes to its metrics; ``on_record(record)`` is called after each record (the caller saves
    partial results). Returns one record per (shape, name): the :func:`run_candidates` dict plus op, shape,
    dtype, metrics.
    """
    records = []
    for s in shapes:
        t = mod.make_inputs(s, dtype, timer.device)
        ref = mod.Reference(t, s)
        if progress is not None:
            progress.set_postfix_str(f"{mod.NAME} {s.label()} ({len(names)} in turn)", refresh=False)
        cands = []
        for name in names:
            try:
                cands.append(mod.candidate(name, s, t, ref))
            except Exception as e:  # building a baseline (an import, a block mask) may fail too
                cands.append(Candidate(name, reason=f"could not be set up: {short_error(e)}"))
        for rec in run_candidates(cands, timer):
            rec.update(op=mod.NAME, shape=s.as_dict(), dtype=str(dtype).replace("torch.", ""))
            rec["metrics"] = mod.metrics(s, rec, copy_gbps)
            records.append(rec)
            if on_record is not None:
                on_record(rec)
            if progress is not None:
                progress.update(1)
        del t, ref, cands
        timer.release()
    return records
