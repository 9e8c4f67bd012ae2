"""``python -m kernel_dispatch.info``: operator x backend x available x reasons, and where the choice comes from.

Options describe the inputs to check against each backend's capabilities: this machine's device and
bf16 on CUDA / fp32 on CPU by default, then each operator's own facts (its declaration's ``info_facts``:
head dim, bias length, streams, hidden size, ...).
``--markdown`` prints the declared support table (the README's) instead.
"""
from __future__ import annotations

import argparse
import os

import torch

from . import _readme, config, declaration, registry
from .registry import BACKEND_NAMES

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32, "fp64": torch.float64}


def _facts() -> dict[str, declaration.Fact]:
    """Every operator's info facts by option, each option once."""
    out: dict[str, declaration.Fact] = {}
    for op in declaration.operators():
        for f in declaration.operator(op).info_facts:
            out.setdefault(f.flag, f)
    return out


def _dest(f: declaration.Fact) -> str:
    return f.flag.lstrip("-").replace("-", "_")


def _meta(op: str, args) -> dict:
    meta = {"device": args.device, "dtype": DTYPES[args.dtype]}
    for f in declaration.operator(op).info_facts:
        value = getattr(args, _dest(f))
        meta[f.key] = (not value) if f.invert else value
    return meta


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def markdown_support_table() -> str:
    """The declared capabilities of every implementation as a markdown table."""
    rows = registry.support_table()
    cols = list(rows[0])
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(r[c] for c in cols) + " |" for r in rows]
    return "\n".join(lines)


def readme_table(text: str) -> str:
    """The support table currently between the README's support-table markers."""
    return _readme.block(text, "support-table")


def update_readme(path: str) -> None:
    """Replace the text between the README's support-table markers with the generated table."""
    _readme.replace_block(path, "support-table", markdown_support_table())


def _choice_line(op: str, meta: dict) -> str:
    """Where ``op``'s choice comes from and what it resolves to; a bad choice is a line, not a crash."""
    try:
        (fwd, bwd), source = registry.current_choice(op)
    except config.ConfigError as e:
        return f"choice error: {e}"
    try:
        r = registry.resolve(op, meta)
        chosen = f"-> {r.forward}" + ("" if r.forward == r.backward else f" fwd / {r.backward} bwd")
    except registry.BackendUnavailableError as e:
        chosen = f"-> cannot run: {e}"
    return f"choice {fwd}" + ("" if fwd == bwd else f",{bwd}") + f" from {source} {chosen}"


def report(args) -> str:
    """The text printed by the command: choices with sources, then every backend's availability and reasons."""
    out = []
    env = {v: os.environ[v] for v, _ in declaration.env_vars() if os.environ.get(v)}
    out.append(f"device: {args.device}   environment: {env or 'no backend variables set'}")
    yaml_src = registry._yaml_state["source"]
    out.append(f"YAML: {yaml_src or 'none loaded'}")
    out.append("")
    out.append(f"{'operator':15s} {'backend':9s} {'available':9s} reasons")
    for op in declaration.operators():
        meta = _meta(op, args)
        out.append(f"{op:15s} " + _choice_line(op, meta))
        for b in BACKEND_NAMES:
            reasons = registry.why_not(op, b, meta)
            out.append(f"{'':15s} {b:9s} {'yes' if not reasons else 'no':9s} {'; '.join(reasons)}")
    return "\n".join(out)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m kernel_dispatch.info", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cpu", "cuda"])
    p.add_argument("--dtype", default=None, choices=list(DTYPES))
    for f in _facts().values():
        if isinstance(f.default, bool):
            p.add_argument(f.flag, dest=_dest(f), action="store_true", help=f.help)
        else:
            p.add_argument(f.flag, dest=_dest(f), type=_positive_int, default=f.default,
                           help=f"{f.help} (default {f.default})")
    p.add_argument("--config", help="a YAML file whose backend: key to apply")
    p.add_argument("--markdown", action="store_true", help="print the declared support table as markdown")
    p.add_argument("--update-readme", metavar="README", help="rewrite the support table inside README")
    args = p.parse_args(argv)
    if args.markdown:
        print(markdown_support_table())
        return
    if args.update_readme:
        update_readme(args.update_readme)
        return
    args.dtype = args.dtype or ("bf16" if args.device == "cuda" else "fp32")
    if args.config:
        try:
            registry.load_config(args.config)
        except (OSError, config.ConfigError) as e:
            p.error(f"--config: {e}")
    print(report(args))


if __name__ == "__main__":
    main()
