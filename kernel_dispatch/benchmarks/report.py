"""The run's environment, its JSON file, and the markdown tables printed to stdout and used in the docs.

Each operator's table comes from its bench module (see :mod:`kernel_dispatch.benchmarks.common`), built from
the cells here (:func:`time_cell`, :func:`err_cell`, ...); records of an operator without one get
:func:`generic_table`.
"""
from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path

import torch

import kernel_dispatch as kd

from .common import modules, option

REPO = Path(__file__).resolve().parents[2]
# How to read the numbers of every bench module; each module's own CONVENTIONS come before these.
GENERIC_CONVENTIONS = {
    "copy_bandwidth": "dst.copy_(src) of a 1 GiB tensor, bytes read + written over the median time",
    "time": "median of the timed runs (CUDA events), L2 flushed before each; +-x% is half the interquartile "
            "range over the median; fwd is the forward of a training step (autograd on, residuals kept); the "
            "backends of one shape are timed in alternation (settings.rounds rounds, every other one in reverse "
            "order, each backend's runs split over them), so a card whose clocks fall under its power cap as it "
            "heats slows them alike",
    "peak_memory": "max_memory_allocated during one run minus the memory allocated before it (inputs excluded)",
    "first_call": "wall seconds of the first forward and the first forward+backward of a kernel class "
                  "(compilation or disk-cache load, and Triton's autotuning, included); Triton's autotuning winners "
                  "and TileLang's kernels are cached on disk ($TRITON_CACHE_DIR, $TILELANG_CACHE_DIR), so a later "
                  "process pays only the load; the GPU runs recorded here loaded TileLang kernels from a cache built "
                  "on a CPU machine (scripts/prebuild_tilelang.py; a cold build takes about 5-35 s per kernel on "
                  "2 CPU cores)",
    "errors": "max abs error and ||out - ref|| / ||ref|| against golden float64 on the same inputs (a slice "
              "at large shapes); bwd: the gradient with the largest relative error",
}


def conventions() -> dict[str, str]:
    """How to read the numbers: every bench module's CONVENTIONS in module order, then the generic ones."""
    out: dict[str, str] = {}
    for mod in modules().values():
        out.update(option(mod, "CONVENTIONS", {}))
    return {**out, **GENERIC_CONVENTIONS}


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _run(cmd: list[str]) -> str | None:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=20, cwd=REPO)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def environment(device: torch.device) -> dict:
    """Card, driver, CUDA, torch, triton and tilelang versions, date and commit of this run.

    The commit is ``git rev-parse --short HEAD`` (+dirty with tracked changes), or ``$KD_GIT_COMMIT`` when set:
    for copies of the tree whose .git is not the tree's (a remote GPU machine's copy, an exported archive)."""
    env = {"device": device.type, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "python": platform.python_version(), "platform": platform.platform(), "torch": torch.__version__,
           "cuda": torch.version.cuda, "triton": _version("triton"), "tilelang": _version("tilelang"),
           "kernel_dispatch": kd.__version__, "git_commit": _run(["git", "rev-parse", "--short", "HEAD"])}
    if env["git_commit"] and _run(["git", "status", "--porcelain", "--untracked-files=no"]):
        env["git_commit"] += "+dirty"
    if os.environ.get("KD_GIT_COMMIT"):
        env["git_commit"] = os.environ["KD_GIT_COMMIT"]
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        env.update(card=p.name, capability=f"{p.major}.{p.minor}", sms=p.multi_processor_count,
                   memory_gib=round(p.total_memory / 2**30, 1), cudnn=torch.backends.cudnn.version(),
                   driver=_run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader",
                                f"--id={device.index or 0}"]))
    else:
        env.update(card=platform.processor() or platform.machine(), driver=None)
    return env


def write_json(data: dict, path: str | Path) -> Path:
    """Write the run (environment, conventions, settings, records) to ``path`` as JSON."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, default=str) + "\n")
    return path


# ----------------------------------------------------------------------------- tables


def num(x: float | None, digits: int = 4) -> str:
    """``x`` to ``digits`` significant digits, or a dash."""
    return "—" if x is None else f"{x:.{digits}g}"


def pct(x: float | None) -> str:
    """A fraction as a whole percentage, or a dash."""
    return "—" if x is None else f"{100 * x:.0f}%"


def time_cell(r: dict | None) -> str:
    """A :meth:`Timer.measure` dict as 'median ±spread%' (ms; spread: half the interquartile range), or a dash."""
    if not r or "median_ms" not in r:
        return "—"
    spread = 50 * (r["q3_ms"] - r["q1_ms"]) / r["median_ms"] if r["median_ms"] > 0 else 0.0
    return f"{r['median_ms']:.4g} ±{spread:.0f}%"


def peak_cell(rec: dict) -> str:
    """Peak MiB of the forward and of the forward+backward of a record, or a dash."""
    vals = [(rec.get(k) or {}).get("peak_mib") for k in ("fwd", "fwd_bwd")]
    return "—" if all(v is None for v in vals) else " / ".join(num(v, 5) for v in vals)


def err_cell(rec: dict, field: str) -> str:
    """The check's ``field`` (max_abs or rel) of the forward and of the worst gradient (named), or a dash."""
    c = rec.get("check") or {}
    if "error" in c or not c:
        return "—"
    cells = []
    for d in ("fwd", "bwd"):
        e = c.get(d) or {}
        cells.append("—" if field not in e else f"{e[field]:.1e}" + (f" ({e['tensor']})" if d == "bwd" else ""))
    return " / ".join(cells)


