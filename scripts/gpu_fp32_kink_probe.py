"""Probe: fp32 gradient error at the Elastic-Softmax relu kink, per head, on the realistic cases.

For each big lazy attention case of tests/cases.py (fp32 inputs) prints, head by head, the relative error
against golden float64 of (a) golden run in fp32 on the same device (an exactly rounded fp32 implementation)
and (b) each kernel backend that runs fp32, plus how many scores lie within a relative distance delta of
the kink P + tau/i = 0 (where fp32 and float64 may decide the mask differently). Heads with tau >= 0 have
no kink: any error there beyond the fp32 tolerance is a kernel defect, not a mask flip.
The test inputs keep every score KINK_MARGIN away from the kink (tests/cases.py); ``--raw`` probes the
inputs as drawn, before that, which is how the fp32 failures of the realistic cases were traced to it.
Usage (GPU):  python3 scripts/gpu_fp32_kink_probe.py [--backends triton] [--raw]
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tests import cases  # noqa: E402
from tests.cases import ATTN_CASES, make_inputs, run, upcast  # noqa: E402
from tests.tolerances import rel_err, tolerance  # noqa: E402


def band_counts(inp, deltas, causal):
    """[H, len(deltas)]: scores with |P + tau/i| <= delta * P (float64), summed over the batch."""
    t = inp.tensors
    out = torch.zeros(t["q"].shape[1], len(deltas), dtype=torch.long)
    for _, h, rel, scored in cases.kink_margins(t["q"], t["k"], t["bias"], t["tau"], inp.kwargs.get("lengths"),
                                                causal):
        for j, dl in enumerate(deltas):
            out[h, j] += int((scored & (rel <= dl)).sum())
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backends", default="triton")
    ap.add_argument("--raw", action="store_true", help="inputs as drawn, scores at the kink included")
    args = ap.parse_args()
    if args.raw:
        cases._away_from_kink = lambda *a, **k: None
    dev = "cuda"
    deltas = (1e-7, 1e-6, 1e-5)
    print(f"device {torch.cuda.get_device_name()}, torch {torch.__version__}")
    for case in [c for c in ATTN_CASES if c.big]:
        inp = make_inputs("lazy_attention", case, torch.float32, dev)
        ref = run("lazy_attention", upcast(inp), "golden")
        got = {"golden-fp32": run("lazy_attention", inp, "golden")}
        for be in args.backends.split(","):
            got[be] = run("lazy_attention", inp, be)
        counts = band_counts(inp, deltas, case.causal)
        tau = inp.tensors["tau"].tolist()
        print(f"\n== {case.name}: rel err / fp32 tol per head (dq, dk, dv, o); band counts at delta {deltas}")
        for name in ("dbias", "dtau"):
            print(f"   {name}: " + ", ".join(f"{k} {rel_err(g[name], ref[name]) / tolerance('lazy_attention', torch.float32, name):.2f}"
                                             for k, g in got.items()))
        for h in range(case.H):
            cells = []
            for k, g in got.items():
                r = [rel_err(g[n][:, h if n in ('dq', 'o') else h // (case.H // case.Hkv)],
                             ref[n][:, h if n in ('dq', 'o') else h // (case.H // case.Hkv)])
                     / tolerance("lazy_attention", torch.float32, n) for n in ("dq", "dk", "dv", "o")]
                cells.append(f"{k} " + "/".join(f"{x:.2f}" for x in r))
            print(f"h{h:2d} tau {tau[h]:+.3f} band {counts[h].tolist()}  " + "  ".join(cells), flush=True)
        del ref, got
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
