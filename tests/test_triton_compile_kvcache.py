"""Compile-only check of every Triton KV-cache kernel variant for sm_90 (no GPU needed; triton ships ptxas).

Each variant is compiled for ``GPUTarget("cuda", 90, 32)`` in a separate process (without TRITON_INTERPRET, which
this test session sets). It must fit sm_90's shared memory, keep every value in registers (no local memory in the
cubin: cuobjdump's resource usage) and move K, V and the kept scores by 16-byte copies (no 4-byte cp.async: the
decode step is memory-bound). The quick suite builds bf16 at head dim 128 for decode (R = 4 rows: four query heads
per kv head); fp16, fp32, head dim 64, R = 1 (one query head per kv head) and R = 256 (Lq = 64) are marked slow.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kernel_dispatch.testing.triton_compile import SM90_SHARED_BYTES, kvcache_specs

ROOT = Path(__file__).resolve().parents[1]
HEAD_DIMS, DTYPES, ROWS = (64, 128), (torch.bfloat16, torch.float16, torch.float32), (1, 4, 256)

_WORKER = """
import json, os, re, subprocess, sys, tempfile
import torch, triton
from kernel_dispatch.testing.triton_compile import compile_sm90, kvcache_specs, small_async_copies
spec = next(s for s in kvcache_specs(head_dims=(64, 128), rows=(1, 4, 256)) if s["id"] == sys.argv[1])
k = compile_sm90(spec["fn"], spec["signature"], spec["constexprs"], spec["num_warps"], spec["num_stages"],
                 divisible=spec["divisible"])
ptx = k.asm["ptx"]
cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
    f.write(k.asm["cubin"])
    f.flush()
    usage = subprocess.run([cuobjdump, "--dump-resource-usage", f.name], capture_output=True, text=True,
                           check=True).stdout
print(json.dumps({"shared": int(k.metadata.shared), "local": int(re.search(r"LOCAL:(\\d+)", usage).group(1)),
                  "small_copies": small_async_copies(ptx),
                  "wide_copies": len(re.findall(r"cp\\.async\\.c[ag]\\.shared\\.global[^;]*, 0x10", ptx))}))
"""


def _params():
    for s in kvcache_specs(head_dims=HEAD_DIMS, dtypes=DTYPES, rows=ROWS):
        quick = "-bf16-d128-r4" in s["id"]
        yield pytest.param(s["id"], id=s["id"], marks=() if quick else pytest.mark.slow)


def compile_in_subprocess(spec_id: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    proc = subprocess.run([sys.executable, "-c", _WORKER, spec_id], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, f"{spec_id}: compile failed\n{proc.stderr[-4000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("spec_id", list(_params()))
def test_kvcache_kernel_compiles_for_sm90(spec_id):
    got = compile_in_subprocess(spec_id)
    print(f"{spec_id}: {got}")
    assert got["shared"] <= SM90_SHARED_BYTES, f"{spec_id}: {got['shared']} bytes of shared memory"
    assert got["local"] == 0, f"{spec_id}: {got['local']} bytes of local memory (register spills)"
    assert got["small_copies"] == 0, f"{spec_id}: {got['small_copies']} 4-byte cp.async copies"
    if "-reduce-" not in spec_id:
        assert got["wide_copies"] > 0, f"{spec_id}: no 16-byte cp.async copies (K, V or the scores)"
