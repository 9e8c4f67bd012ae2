"""Compile-only check of every shipped Triton mHC kernel configuration for sm_90.

Each group of (kernel, config) specs is compiled for ``GPUTarget("cuda", 90, 32)`` in a separate
process (without TRITON_INTERPRET, which this test session sets) with the specialization of a
contiguous launch (16-byte aligned pointers, unit strides constant, sizes and strides multiples
of 16: the cp.async pipelining that uses most shared memory), and every config must fit sm_90's
232448 bytes of shared memory. No GPU is needed: triton ships ptxas. The quick suite compiles
bf16 at n = 4 (the shipped target); fp16, fp32 and n in {1, 2, 8} are marked slow.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kernel_dispatch.testing.triton_compile import SM90_SHARED_BYTES

ROOT = Path(__file__).resolve().parents[1]

_WORKER = """
import json, sys
import torch
from kernel_dispatch.testing.triton_compile import compile_spec, mhc_post_specs, mhc_pre_specs
specs = {"pre": mhc_pre_specs, "post": mhc_post_specs}[sys.argv[1]]
dtype = getattr(torch, sys.argv[2])
out = []
for spec in specs(dtypes=(dtype,), ns=(int(sys.argv[3]),)):
    out.append({"id": spec["id"], "shared": int(compile_spec(spec).metadata.shared)})
print(json.dumps(out))
"""

GROUPS = [(op, "bfloat16", 4) for op in ("pre", "post")]
SLOW_GROUPS = ([(op, dt, 4) for op in ("pre", "post") for dt in ("float16", "float32")]
               + [(op, "bfloat16", n) for op in ("pre", "post") for n in (1, 2, 8)])


def compile_group(op: str, dtype: str, n: int) -> list[dict]:
    """[{id, shared}] for every shipped spec of mHC ``op`` at (dtype, n), compiled in a fresh process."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    proc = subprocess.run([sys.executable, "-c", _WORKER, op, dtype, str(n)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, f"mhc {op} {dtype} n={n}: compile failed\n{proc.stderr[-4000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("op,dtype,n", [pytest.param(*g, id=f"{g[0]}-{g[1]}-n{g[2]}") for g in GROUPS]
                         + [pytest.param(*g, id=f"{g[0]}-{g[1]}-n{g[2]}", marks=pytest.mark.slow)
                            for g in SLOW_GROUPS])
def test_mhc_configs_fit_sm90(op, dtype, n):
    results = compile_group(op, dtype, n)
    assert results, "no specs compiled"
    for r in results:
        print(f"{r['id']}: {r['shared']} bytes of shared memory")
    too_big = [f"{r['id']} ({r['shared']} bytes)" for r in results if r["shared"] > SM90_SHARED_BYTES]
    assert not too_big, f"over sm_90's {SM90_SHARED_BYTES} bytes: {', '.join(too_big)}"
