"""Every TileLang lazy attention kernel factory lowers to CUDA for sm_90a and builds to a cubin, on a CPU.

Builds go into a fresh TileLang cache (so they really compile) with the CUDA compiler of the pip
packages nvidia-cuda-nvcc / nvidia-cuda-cccl; without a compiler the test fails and says what to
install. Each factory is built once, bf16 at head dim 64 (causal, and non-causal for the kernels
whose mask differs), with the launcher's tile configuration. Numerics run on a GPU only
(scripts/gpu_check_tilelang_attention.py).
"""
import glob
import importlib.util
import os

import pytest

from kernel_dispatch.backends.tilelang import _build

pytestmark = pytest.mark.skipif(importlib.util.find_spec("tilelang") is None,
                                reason="tilelang is not installed (it is Linux-only)")

# (kernel, causal): the row-major forward kernels share one mask path, so their non-causal build is
# covered by lse; the backward kernels each get both.
BUILDS = [("lse", True), ("lse", False), ("fwd", True), ("delta", True), ("dq", False), ("dkdv", True),
          ("dkdv", False)]


@pytest.fixture(scope="module")
def toolkit():
    try:
        return _build.cuda_home(required=True)
    except RuntimeError as e:
        pytest.fail(f"cannot build TileLang kernels here: {e}")


@pytest.mark.parametrize("name,causal", BUILDS, ids=[f"{n}-{'causal' if c else 'full'}" for n, c in BUILDS])
def test_factory_builds_cubin_for_sm90a(name, causal, toolkit, tmp_path, monkeypatch):
    from kernel_dispatch.backends.tilelang import lazy_attention as la

    monkeypatch.setenv("TILELANG_CACHE_DIR", str(tmp_path))
    prim = la.FACTORIES[name](64, "bfloat16", causal, *la.CONFIGS[64][name])
    kernel = _build.compile_kernel(prim, _build.SM90A)
    src = kernel.get_kernel_source()
    assert "__global__" in src
    assert "wgmma" in src, f"{name}: no wgmma in the sm_90a source (the Hopper GEMM path was not taken)"
    assert "tma_load" in src, f"{name}: no TMA load in the sm_90a source"
    cubins = glob.glob(os.path.join(str(tmp_path), "**", "*.cubin"), recursive=True)
    assert cubins, f"{name}: no cubin written under {tmp_path}"
    with open(cubins[0], "rb") as f:
        assert f.read(4) == b"\x7fELF", f"{name}: {cubins[0]} is not an ELF cubin"