def notes(rec: dict) -> str:
    """Why a row has no numbers (its reason or errors), and the candidate's note."""
    parts = []
    if rec.get("reason"):
        parts.append(f"not run: {rec['reason']}")
    for key, label in (("fwd", "fwd"), ("fwd_bwd", "fwd+bwd"), ("check", "check")):
        err = (rec.get(key) or {}).get("error")
        if err:
            parts.append(f"{label} failed: {err}")
    bwd_err = ((rec.get("check") or {}).get("bwd") or {}).get("error")
    if bwd_err:
        parts.append(f"bwd check failed: {bwd_err}")
    if rec.get("note"):
        parts.append(rec["note"])
    return "; ".join(parts).replace("|", "\\|")


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    """A markdown table: ``header`` (column names) over ``rows`` (lists of cells)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def generic_table(records: list[dict]) -> str:
    """Markdown table of any operator's records, in record order: the shape's fields, times, peak memory,
    errors and notes."""
    keys = list(dict.fromkeys(k for r in records for k in r["shape"]))
    header = keys + ["backend", "fwd ms", "fwd+bwd ms", "peak MiB fwd / f+b", "max abs err fwd / bwd",
                     "rel err fwd / bwd", "notes"]
    rows = [[str(r["shape"].get(k, "")) for k in keys]
            + [r["backend"], time_cell(r["fwd"]), time_cell(r["fwd_bwd"]), peak_cell(r), err_cell(r, "max_abs"),
               err_cell(r, "rel"), notes(r)] for r in records]
    return markdown_table(header, rows)


def env_line(env: dict) -> str:
    """One line naming the card, driver and versions."""
    keys = ("card", "driver", "cuda", "torch", "triton", "tilelang", "git_commit", "date")
    return ", ".join(f"{k} {env.get(k)}" for k in keys if env.get(k) is not None)


def tables(data: dict, level: int = 2) -> str:
    """Every op's table under a heading, in the order of the bench modules (then ops no declared bench module
    has, with :func:`generic_table`), and the first-call table."""
    h = "#" * level
    out = []
    mods = modules()
    ops = list(mods) + [op for op in dict.fromkeys(r["op"] for r in data["records"]) if op not in mods]
    for op in ops:
        recs = [r for r in data["records"] if r["op"] == op]
        if not recs:
            continue
        mod = mods.get(op)
        heading = option(mod, "heading", lambda records, run: op)(recs, data)
        out.append(f"{h} {heading}\n\n{option(mod, 'table', generic_table)(recs)}")
    first = first_call_table(data["records"])
    if first:
        out.append(f"{h} First call (compilation, cache load and autotuning)\n\n{first}")
    return "\n\n".join(out)


def first_call_table(records: list[dict]) -> str:
    """Seconds of the first call of every backend but golden (the reference: nothing to compile), for the first
    shape of each kernel class (op and head dim or D): later shapes of a class reuse its compiled kernels
    (symbolic sizes)."""
    rows, seen = [], set()
    for r in records:
        if r["backend"] == "golden" or r["kind"] != "kernel":
            continue
        cls = (r["op"], r["backend"], r["shape"].get("D"))
        first = [(r.get(k) or {}).get("first_call_s") for k in ("fwd", "fwd_bwd")]
        if cls in seen or first[0] is None:
            continue
        seen.add(cls)
        shape = ", ".join(f"{k}={v}" for k, v in r["shape"].items())
        rows.append(f"| {r['op']} | {shape} | {r['backend']} | {num(first[0])} | {num(first[1])} |")
    if not rows:
        return ""
    return "\n".join(["| op | first shape of its class | backend | fwd first call s | fwd+bwd first call s |",
                      "|---|---|---|---|---|"] + rows)


def failures(records: list[dict]) -> list[str]:
    """One line per run of a kernel_dispatch backend (not a baseline) that raised."""
    out = []
    for r in records:
        if r["kind"] != "kernel":
            continue
        for key in ("fwd", "fwd_bwd", "check"):
            err = (r.get(key) or {}).get("error")
            if err:
                out.append(f"{r['op']} {r['shape']} {r['backend']} {key}: {err}")
    return out
