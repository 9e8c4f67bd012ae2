"""Compile-only check of the Triton kernels for the GPUs other than Hopper: sm_80 (A100), sm_86 and sm_89 (RTX 30xx
and 40xx, A10, L4, L40), sm_120 (RTX 50xx).

Every shipped config of every launch class (kernel, dtypes, head dim or stream count) is compiled for the target in
a separate process (without TRITON_INTERPRET); each must compile, each class must have a config that fits the
architecture's shared memory per block (the autotuner leaves the others out on such a device, see
kernel_dispatch/backends/triton/_autotune.py) or be refused by the registry for it (_fit.NEEDS), and no class may need
more than _fit.NEEDS says where it says (the registry's reason for a device with less). All slow: about a hundred
compiles per architecture (mhc_post, 30 compiles for sm_89, took 25 minutes on a loaded 2-core machine).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kernel_dispatch.backends.triton import _fit
from kernel_dispatch.testing.triton_compile import SHARED_BYTES

ROOT = Path(__file__).resolve().parents[1]
ARCHS = (80, 86, 89, 120)
OPS = {"attention": "lazy_attention", "mhc_pre": "mhc_pre", "mhc_post": "mhc_post"}

_WORKER = """
import json, sys
import torch
from kernel_dispatch.testing import triton_compile as tc
arch, which = int(sys.argv[1]), sys.argv[2]
dtypes = (torch.bfloat16, torch.float16, torch.float32)
specs = {"attention": lambda: tc.lazy_attention_specs(head_dims=(64, 128), dtypes=(torch.bfloat16, torch.float32)),
         "mhc_pre": lambda: tc.mhc_pre_specs(dtypes=dtypes, ns=(4,)),
         "mhc_post": lambda: tc.mhc_post_specs(dtypes=dtypes, ns=(4,))}[which]()
out = [{"id": s["id"], "group": s["group"], "shared": int(tc.compile_spec(s, arch).metadata.shared)} for s in specs]
print(json.dumps(out))
"""


def compile_group(arch: int, which: str) -> list[dict]:
    """[{id, group, shared}] for every shipped spec of ``which`` compiled for sm_``arch`` in a fresh process."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    proc = subprocess.run([sys.executable, "-c", _WORKER, str(arch), which], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=3600)
    assert proc.returncode == 0, f"{which} sm_{arch}: compile failed\n{proc.stderr[-4000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.parametrize("which", ["attention", "mhc_pre", "mhc_post"])
@pytest.mark.parametrize("arch", ARCHS, ids=[f"sm{a}" for a in ARCHS])
def test_every_launch_class_has_a_config_that_fits(arch, which):
    limit = SHARED_BYTES[arch]
    smallest: dict = {}
    for r in compile_group(arch, which):
        print(f"sm_{arch} {r['id']}: {r['shared']} bytes of shared memory")
        smallest[r["group"]] = min(smallest.get(r["group"], r["shared"]), r["shared"])
    assert smallest, "no specs compiled"
    op = OPS[which]
    too_big = {g: n for g, n in smallest.items() if n > limit}
    refused = {g for g in too_big if (_fit.needed_bytes(op, _facts(g)) or 0) > limit}
    assert set(too_big) == refused, f"no config fits sm_{arch}'s {limit} bytes and no registry reason: {too_big}"
    for g, n in smallest.items():
        bound = _fit.needed_bytes(op, _facts(g))
        assert bound is None or n <= bound, f"{g} on sm_{arch} needs {n} bytes, _fit.NEEDS says {bound}"
    print(f"{which} on sm_{arch}: launch classes refused by the registry: {sorted(refused) or 'none'}")


def _facts(group: str) -> dict:
    """The registry facts a launch class stands for: 'dkdv-fp32-d128-causal' -> dtype float32, head dim 128."""
    import torch

    dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
    parts = group.split("-")
    dtype = next(dtypes[p] for p in parts if p in dtypes)
    head_dim = next((int(p[1:]) for p in parts if p[:1] == "d" and p[1:].isdigit()), None)
    return {"device": "cuda", "dtype": dtype, "head_dim": head_dim}
