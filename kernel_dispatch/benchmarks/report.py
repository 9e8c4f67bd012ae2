"""The run's environment, its JSON file, and the markdown tables printed to stdout and used in the docs."""
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

REPO = Path(__file__).resolve().parents[2]
CONVENTIONS = {
    "lazy_attention_flops": "causal FlashAttention convention: fwd 4*B*H*L^2*D/2, bwd 2.5x fwd, fwd+bwd 3.5x fwd",
    "mhc_bytes": "minimum bytes per token, bf16: fwd pre 10D + post 18D, bwd pre 26D + post 28D "
                 "(x element size / 2 for other dtypes)",
    "mhc_sol": "fraction of the speed of light = (minimum bytes / copy bandwidth) / measured time",
    "mhc_block": "mhc_pre -> identity -> mhc_post wired as kernel_dispatch.nn.MHC wires them: x reaches post "
                 "through pre's residual output (return_residual=True), so the pre backward adds post's gradient "
                 "of x inside its dx kernel (the 26D bytes of the pre backward count that read)",
    "copy_bandwidth": "dst.copy_(src) of a 1 GiB tensor, bytes read + written over the median time",
    "time": "median of the timed runs (CUDA events), L2 flushed before each; +-x% is half the interquartile "
            "range over the median; fwd is the forward of a training step (autograd on, residuals kept)",
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


def _num(x: float | None, digits: int = 4) -> str:
    return "—" if x is None else f"{x:.{digits}g}"


def pct(x: float | None) -> str:
    """A fraction as a whole percentage, or a dash."""
    return "—" if x is None else f"{100 * x:.0f}%"


def _time(r: dict | None) -> str:
    if not r or "median_ms" not in r:
        return "—"
    spread = 50 * (r["q3_ms"] - r["q1_ms"]) / r["median_ms"] if r["median_ms"] > 0 else 0.0
    return f"{r['median_ms']:.4g} ±{spread:.0f}%"


def _peak(rec: dict) -> str:
    vals = [(rec.get(k) or {}).get("peak_mib") for k in ("fwd", "fwd_bwd")]
    return "—" if all(v is None for v in vals) else " / ".join(_num(v, 5) for v in vals)


def _err(rec: dict, field: str) -> str:
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


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def attention_table(records: list[dict]) -> str:
    """Markdown table of lazy attention records (one row per shape x backend)."""
    header = ["B×H×L×D (W)", "backend", "fwd ms", "fwd TFLOP/s", "fwd+bwd ms", "fwd+bwd TFLOP/s",
              "peak MiB fwd / f+b", "max abs err fwd / bwd", "rel err fwd / bwd", "notes"]
    rows = []
    for r in sorted(records, key=lambda r: (r["shape"]["D"], r["shape"]["L"])):
        s, m = r["shape"], r["metrics"]
        rows.append([f"{s['B']}×{s['H']}×{s['L']}×{s['D']} ({s['W']})", r["backend"], _time(r["fwd"]),
                     _num(m.get("fwd_tflops"), 3), _time(r["fwd_bwd"]), _num(m.get("fwd_bwd_tflops"), 3), _peak(r),
                     _err(r, "max_abs"), _err(r, "rel"), notes(r)])
    return _table(header, rows)


def mhc_table(records: list[dict]) -> str:
    """Markdown table of mHC block records (one row per shape x backend)."""
    header = ["T", "n", "D", "backend", "fwd ms", "fwd GB/s", "fwd SOL", "fwd+bwd ms", "fwd+bwd GB/s",
              "fwd+bwd SOL", "peak MiB fwd / f+b", "max abs err fwd / bwd", "rel err fwd / bwd", "notes"]
    rows = []
    for r in sorted(records, key=lambda r: (r["shape"]["D"], r["shape"]["T"])):
        s, m = r["shape"], r["metrics"]
        rows.append([str(s["T"]), str(s["n"]), str(s["D"]), r["backend"], _time(r["fwd"]), _num(m.get("fwd_gbps")),
                     pct(m.get("fwd_sol")), _time(r["fwd_bwd"]), _num(m.get("fwd_bwd_gbps")),
                     pct(m.get("fwd_bwd_sol")), _peak(r), _err(r, "max_abs"), _err(r, "rel"), notes(r)])
    return _table(header, rows)


def env_line(env: dict) -> str:
    """One line naming the card, driver and versions."""
    keys = ("card", "driver", "cuda", "torch", "triton", "tilelang", "git_commit", "date")
    return ", ".join(f"{k} {env.get(k)}" for k in keys if env.get(k) is not None)


def tables(data: dict, level: int = 2) -> str:
    """Every op's table under a heading, in the order lazy attention, mHC."""
    h = "#" * level
    out = []
    att = [r for r in data["records"] if r["op"] == "lazy_attention"]
    mhc = [r for r in data["records"] if r["op"] == "mhc"]
    if att:
        out.append(f"{h} Lazy attention (causal, {att[0]['dtype']})\n\n{attention_table(att)}")
    if mhc:
        bw = data.get("copy_gbps")
        out.append(f"{h} mHC block: pre -> identity -> post ({mhc[0]['dtype']}; copy bandwidth "
                   f"{_num(bw)} GB/s)\n\n{mhc_table(mhc)}")
    first = first_call_table(data["records"])
    if first:
        out.append(f"{h} First call (compilation, cache load and autotuning)\n\n{first}")
    return "\n\n".join(out)


def first_call_table(records: list[dict]) -> str:
    """Seconds of the first call of the Triton and TileLang backends, for the first shape of each kernel
    class (op and head dim or D): later shapes of a class reuse its compiled kernels (symbolic sizes)."""
    rows, seen = [], set()
    for r in records:
        if r["backend"] not in ("triton", "tilelang") or r["kind"] != "kernel":
            continue
        cls = (r["op"], r["backend"], r["shape"].get("D"))
        first = [(r.get(k) or {}).get("first_call_s") for k in ("fwd", "fwd_bwd")]
        if cls in seen or first[0] is None:
            continue
        seen.add(cls)
        shape = ", ".join(f"{k}={v}" for k, v in r["shape"].items())
        rows.append(f"| {r['op']} | {shape} | {r['backend']} | {_num(first[0])} | {_num(first[1])} |")
    if not rows:
        return ""
    return "\n".join(["| op | first shape of its class | backend | fwd first call s | fwd+bwd first call s |",
                      "|---|---|---|---|---|"] + rows)


def failures(records: list[dict]) -> list[str]:
    """One line per kernel backend (golden, triton, tilelang) whose run raised."""
    out = []
    for r in records:
        if r["kind"] != "kernel":
            continue
        for key in ("fwd", "fwd_bwd", "check"):
            err = (r.get(key) or {}).get("error")
            if err:
                out.append(f"{r['op']} {r['shape']} {r['backend']} {key}: {err}")
    return out
