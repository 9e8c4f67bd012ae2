"""One candidate (a kernel_dispatch backend or a baseline at one shape), how it is run, and its errors.

A candidate that cannot run carries its reason; one that raises becomes an ``{"error": ...}``
entry in its record, never the end of the sweep.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import torch

from .timing import Timer

KERNEL_BACKENDS = ("golden", "triton", "tilelang")


@dataclass
class Candidate:
    """One way to compute an operator on the inputs of one sweep point.

    name: a kernel_dispatch backend (golden, triton, tilelang) or a baseline name.
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
        return "kernel" if self.name in KERNEL_BACKENDS else "baseline"


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


def run_candidate(c: Candidate, timer: Timer) -> dict:
    """Measure ``c``: forward, forward+backward, then its correctness check.

    Both run with autograd recording: the forward is that of a training step (residuals kept,
    as every kernel_dispatch forward does), and one compiled graph serves both timings.

    Returns {"backend", "kind", "reason", "note", "fwd", "fwd_bwd", "check", "seconds"}; fwd and
    fwd_bwd are :meth:`Timer.measure` dicts, ``{"error": ...}`` or None (not run).
    """
    t0 = time.perf_counter()
    rec = {"backend": c.name, "kind": c.kind, "reason": c.reason, "note": c.note,
           "fwd": None, "fwd_bwd": None, "check": None}
    if c.reason is None:
        for key, fn in (("fwd", c.forward), ("fwd_bwd", c.fwd_bwd)):
            if fn is not None:
                def thunk(fn=fn):
                    with torch.enable_grad():
                        return timer.measure(fn)
                rec[key] = _guard(thunk, timer)
        if c.check is not None and "error" not in (rec["fwd"] or {}):
            rec["check"] = _guard(c.check, timer)
    rec["note"] = c.note  # a run may add to it (a baseline's fallback settings)
    rec["seconds"] = round(time.perf_counter() - t0, 2)
    timer.release()
    return rec


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


def sweep(op, shapes, names, dtype: torch.dtype, timer: Timer, progress=None, on_record=None,
          **extra) -> list[dict]:
    """Run every candidate ``names`` at every shape of operator module ``op`` (attention or mhc).

    ``op`` provides OP, make_inputs, Reference, candidate and metrics; ``extra`` goes to metrics;
    ``on_record(record)`` is called after each record (the caller saves partial results).
    Returns one record per (shape, name): the :func:`run_candidate` dict plus op, shape, dtype, metrics.
    """
    records = []
    for s in shapes:
        t = op.make_inputs(s, dtype, timer.device)
        ref = op.Reference(t, s)
        for name in names:
            if progress is not None:
                progress.set_postfix_str(f"{op.OP} {s.label()} {name}", refresh=False)
            try:
                c = op.candidate(name, s, t, ref)
            except Exception as e:  # building a baseline (an import, a block mask) may fail too
                c = Candidate(name, reason=f"could not be set up: {short_error(e)}")
            rec = run_candidate(c, timer)
            rec.update(op=op.OP, shape=s.as_dict(), dtype=str(dtype).replace("torch.", ""))
            rec["metrics"] = op.metrics(s, rec, **extra)
            records.append(rec)
            if on_record is not None:
                on_record(rec)
            if progress is not None:
                progress.update(1)
        del t, ref
        timer.release()
    return records
