"""``python -m kernel_dispatch.bench``: every operator and backend side by side with the baselines a
user would pick instead, on one device in one run. The generic pieces live in :mod:`kernel_dispatch.benchmarks`;
each operator's sweep, baselines, table and plot in the bench module its declaration names (``Operator.bench``,
the protocol in :mod:`kernel_dispatch.benchmarks.common`).

    python -m kernel_dispatch.bench                    # the default GPU sweep (about 5 minutes on an H100)
    python -m kernel_dispatch.bench --quick            # tiny CPU smoke, golden only (CI)
    python -m kernel_dispatch.bench --ops mhc --D 4096 --T 8192 --backends triton,golden_compile
    python -m kernel_dispatch.bench --from-json bench_results/bench.json --docs   # docs from a saved run
    python -m kernel_dispatch.bench --from-json a.json,b.json --docs   # several runs of one machine, one page
    python -m kernel_dispatch.bench --ops lazy_attention --L 4K --backends cute,sdpa_cudnn --reps 400 --rounds 40
        # two backends timed in alternation for seconds: their ratio at the card's power cap

Prints a markdown table, writes a JSON with every figure and the environment, PNG plots, and with
``--docs`` docs/benchmarks.md (GPU runs only; other runs preview the page beside their JSON).
Exits 1 when a kernel_dispatch backend raised (baselines that fail are reported, not fatal).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import shlex
import sys
import time
from pathlib import Path

import torch

from .benchmarks import docs, merge, plots, report
from .benchmarks.common import baselines, int_list, modules, one_int, option, sweep
from .benchmarks.timing import Settings, Timer, copy_bandwidth_gbps
from .registry import BACKEND_NAMES

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def backends() -> tuple[str, ...]:
    """Every kernel_dispatch backend, then every bench module's baselines."""
    return BACKEND_NAMES + baselines()


def _names(valid: tuple[str, ...]):
    def parse(text: str) -> tuple[str, ...]:
        names = tuple(s.strip() for s in text.split(",") if s.strip())
        bad = [n for n in names if n not in valid]
        if bad or not names:
            raise argparse.ArgumentTypeError(f"unknown name(s) {bad or text!r}; valid: {', '.join(valid)}")
        return names
    return parse


def _d_item(text: str) -> tuple[str | None, tuple[int, ...]]:
    """One --D value: 'VALUES' (every op) or 'OP=VALUES' (one bench module's NAME)."""
    op, _, values = text.rpartition("=")
    ops = tuple(modules())
    if op and op not in ops:
        raise argparse.ArgumentTypeError(f"unknown operator {op!r} in {text!r}; expected {' or '.join(ops)}")
    return op or None, int_list(values)


def _D(items: list[tuple[str | None, tuple[int, ...]]] | None) -> dict[str, tuple[int, ...]]:
    """The parsed --D values as {op: values}; a later value for an op replaces an earlier one."""
    out: dict[str, tuple[int, ...]] = {}
    for op, values in items or []:
        out.update({o: values for o in ([op] if op else modules())})
    return out


def _d_help(mods: dict) -> str:
    helps = [(name, option(mod, "D_HELP")) for name, mod in mods.items() if option(mod, "D_HELP")]
    if not helps:
        return "sizes per op: 'OP=VALUES' (repeatable)"
    return (f"{' / '.join(what for _, (what, _) in helps)}: '{helps[0][1][1]}' for every op, or "
            + ", ".join(f"'{name}={example}'" for name, (_, example) in helps) + " (repeatable)")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    mods = modules()
    names = backends()
    p = argparse.ArgumentParser(prog="python -m kernel_dispatch.bench", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="tiny CPU smoke with golden only (seconds)")
    p.add_argument("--ops", type=_names(tuple(mods)), default=tuple(mods), help="comma list of: %(default)s")
    p.add_argument("--backends", type=_names(names), help=f"comma list of: {', '.join(names)} (default: all; "
                   "golden with --quick)")
    p.add_argument("--D", action="append", type=_d_item, help=_d_help(mods))
    for mod in mods.values():
        mod.add_arguments(p)
    p.add_argument("--rounds", type=one_int, default=Settings.rounds, help="rounds in which the backends of a "
                   "shape are timed in alternation (default %(default)s)")
    p.add_argument("--reps", type=one_int, help="timed runs per backend and direction (default: as many as fit "
                   f"{Settings.budget_s} s, {Settings.min_reps}-{Settings.max_reps}); e.g. --reps 400 --rounds 40 "
                   "times a few seconds each, long enough for an H200 to settle at its power cap")
    p.add_argument("--dtype", choices=tuple(DTYPES), default="bf16")
    p.add_argument("--device", help="default: cuda when available (cpu with --quick)")
    p.add_argument("--json", type=Path, help="results file (default bench_results/bench.json, quick.json)")
    p.add_argument("--plots", type=Path, help="folder for the PNG plots (default: the JSON's folder)")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--docs", action="store_true", help="regenerate docs/benchmarks.md (GPU runs only; others "
                   "write a preview beside the JSON)")
    p.add_argument("--from-json", type=_paths, help="no run: tables, plots and docs from this saved JSON, or from "
                   "several (comma list) of one machine, software and commit, merged (written to --json, default "
                   "bench_results/merged.json)")
    return p.parse_args(argv)


def _paths(text: str) -> list[Path]:
    paths = [Path(p) for p in text.split(",") if p]
    if not paths:
        raise argparse.ArgumentTypeError("expected one saved JSON or a comma list of them")
    return paths


