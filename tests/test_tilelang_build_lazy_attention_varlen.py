"""The TileLang lazy attention kernels in their packed-document form (lazy_attention_varlen) lower to CUDA for
sm_90a and build to cubins, on a CPU.

Builds go into a fresh TileLang cache (so they really compile) with the launcher's tile configs. Each build must
take the Hopper path (wgmma, TMA loads; the row-dot kernel is plain vector loads), hand no shared buffer back to
the TMA producer while a wgmma still reads it and read no TMA-loaded buffer before its barrier
(tests/async_release.py), write its outputs by predicated row stores only (a TMA store of a whole tile would
write into the next document), keep the fixed-length kernels' barrier count per sweep iteration, keep every value
in registers (no local memory in the cubin: cuobjdump's resource usage) and fit sm_90's shared memory (static plus
the dynamic size the host code launches with). The quick suite builds the two backward sweeps at head dim 64
(bf16, causal); the others (every kernel, non-causal, head dim 128) are marked slow. Numerics run on a GPU only
(the equivalence matrix and tests/test_determinism_gpu.py).
"""
from __future__ import annotations

import glob
import importlib.util
import os
import re
import subprocess

import pytest

from kernel_dispatch.backends.tilelang import _build

from .async_release import reads_before_arrival, release_violations, top_level_barriers

pytestmark = pytest.mark.skipif(importlib.util.find_spec("tilelang") is None,
                                reason="tilelang is not installed (it is Linux-only)")

SM90_SHARED_BYTES = 232448
MEMORY_KERNELS = {"row_dot"}  # no GEMM, plain vector loads
SWEEP_BARRIERS = {"lse": ("k_1", 0), "fwd": ("k_1", 0), "dq_delta": ("k_1", 0), "dkdv": ("it_1", 1)}
# (kernel, head dim, causal); the first QUICK run in the quick suite
BUILDS = [("dq_delta", 64, True), ("dkdv", 64, True),
          ("lse", 64, True), ("lse", 64, False), ("fwd", 64, True), ("fwd", 64, False), ("row_dot", 64, True),
          ("dq_delta", 64, False), ("dkdv", 64, False), ("fwd", 128, True), ("dq_delta", 128, True),
          ("dkdv", 128, True), ("dkdv", 128, False)]
QUICK = 2


def _id(b) -> str:
    name, d, causal = b
    return f"{name}-d{d}-{'causal' if causal else 'full'}"


def _cuobjdump() -> str:
    import triton

    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")


def launch_shared_bytes(host_src: str, kernel: str, threads: int) -> int:
    """The dynamic shared memory of the host code's launch of ``kernel``: the launch arguments end with the grid,
    the block (threads, 1, 1) and then the dynamic bytes (absent or 0 without any)."""
    head = host_src[:host_src.index(f"if ({kernel}_packed == NULL)")]
    args = re.findall(r"stack_ffi_any\)\[\d+\]\.v_int64\) = \(*(?:int64_t\))?([^;]*?)\)*;", head)
    for i in range(len(args) - 3, -1, -1):
        if args[i:i + 3] == [str(threads), "1", "1"]:
            nxt = args[i + 3] if i + 3 < len(args) else "0"
            return int(nxt) if nxt.isdigit() else 0
    raise AssertionError(f"no launch of {kernel} with a block of ({threads}, 1, 1) in the host code")


@pytest.fixture(scope="module")
def toolkit():
    try:
        return _build.cuda_home(required=True)
    except RuntimeError as e:
        pytest.fail(f"cannot build TileLang kernels here: {e}")


@pytest.mark.parametrize("build", [pytest.param(b, id=_id(b), marks=() if i < QUICK else pytest.mark.slow)
                                   for i, b in enumerate(BUILDS)])
def test_varlen_factory_builds_cubin_for_sm90a(build, toolkit, tmp_path, monkeypatch):
    from kernel_dispatch.backends.tilelang import lazy_attention as la

    name, d, causal = build
    monkeypatch.setenv("TILELANG_CACHE_DIR", str(tmp_path))
    kernel = _build.compile_kernel(la.FACTORIES[name](d, "bfloat16", causal, la.CONFIGS[d][name], True),
                                   _build.SM90A)
    src = kernel.get_kernel_source()
    assert "__global__" in src
    if name not in MEMORY_KERNELS:
        assert "wgmma" in src, f"{name}: no wgmma in the sm_90a source (the Hopper GEMM path was not taken)"
        assert "tma_load" in src, f"{name}: no TMA load in the sm_90a source"
    assert not release_violations(src), f"{name}: " + "; ".join(release_violations(src))
    assert not reads_before_arrival(src), f"{name}: " + "; ".join(reads_before_arrival(src))
    assert "tma_store(" not in src, f"{name}: a TMA store (a whole tile, rows of the next document included)"
    if name in SWEEP_BARRIERS:
        var, most = SWEEP_BARRIERS[name]
        n = top_level_barriers(src, f"int {var} = 0")
        assert n <= most, f"{name}: {n} barriers in every iteration of the sweep, at most {most} expected"
    cubins = glob.glob(os.path.join(str(tmp_path), "**", "*.cubin"), recursive=True)
    assert len(cubins) == 1, f"{name}: expected one cubin under {tmp_path}, found {cubins}"
    usage = subprocess.run([_cuobjdump(), "--dump-resource-usage", cubins[0]], capture_output=True, text=True,
                           check=True).stdout
    local = int(re.search(r"LOCAL:(\d+)", usage).group(1))
    static = int(re.search(r"SHARED:(\d+)", usage).group(1))
    assert local == 0, f"{name}: {local} bytes of local memory (register spills)\n{usage}"
    bounds = re.search(r"__global__ void __launch_bounds__\((\d+), \d+\) (\w+)\(", src)
    dynamic = launch_shared_bytes(kernel.get_host_source(), bounds.group(2), int(bounds.group(1)))
    assert static + dynamic <= SM90_SHARED_BYTES, f"{name}: {static} + {dynamic} bytes of shared memory"
