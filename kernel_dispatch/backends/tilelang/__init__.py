"""The TileLang backend: capabilities as data; kernel factories in one module per operator.

TileLang needs a CUDA device to run; without one it is reported unavailable and never
imported at run time (lowering to CUDA source for sm_90a still works, see tests).
"""
from __future__ import annotations

import torch

from ...registry import Capabilities

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)

CAPABILITIES = {
    "lazy_attention": Capabilities(devices=("cuda",), dtypes=(torch.float16, torch.bfloat16), head_dims=(64, 128),
                                   notes="Hopper (sm_90a) kernels, checked on H200 and H100; fp32 and float64: no "
                                         "(TileLang's fp32 GEMM is TF32); non-contiguous inputs are copied; first in "
                                         "auto: faster than Triton on every benchmarked fwd+bwd and forward (H100) "
                                         "but one forward, L=1024, D=128, a tie within run-to-run noise (0.406 vs "
                                         "0.403 ms; Triton took 0.543 in the run before)"),
    "mhc_pre": Capabilities(devices=("cuda",), dtypes=(torch.float16, torch.bfloat16), n_streams=(4,), d_multiple=8,
                            notes="x fp16/bf16 only (fp32, float64: no); GEMMs on bf16 tensor cores, 2-piece split; "
                                  "first in auto: faster than Triton on the mHC block's fwd+bwd at every benchmarked "
                                  "shape and on every forward from 1 ms up (H100); below 1 ms the block's times vary "
                                  "up to 2x between runs and Triton led one forward (T=16384, D=1280: 0.50 vs 0.60 "
                                  "ms)"),
    "mhc_post": Capabilities(devices=("cuda",), dtypes=(torch.float16, torch.bfloat16), n_streams=(4,), d_multiple=8,
                             notes="x fp16/bf16 only (fp32, float64: no)"),
}
# Above Triton (20): docs/benchmarks.md (H100, commits 7776cb2 and f3284e8) shows TileLang faster on every lazy
# attention fwd+bwd, the target shape included, and every mHC fwd+bwd. The points where Triton leads are named in
# the notes (lazy attention: one forward at L=1024 by 1%, a tie; mHC: one sub-millisecond forward).
# Priority is per operator, so auto keeps TileLang first there.
PRIORITY = {"lazy_attention": 30, "mhc_pre": 30, "mhc_post": 30}


def unavailable() -> str | None:
    if not torch.cuda.is_available():
        return "no CUDA device"
    try:
        import tilelang  # noqa: F401
    except Exception as e:
        return f"tilelang not importable ({type(e).__name__}: {e})"
    return None
