"""Compile-only check of every shipped Triton lazy attention kernel configuration for sm_90.

Each configuration is compiled for ``GPUTarget("cuda", 90, 32)`` in a separate process
(without TRITON_INTERPRET, which this test session sets) and must fit sm_90's 232448 bytes of
shared memory. No GPU is needed: triton ships ptxas. The quick suite compiles every distinct
config at the largest head dim it ships for (shared memory grows with the head dim), for bf16
(the same bytes as fp16) and fp32, causal, and the packed-document variant (lazy_attention_varlen)
of each kernel's first bf16 config at head dim 128; the rest (every head dim and dtype, non-causal,
every packed variant) is marked slow.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kernel_dispatch.testing.triton_compile import SM90_SHARED_BYTES, lazy_attention_specs

ROOT = Path(__file__).resolve().parents[1]

_WORKER = """
import json, sys
from kernel_dispatch.testing.triton_compile import compile_spec, lazy_attention_specs, sass, small_async_copies
spec = next(s for s in lazy_attention_specs(causal=(True, False), varlen=(False, True)) if s["id"] == sys.argv[1])
k = compile_spec(spec)
ptx = k.asm["ptx"]
fused = [line for line in sass(k.asm["cubin"]).splitlines() if "FFMA" in line and "1.4426950" in line
         and not line.split(";")[0].rstrip().endswith("RZ")]
print(json.dumps({"id": spec["id"], "shared": int(k.metadata.shared), "small_copies": small_async_copies(ptx),
                  "asm_gathers": ptx.count("ld.global.nc.f32"), "num_stages": spec["num_stages"],
                  "log2e_fused": len(fused)}))
"""
# The per-row fp32 vectors (LSE, Delta) of the dK/dV loops are pipelined by 4-byte cp.async copies: 14 with 2
# stages and 22 with 3 at head dim 128, 28 with 2 stages at head dim 16 (8 warps over 32 queries). A bias band
# gather staged that way (a plain tl.load of the bias row) adds 64 to 192 per kernel (16 x 128 dK/dV tiles: 32)
# and makes every band tile cost 2.2 times a free one on an H100.
SMALL_COPIES_PER_STAGE = 16


def _quick_ids() -> set[str]:
    seen, quick = set(), set()
    for d in (128, 64, 32, 16):
        for s in lazy_attention_specs(head_dims=(d,), dtypes=(torch.bfloat16, torch.float32)):
            key = s["id"].replace(f"-d{d}-", "-")
            if key not in seen:
                seen.add(key)
                quick.add(s["id"])
    return quick


def _quick_varlen_ids() -> set[str]:
    """The packed-document variant (lazy_attention_varlen) of each kernel's first bf16 config at head dim 128."""
    first = {}
    for s in lazy_attention_specs(head_dims=(128,), dtypes=(torch.bfloat16,), varlen=(True,)):
        first.setdefault(s["group"], s["id"])
    return set(first.values())


def _params():
    quick = _quick_ids() | _quick_varlen_ids()
    slow_extra = {s["id"] for s in lazy_attention_specs(head_dims=(128,), dtypes=(torch.bfloat16,), causal=(False,),
                                                        varlen=(False, True))}
    ids = [s["id"] for s in lazy_attention_specs(varlen=(False, True))] + sorted(slow_extra)
    return [pytest.param(i, id=i, marks=() if i in quick else pytest.mark.slow) for i in ids]


def compile_in_subprocess(spec_id: str) -> dict:
    """The spec ``spec_id`` compiled for sm_90 in a fresh interpreter-free process: its shared memory (bytes), its
    4-byte cp.async copies and its inline-assembly bias loads (counted in the PTX)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    proc = subprocess.run([sys.executable, "-c", _WORKER, spec_id], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, f"{spec_id}: compile failed\n{proc.stderr[-4000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("spec_id", _params())
def test_lazy_attention_config_fits_sm90(spec_id):
    got = compile_in_subprocess(spec_id)
    shared = got["shared"]
    print(f"{spec_id}: {shared} bytes of shared memory, {got['small_copies']} 4-byte cp.async, "
          f"{got['asm_gathers']} bias loads")
    assert 0 < shared <= SM90_SHARED_BYTES, f"{spec_id}: {shared} bytes > {SM90_SHARED_BYTES}"
    assert got["asm_gathers"] > 0, f"{spec_id}: the bias band is not read by the inline-assembly gather"
    limit = SMALL_COPIES_PER_STAGE * got["num_stages"]
    assert got["small_copies"] <= limit, (
        f"{spec_id}: {got['small_copies']} 4-byte cp.async copies (> {limit}): triton pipelines a gather")
    if spec_id.startswith(("dq-", "dkdv-")):
        # the stored natural-log LSE back in log2 units must be one rounded product: fused into S - LSE * log2 e
        # (an FFMA with a register addend) its exact product differs from the forward's LSE2, by 1e21 with scores
        # near 1e30, and P = exp2 of that is inf (non-finite dq, dk, dbias on an H100; the interpreter never fuses)
        assert got["log2e_fused"] == 0, f"{spec_id}: {got['log2e_fused']} FFMAs fuse the LSE conversion"


def test_forward_never_specializes_l_to_one():
    """triton 3.6's ptxas crashes (SIGSEGV) compiling the forward's non-causal 128 x 64 config at head dim 32 for the
    constant L = 1 (reproduced compile-only with the 3.6 wheel; triton 3.9 compiles it): the kernel takes L as a
    plain integer."""
    from kernel_dispatch.backends.triton._lazy_attention_fwd import lazy_attention_fwd_kernel

    jit = lazy_attention_fwd_kernel.fn  # under TRITON_INTERPRET an InterpretedFunction holding the jit arguments
    assert "L" in jit.kwargs["do_not_specialize"]
