"""Where the GPU-only Triton failure of the property test's explicit example comes from (GPU only).

The draw (tests/test_properties.py: B=1, Hkv=2, groups=2, L=364, D=64, W=88, causal, bf16, a 1e30 bias at one distance
per head, tau = -1, distinct strides) gives non-finite Triton dq, dk and dbias on an H100 with config 0 pinned, while o
and dv are finite and the interpreter passes. This runs it in variants, one change at a time, and prints for each the
tensors that are not finite (with the first bad index) and Delta of the dq kernel (captured from the launcher):

- layout: the draw's distinct strides, or contiguous;
- output buffers: torch.empty (as shipped), zero-filled, or NaN-filled (an unwritten element shows as NaN);
- config: pinned 0, 1, 2 (KERNEL_DISPATCH_TRITON_CONFIG) or autotuned;
- the dominant bias: 1e30, 1e10, 30.

Run: ``python scripts/gpu_debug_triton_property_draw.py``.
"""
from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import test_properties as tp  # noqa: E402

from kernel_dispatch.backends.triton import lazy_attention as tk  # noqa: E402
from kernel_dispatch.testing import matrix  # noqa: E402

DRAW = tp.AttnDraw(B=1, Hkv=2, groups=2, L=364, D=64, W=88, causal=True, lengths=None, dtype=torch.bfloat16,
                   seed=560, sharpness=0.3, bias="dominant", bias_size=1e30, tau="minus_one", layout="distinct")


def _bad(t: torch.Tensor) -> str:
    bad = ~torch.isfinite(t)
    if not bad.any():
        return "finite"
    first = bad.nonzero()[0].tolist()
    return f"{int(bad.sum())} not finite, first at {first} = {t[tuple(first)].item()}"


def run(draw, fill: str) -> dict:
    captured = {}
    original = tk._empty

    def empty(*shape, dtype, device):
        t = original(*shape, dtype=dtype, device=device)
        if fill == "zeros":
            t.zero_()
        elif fill == "nan":
            t.fill_(float("nan"))
        if len(shape) == 2 and dtype == torch.float32 and "delta" not in captured and shape[1] == draw.L:
            captured["delta"] = t
        return t

    tk._empty = empty
    try:
        inp = tp.attention_inputs(draw)
        ref = matrix.run("lazy_attention", matrix.upcast(inp), "golden")
        got = matrix.run("lazy_attention", inp, "triton")
    finally:
        tk._empty = original
    out = {k: _bad(v) for k, v in got.items()}
    out["rel err"] = {k: f"{matrix.rel_err(got[k], ref[k]):.2e}" for k in got if torch.isfinite(got[k]).all()}
    if "delta" in captured:
        out["delta"] = _bad(captured["delta"])
    return out


def main() -> None:
    print(torch.cuda.get_device_name(), torch.__version__, flush=True)
    variants = [("as drawn, config 0, torch.empty", DRAW, "0", "empty")]
    variants += [(f"fill {f}", DRAW, "0", f) for f in ("zeros", "nan")]
    variants += [("contiguous layout", dataclasses.replace(DRAW, layout="contiguous"), "0", "empty")]
    variants += [(f"config {c}", DRAW, c, "empty") for c in ("1", "2", "")]
    variants += [(f"bias {b:g}", dataclasses.replace(DRAW, bias_size=b), "0", "empty") for b in (1e10, 30.0)]
    variants += [("fp32", dataclasses.replace(DRAW, dtype=torch.float32), "0", "empty")]
    for name, draw, config, fill in variants:
        if config:
            os.environ["KERNEL_DISPATCH_TRITON_CONFIG"] = config
        else:
            os.environ.pop("KERNEL_DISPATCH_TRITON_CONFIG", None)
        try:
            print(f"{name}: {run(draw, fill)}", flush=True)
        except Exception as e:  # noqa: BLE001 - a variant that raises is a finding too
            print(f"{name}: raised {type(e).__name__}: {e}", flush=True)


if __name__ == "__main__":
    main()