def load_saved(paths: list[Path], json_path: Path | None) -> tuple[dict, Path]:
    """The saved run at ``paths[0]``, or the runs at ``paths`` merged (:mod:`kernel_dispatch.benchmarks.merge`)
    and written to ``json_path`` (default bench_results/merged.json); returns the result and its file."""
    loaded = []
    for path in paths:
        try:
            loaded.append((path, json.loads(path.read_text())))
        except (OSError, ValueError) as e:
            raise SystemExit(f"--from-json: cannot read {path} ({e})")
        if not isinstance(loaded[-1][1], dict) or not {"env", "records"} <= loaded[-1][1].keys():
            raise SystemExit(f"--from-json: {path} is not a saved benchmark run (expected a JSON object with env "
                             "and records, as --json writes)")
    if len(loaded) == 1:
        return loaded[0][1], paths[0]
    try:
        data = merge.merge(loaded)
    except ValueError as e:
        raise SystemExit(f"--from-json: {e}")
    out = json_path or Path("bench_results") / "merged.json"
    report.write_json(data, out)
    return data, out


def _size_flags(mods: dict) -> list[str]:
    """The options that size a sweep (small ones make a CPU run possible): --D and each module's SIZE_FLAGS."""
    return ["D"] + [f for mod in mods.values() for f in option(mod, "SIZE_FLAGS", ())]


def run(args, argv: list[str], json_path: Path) -> dict:
    """Run the sweeps ``args`` ask for and return the JSON-ready results.

    ``json_path`` is rewritten after every record (``"complete": false`` until the end; the records of a
    shape come together, its backends being timed in alternation), so a run stopped by a time limit still
    leaves every shape it finished.
    """
    t0 = time.perf_counter()
    mods = modules()
    device = torch.device(args.device or ("cpu" if args.quick or not torch.cuda.is_available() else "cuda"))
    sizes = _size_flags(mods)
    if device.type == "cpu" and not args.quick and not any(getattr(args, f, None) for f in sizes):
        raise SystemExit("no CUDA device: the default sweep is for a GPU; use --quick, or small "
                         + "/".join(f"--{f}" for f in sizes))
    settings = Settings(warmup=1, min_reps=3, max_reps=3, budget_s=0.0, rounds=3) if args.quick else Settings()
    if args.reps:
        settings = dataclasses.replace(settings, min_reps=args.reps, max_reps=args.reps)
    if not args.quick:
        settings = dataclasses.replace(settings, rounds=args.rounds)
    timer = Timer(device, settings)
    chosen = args.backends or (("golden",) if args.quick else backends())
    dtype = DTYPES[args.dtype]
    Ds = _D(args.D)
    plan = []
    for op in args.ops:
        mod = mods[op]
        names = [b for b in chosen if b in BACKEND_NAMES or b in mod.BASELINES]
        plan.append((mod, mod.shapes(args, args.quick, Ds.get(op)), names))
    data = {"schema": 1, "command": "python -m kernel_dispatch.bench " + shlex.join(argv), "quick": args.quick,
            "env": report.environment(device), "conventions": report.conventions(),
            "settings": vars(settings), "copy_gbps": None, "complete": False, "records": []}
    if any(option(mod, "COPY_BANDWIDTH", False) for mod, _, _ in plan):
        data["copy_gbps"] = copy_bandwidth_gbps(timer)
    progress = _progress(sum(len(s) * len(n) for _, s, n in plan))
    threads = torch.get_num_threads()
    if args.quick:  # tiny ops: one thread, no OpenMP barriers stalled by a busy CI machine
        torch.set_num_threads(1)

    def save(rec: dict) -> None:
        data["records"].append(rec)
        data["elapsed_s"] = round(time.perf_counter() - t0, 1)
        report.write_json(data, json_path)
    try:
        for mod, shapes, names in plan:
            copy_gbps = data["copy_gbps"] if option(mod, "COPY_BANDWIDTH", False) else None
            sweep(mod, shapes, names, dtype, timer, progress, on_record=save, copy_gbps=copy_gbps)
    finally:
        torch.set_num_threads(threads)
        if progress is not None:
            progress.close()
    data["complete"] = True
    data["elapsed_s"] = round(time.perf_counter() - t0, 1)
    report.write_json(data, json_path)
    return data


def _progress(total: int):
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    tty = sys.stderr.isatty()  # in a captured log, a line every 10 s instead of a live bar
    return tqdm(total=total, desc="bench", unit="run", file=sys.stderr, mininterval=0.1 if tty else 10.0,
                dynamic_ncols=tty)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    if args.from_json:
        data, json_path = load_saved(args.from_json, args.json)
    else:
        json_path = args.json or Path("bench_results") / ("quick.json" if args.quick else "bench.json")
        data = run(args, argv, json_path)
    print(f"# kernel_dispatch benchmarks\n\n{report.env_line(data['env'])}\n\n{report.tables(data)}\n")
    print(f"results: {json_path} ({data.get('elapsed_s')} s)")
    if not args.no_plots and (args.plots or not args.from_json):
        try:
            for path in plots.write_plots(data, args.plots or json_path.parent):
                print(f"plot: {path}")
        except ImportError as e:
            print(f"no plots: {e}", file=sys.stderr)
    if args.docs:
        page = docs.DOCS_PAGE if docs.is_gpu_run(data) else json_path.parent / "benchmarks.md"
        if page != docs.DOCS_PAGE:
            print("not a full GPU run: the docs page is previewed beside the JSON, docs/ is left alone")
        print(f"docs: {docs.write(data, page, json_path)}")
    bad = report.failures(data["records"])
    for line in bad:
        print(f"FAILED {line}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
