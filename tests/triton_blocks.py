"""The shipped CUDA block shapes of the Triton lazy attention kernels, run under the interpreter: the parameters
that cover each shape at least once, and the pinning of one (fwd, dq, dkdv) choice for a test."""
from __future__ import annotations

import pytest
import triton

from kernel_dispatch.backends.triton import lazy_attention as tk


def cuda_block_configs() -> list:
    """pytest params (fwd (BLOCK_M, BLOCK_N), dq BLOCK, dkdv (BLOCK_M, BLOCK_N)) that use every shipped CUDA block
    shape at least once."""
    def shapes(kernel, *names):
        return sorted({tuple(c.kwargs[n] for n in names) for dt in tk.DTYPES for d in tk.HEAD_DIMS
                       for c in tk.shipped_configs(kernel, d, dt)})

    fwd, dkdv = shapes("fwd", "BLOCK_M", "BLOCK_N"), shapes("dkdv", "BLOCK_M", "BLOCK_N")
    dq = [b for (b,) in shapes("dq", "BLOCK")]
    out = []
    for i in range(max(len(fwd), len(dkdv), len(dq))):
        f, q, d = fwd[i % len(fwd)], dq[i % len(dq)], dkdv[i % len(dkdv)]
        out.append(pytest.param(f, q, d, id=f"fwd{f[0]}x{f[1]}-dq{q}-dkdv{d[0]}x{d[1]}"))
    return out


def pin_blocks(monkeypatch, fwd_blocks, dq_block, dkdv_blocks) -> None:
    """Every Triton lazy attention kernel autotunes over this one block choice (1 warp, 1 stage)."""
    blocks = {"fwd": {"BLOCK_M": fwd_blocks[0], "BLOCK_N": fwd_blocks[1]}, "dq": {"BLOCK": dq_block},
              "dkdv": {"BLOCK_M": dkdv_blocks[0], "BLOCK_N": dkdv_blocks[1]}}
    for name, kernel in tk.KERNELS.items():
        monkeypatch.setattr(kernel, "configs", [triton.Config(blocks[name], num_warps=1, num_stages=1)])
