"""Every TileLang KV-cache kernel (SPEC section 5) lowers to CUDA for sm_90a and builds to a cubin, on a CPU.

Builds go into a fresh TileLang cache (so they really compile) with the launcher's tiles for decode (R = 4 rows:
four query heads per kv head, Lq = 1) and for Lq = 64 (R = 256). Each build must: take the Hopper path (TMA loads
for the passes), hand no shared buffer back to the TMA producer while a GEMM reads it and read no TMA-loaded buffer
before its barrier (tests/async_release.py), compute the consumers' inputs in the consumer branch, keep every value
in registers (no local memory in the cubin, cuobjdump's resource usage) and fit sm_90's shared memory (static plus
the dynamic size the host code launches with). The quick suite builds the decode path (scores kept, several
splits, the reduce); the other variants are marked slow. Numerics run on a GPU only (tests/test_kvcache_kernels.py).
"""
from __future__ import annotations

import glob
import importlib.util
import os
import re
import subprocess

import pytest

from kernel_dispatch.backends.tilelang import _build

from .async_release import reads_before_arrival, release_violations

pytestmark = pytest.mark.skipif(importlib.util.find_spec("tilelang") is None,
                                reason="tilelang is not installed (it is Linux-only)")

SM90_SHARED_BYTES = 232448
# (kernel, head dim, dtype, flags, R): flags (keep,) for lse, (keep, direct) for out; R = (H / Hkv) * Lq rows per
# kv head (4: decode with four query heads per kv head, 16-row tiles; 256: Lq = 64, 64-row tiles)
BUILDS = [("lse", 128, "bfloat16", (True,), 4), ("out", 128, "bfloat16", (True, False), 4),
          ("reduce", 128, "bfloat16", (), 4),
          ("lse", 128, "bfloat16", (False,), 4), ("out", 128, "bfloat16", (False, False), 4),
          ("out", 128, "bfloat16", (True, True), 4), ("out", 128, "bfloat16", (False, True), 4),
          ("lse", 64, "float16", (True,), 4), ("out", 64, "float16", (True, False), 4),
          ("out", 64, "float16", (False, True), 4),
          ("lse", 128, "bfloat16", (False,), 256), ("out", 128, "bfloat16", (False, True), 256),
          ("out", 128, "bfloat16", (False, False), 256)]
QUICK = 3


def _id(b):
    name, d, dt, flags, rows = b
    return f"{name}-d{d}-{dt}-r{rows}" + "".join(f"-{k}{int(v)}" for k, v in zip(("keep", "direct"), flags))


def cuobjdump() -> str:
    import triton

    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")


def dynamic_shared_bytes(host_src: str, kernel_name: str, threads: int) -> int:
    """The dynamic shared memory the host code launches ``kernel_name`` with: the launch argument after the block
    (threads, 1, 1), absent when the kernel has none."""
    call = host_src.index(f"if ({kernel_name}_packed == NULL)")
    args = re.findall(r"\[(\d+)\]\.v_int64\) = \(*(?:int64_t\))?(.+?)\)*;", host_src[:call])
    values = [v.strip("()") for _, v in args]
    for i in range(len(values) - 3, -1, -1):
        if values[i:i + 3] == [str(threads), "1", "1"]:
            return int(values[i + 3]) if i + 3 < len(values) and values[i + 3].isdigit() else 0
    raise AssertionError(f"no launch of {kernel_name} with a block of ({threads}, 1, 1) in the host code")


@pytest.fixture(scope="module")
def toolkit():
    try:
        return _build.cuda_home(required=True)
    except RuntimeError as e:
        pytest.fail(f"cannot build TileLang kernels here: {e}")


@pytest.mark.parametrize("build", [pytest.param(b, id=_id(b), marks=() if i < QUICK else pytest.mark.slow)
                                   for i, b in enumerate(BUILDS)])
def test_kvcache_kernel_builds_cubin_for_sm90a(build, toolkit, tmp_path, monkeypatch):
    from kernel_dispatch.backends.tilelang import lazy_attention_with_kvcache as kv

    name, d, dt, flags, rows = build
    monkeypatch.setenv("TILELANG_CACHE_DIR", str(tmp_path))
    kernel = _build.compile_kernel(kv.prim_func(name, d, dt, flags, kv.tiles_for(d, rows)), _build.SM90A)
    src = kernel.get_kernel_source()
    assert "__global__" in src
    if name != "reduce":
        assert "tma_load(K_desc" in src or "tma_load(Scores_desc" in src, f"{name}: no TMA load of K or the scores"
        assert "tma_load(V_desc" in src or name == "lse", f"{name}: no TMA load of V"
    assert not release_violations(src), f"{name}: " + "; ".join(release_violations(src))
    if "warpgroup_reg_alloc<" in src:  # the consumers' own inputs are read by the consumer warpgroup
        consumer_start = src.index("warpgroup_reg_alloc<")
        early = [buf for buf in ("LsePart[", "Tau[", "Bias[") if -1 < src.find(buf) < consumer_start]
        assert not early, f"{name}: {early} read outside the consumer branch (a fragment given the producer's threads)"
    assert not reads_before_arrival(src), f"{name}: " + "; ".join(reads_before_arrival(src))
    cubins = glob.glob(os.path.join(str(tmp_path), "**", "*.cubin"), recursive=True)
    assert len(cubins) == 1, f"{name}: expected one cubin under {tmp_path}, found {cubins}"
    usage = subprocess.run([cuobjdump(), "--dump-resource-usage", cubins[0]], capture_output=True, text=True,
                           check=True).stdout
    local = int(re.search(r"LOCAL:(\d+)", usage).group(1))
    static = int(re.search(r"SHARED:(\d+)", usage).group(1))
    assert local == 0, f"{name}: {local} bytes of local memory (register spills)\n{usage}"
    bounds = re.search(r"__global__ void __launch_bounds__\((\d+), \d+\) (\w+)\(", src)
    dynamic = dynamic_shared_bytes(kernel.get_host_source(), bounds.group(2), int(bounds.group(1)))
    assert static + dynamic <= SM90_SHARED_BYTES, f"{name}: {static} + {dynamic} bytes of shared memory"
