"""One result from several saved runs of one machine: a sweep longer than one process may run (a time limit per
command) is run as a few invocations, each with its own ``--json``, then merged into one page with
``python -m kernel_dispatch.bench --from-json a.json,b.json --docs``.

The runs must agree on what makes numbers comparable: the card, its driver, the software versions and the commit.
Each keeps its command, date, settings and wall time under ``runs``. Refused: a shape measured by two runs (its
backends would no longer have been timed in alternation), and two runs that each measured the copy bandwidth (the
mHC and KV-cache tables state one; run the ops that measure it in one invocation).
"""
from __future__ import annotations

from pathlib import Path

# what must be equal for the runs' numbers to share a page
SAME_ENV = ("device", "card", "capability", "sms", "driver", "cuda", "cudnn", "python", "torch", "triton",
            "tilelang", "kernel_dispatch", "git_commit")


def _key(rec: dict) -> tuple:
    return rec["op"], repr(sorted(rec["shape"].items())), rec.get("dtype"), rec["backend"]


def run_summary(data: dict) -> dict:
    """The part of a saved run that says how it was made: command, date, settings, wall time, copy bandwidth."""
    return {"command": data.get("command"), "date": data["env"].get("date"), "settings": data.get("settings"),
            "elapsed_s": data.get("elapsed_s"), "copy_gbps": data.get("copy_gbps")}


def merge(runs: list[tuple[Path, dict]]) -> dict:
    """The saved runs ``[(path, data), ...]`` as one result: the first run's environment (its date the first
    run's), every record, ``runs`` with each run's :func:`run_summary`, ``copy_gbps`` of the run that measured it,
    ``elapsed_s`` their sum, complete when every run is.

    Raises ValueError naming the file and field where the runs differ in their environment, where one is a quick
    run or a merge itself, where two runs measured the same shape and backend, or where two measured the copy
    bandwidth."""
    if len(runs) < 2:
        raise ValueError(f"--from-json: merging needs two or more saved runs, got {len(runs)}")
    (first_path, first), rest = runs[0], runs[1:]
    seen: dict[tuple, Path] = {}
    for path, data in runs:
        if "runs" in data:
            raise ValueError(f"{path}: a merged result; merge the runs it came from instead")
        if data.get("quick"):
            raise ValueError(f"{path}: a --quick run; merge full runs only")
        for field in SAME_ENV:
            if data["env"].get(field) != first["env"].get(field):
                raise ValueError(f"{path}: env.{field} is {data['env'].get(field)!r}, {first_path} has "
                                 f"{first['env'].get(field)!r}; only runs of one machine, software and commit merge")
        for rec in data["records"]:
            key = _key(rec)
            if key in seen:
                raise ValueError(f"{path}: {rec['op']} {rec['shape']} {rec['backend']} is also in {seen[key]}; "
                                 "each shape belongs to one run")
            seen[key] = path
    summaries = [run_summary(data) for _, data in runs]
    measured = [(path, s["copy_gbps"]) for (path, _), s in zip(runs, summaries) if s["copy_gbps"]]
    if len(measured) > 1:
        raise ValueError(f"{measured[0][0]} and {measured[1][0]} each measured the copy bandwidth; run the ops "
                         "whose tables state it (mhc, lazy_attention_with_kvcache) in one invocation")
    out = {k: v for k, v in first.items() if k not in ("command", "settings", "records", "elapsed_s", "copy_gbps")}
    out.update(runs=summaries, copy_gbps=measured[0][1] if measured else None,
               complete=all(data.get("complete", True) for _, data in runs),
               records=[rec for _, data in runs for rec in data["records"]],
               elapsed_s=round(sum(s["elapsed_s"] or 0.0 for s in summaries), 1))
    for _, data in rest:  # conventions a later run adds (newer code would also have changed the commit)
        out["conventions"] = {**data.get("conventions", {}), **out.get("conventions", {})}
    return out
