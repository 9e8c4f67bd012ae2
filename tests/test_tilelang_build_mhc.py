"""Every TileLang mHC kernel factory lowers to CUDA for sm_90a and builds to a cubin (no GPU needed).

The build uses TileLang's own pipeline (``_build.compile_kernel``: tvm_ffi backend, pip ``nvcc`` when no
system toolkit exists); the cubin is found inside the built executable (an embedded ELF with
e_machine EM_CUDA and arch 90). A missing compiler fails the test with the reason.
"""
from __future__ import annotations

import pathlib
import struct

import pytest

from .async_release import reads_before_arrival

EM_CUDA = 190
D, K = 4096, 4 * 4096
HP = (20, 2.0, 1e-6, 1e-6, 1e-6)  # sinkhorn_iters, post_mult, norm_eps, pre_eps, sinkhorn_eps


def _factories():
    from kernel_dispatch.backends.tilelang import (_mhc_post_bwd_kernel, _mhc_post_fwd_kernel, _mhc_pre_apply_kernel,
                                                   _mhc_pre_bwd_dot_kernel, _mhc_pre_bwd_dx_kernel,
                                                   _mhc_pre_bwd_mix_kernel, _mhc_pre_bwd_param_kernel,
                                                   _mhc_pre_gemm_kernel, _mhc_pre_mix_kernel, _mhc_pre_weights_kernel)
    from kernel_dispatch.backends.tilelang._mhc_pre_bwd_dx_kernel import DxTiles
    iters, post_mult, norm_eps, pre_eps, sk_eps = HP
    return {
        "post_fwd": (lambda: _mhc_post_fwd_kernel.build(D, "bfloat16"), False),
        "post_bwd": (lambda: _mhc_post_bwd_kernel.build(D, "float16"), False),
        "pre_weights_fwd": (lambda: _mhc_pre_weights_kernel.build(24, K, "fwd"), False),
        "pre_weights_bwd": (lambda: _mhc_pre_weights_kernel.build(24, K, "bwd"), False),
        "pre_gemm_bf16": (lambda: _mhc_pre_gemm_kernel.build(K, 24, 1), True),
        "pre_mix": (lambda: _mhc_pre_mix_kernel.build(D, 2, iters, post_mult, norm_eps, pre_eps, sk_eps), False),
        "pre_apply": (lambda: _mhc_pre_apply_kernel.build(D, "bfloat16"), False),
        "pre_bwd_dot": (lambda: _mhc_pre_bwd_dot_kernel.build(D, "bfloat16"), False),
        "pre_bwd_mix": (lambda: _mhc_pre_bwd_mix_kernel.build(D, iters, post_mult, pre_eps, sk_eps), False),
        "pre_bwd_dx_bf16": (lambda: _mhc_pre_bwd_dx_kernel.build(D, "bfloat16", 2, 1, DxTiles(stages=2)), True),
        "pre_bwd_param": (lambda: _mhc_pre_bwd_param_kernel.build(24, D, 2, 32), False),
        # second variants: fp16 x as two bf16 pieces, a masked D tail
        "pre_gemm_fp16": (lambda: _mhc_pre_gemm_kernel.build(4 * 264, 24, 2), True),
        "pre_bwd_dx_fp16_tail": (lambda: _mhc_pre_bwd_dx_kernel.build(264, "float16", 3, 2, DxTiles(stages=3)), True),
        "post_fwd_tail": (lambda: _mhc_post_fwd_kernel.build(264, "float16"), False),
        # adding the residual path's gradient (dx_acc) inside the dx kernel
        "pre_bwd_dx_acc_bf16": (lambda: _mhc_pre_bwd_dx_kernel.build(D, "bfloat16", 1, 1, DxTiles(stages=3), True), True),
        "pre_bwd_dx_acc_fp16_tail": (lambda: _mhc_pre_bwd_dx_kernel.build(264, "float16", 3, 2, DxTiles(stages=2), True),
                                     True),
    }


NAMES = ["post_fwd", "post_bwd", "pre_weights_fwd", "pre_weights_bwd", "pre_gemm_bf16", "pre_mix", "pre_apply",
         "pre_bwd_dot", "pre_bwd_mix", "pre_bwd_dx_bf16", "pre_bwd_param", "pre_gemm_fp16", "pre_bwd_dx_fp16_tail",
         "post_fwd_tail", "pre_bwd_dx_acc_bf16", "pre_bwd_dx_acc_fp16_tail"]


def _embedded_cuda_elfs(blob: bytes) -> list[int]:
    """The SM arch (e.g. 90) of every CUDA ELF (cubin) embedded in ``blob``."""
    archs, pos = [], 1
    while (pos := blob.find(b"\x7fELF", pos)) >= 0:
        if len(blob) >= pos + 52 and struct.unpack_from("<H", blob, pos + 18)[0] == EM_CUDA:
            archs.append((struct.unpack_from("<I", blob, pos + 48)[0] >> 8) & 0xFF)
        pos += 4
    return archs


@pytest.mark.parametrize("name", NAMES)
def test_mhc_kernel_builds_for_sm90a(name):
    from kernel_dispatch.backends.tilelang._build import compile_kernel

    factory, uses_wgmma = _factories()[name]
    kern = compile_kernel(factory())  # raises (naming the missing package) when no nvcc is found
    src = kern.get_kernel_source()
    assert "__global__" in src
    assert not reads_before_arrival(src), f"{name}: " + "; ".join(reads_before_arrival(src))
    if uses_wgmma:
        assert "wgmma" in src and "tma_load" in src, f"{name}: expected the sm_90a wgmma/TMA path"
    path = getattr(kern, "_tilelang_cache_path", None)
    assert path, f"{name}: TileLang kept no build directory (is its kernel cache disabled?)"
    lib = pathlib.Path(path) / "executable.so"
    assert lib.exists(), f"{name}: no built executable at {lib}"
    archs = _embedded_cuda_elfs(lib.read_bytes())
    assert 90 in archs, f"{name}: no sm_90 cubin embedded in {lib} (found archs {archs})"
