"""``python -m kernel_dispatch.info``: operator x backend x available x reasons, and where the choice comes from.

Options describe the inputs to check against each backend's capabilities (defaults: this
machine's device, bf16 on CUDA / fp32 on CPU, head_dim 128, n 4, D 4096).
``--markdown`` prints the declared support table (the README's) instead.
"""
from __future__ import annotations

import argparse
import os

import torch

from . import _readme, config, registry
from .config import BACKEND_NAMES, OPERATORS

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32, "fp64": torch.float64}


def _meta(op: str, args) -> dict:
    base = {"device": args.device, "dtype": DTYPES[args.dtype]}
    if op == "lazy_attention":
        return dict(base, head_dim=args.head_dim, gqa=args.gqa, lengths=args.lengths, causal=not args.non_causal,
                    bias_length=args.bias_length)
    return dict(base, n=args.n, D=args.D)


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


def report(args) -> str:
    """The text printed by the command: choices with sources, then every backend's availability and reasons."""
    out = []
    env = {v: os.environ[v] for v, _ in config.ENV_VARS if os.environ.get(v)}
    out.append(f"device: {args.device}   environment: {env or 'no backend variables set'}")
    yaml_src = registry._yaml_state["source"]
    out.append(f"YAML: {yaml_src or 'none loaded'}")
    out.append("")
    out.append(f"{'operator':15s} {'backend':9s} {'available':9s} reasons")
    for op in OPERATORS:
        meta = _meta(op, args)
        (fwd, bwd), source = registry.current_choice(op)
        try:
            r = registry.resolve(op, meta)
            chosen = f"-> {r.forward}" + ("" if r.forward == r.backward else f" fwd / {r.backward} bwd")
        except registry.BackendUnavailableError as e:
            chosen = f"-> cannot run: {e}"
        out.append(f"{op:15s} choice {fwd}" + ("" if fwd == bwd else f",{bwd}") + f" from {source} {chosen}")
        for b in BACKEND_NAMES:
            reasons = registry.why_not(op, b, meta)
            out.append(f"{'':15s} {b:9s} {'yes' if not reasons else 'no':9s} {'; '.join(reasons)}")
    return "\n".join(out)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m kernel_dispatch.info", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cpu", "cuda"])
    p.add_argument("--dtype", default=None, choices=list(DTYPES))
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--bias-length", type=int, default=512)
    p.add_argument("--gqa", action="store_true")
    p.add_argument("--lengths", action="store_true")
    p.add_argument("--non-causal", action="store_true")
    p.add_argument("--n", type=int, default=4)
    p.add_argument("--D", type=int, default=4096)
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
        registry.load_config(args.config)
    print(report(args))


if __name__ == "__main__":
    main()
