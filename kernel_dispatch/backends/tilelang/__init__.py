"""The TileLang backend: capabilities as data; kernel factories in one module per operator.

TileLang needs a CUDA device to run; without one it is reported unavailable and never
imported at run time (lowering to CUDA source for sm_90a still works, see tests).
"""
from __future__ import annotations

import torch

from ...ops.lazy_attention import LazyAttentionCaps
from ...ops.lazy_attention_varlen import VarlenCaps
from ...ops.lazy_attention_with_kvcache import KVCacheCaps
from ...ops.mhc_pre import MHCCaps

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)

CAPABILITIES = {
    "lazy_attention": LazyAttentionCaps(devices=("cuda",), dtypes=(torch.float16, torch.bfloat16), head_dims=(64, 128),
                                   notes="Hopper (sm_90a) kernels, checked on H200 and H100; fp32 and float64: no "
                                         "(TileLang's fp32 GEMM is TF32); non-contiguous inputs are copied; ahead of "
                                         "Triton in auto: faster than Triton on every benchmarked forward and on "
                                         "every fwd+bwd but D=64 at L >= 16384 (H200, docs/benchmarks.md: 8.626 vs "
                                         "8.553 ms, 32.58 vs 31.28; on an H100 only L=32768, 30.71 vs 30.51)"),
    "lazy_attention_varlen": VarlenCaps(devices=("cuda",), dtypes=(torch.float16, torch.bfloat16),
                                        head_dims=(64, 128),
                                        notes="the lazy_attention kernels in their packed-documents form: "
                                              "forward two launches, backward three, no host read (CUDA-graph "
                                              "capturable); Hopper (sm_90a); fp32 and float64: no"),
    "lazy_attention_with_kvcache": KVCacheCaps(
        devices=("cuda",), dtypes=(torch.float16, torch.bfloat16), head_dims=(64, 128),
        notes="Hopper (sm_90a) split-key decode: K by TMA once, partial LSEs, scores kept for the output pass when "
              "they fit; non-contiguous caches are copied (keep them contiguous); no host read (CUDA-graph safe)"),
    "mhc_pre": MHCCaps(devices=("cuda",), dtypes=(torch.float16, torch.bfloat16), n_streams=(4,), d_multiple=8,
                            notes="x fp16/bf16 only (fp32, float64: no); GEMMs on bf16 tensor cores, 2-piece split; "
                                  "first in auto: faster than Triton on the mHC block's fwd+bwd at every benchmarked "
                                  "shape and on every forward from 1 ms up (H100); below 1 ms the block's times vary "
                                  "up to 2x between runs and Triton led one forward (T=16384, D=1280: 0.50 vs 0.60 "
                                  "ms)"),
    "mhc_post": MHCCaps(devices=("cuda",), dtypes=(torch.float16, torch.bfloat16), n_streams=(4,), d_multiple=8,
                             notes="x fp16/bf16 only (fp32, float64: no)"),
}
# Above Triton (20): docs/benchmarks.md (H100, commits ca03af2 and f3284e8) shows TileLang faster on every lazy
# attention forward and fwd+bwd, the target shape included, and every mHC fwd+bwd. The points where Triton leads are
# named in the notes (lazy attention: one fwd+bwd at L=32768 by 0.7%, a tie; mHC: one sub-millisecond forward).
# Priority is per operator, so auto keeps TileLang first there. KV-cache decode: Triton was faster at all seven
# benchmarked shapes (H100, docs/benchmarks.md), so TileLang comes after it. lazy_attention_varlen: TileLang's packed
# kernels are faster than Triton's in both benchmark cases, forward and fwd+bwd (H100, 81caf82: random draw 0.77 /
# 3.04 against 0.85 / 3.38 ms, 4 x 4096 0.98 / 3.96 against 1.09 / 4.48 ms), so TileLang comes first there too.
PRIORITY = {"lazy_attention": 30, "lazy_attention_varlen": 30, "lazy_attention_with_kvcache": 10, "mhc_pre": 30,
            "mhc_post": 30}


# Refused until fixed: on an H100 (torch 2.11, tilelang 0.1.15) this misses golden float64 by 0.1-0.5 relative
# (docs/gpu-verification.md, "Known wrong, refused"); auto falls back to Triton, an explicit choice raises.
KNOWN_WRONG = {
    "lazy_attention": ("causal=False with lengths: dK/dV wrong at realistic sizes (B=2, H=16, L=2048, D=128, "
                       "lengths 2048/1501; tests/test_equivalence.py realistic_noncausal_lengths)"),
}


def extra_reasons(op: str, meta: dict) -> list[str]:
    """Configurations whose kernels are known to give wrong results: a reason, never a wrong answer."""
    if op == "lazy_attention" and meta.get("causal") is False and meta.get("lengths"):
        return [KNOWN_WRONG[op]]
    return []


def unavailable() -> str | None:
    if not torch.cuda.is_available():
        return "no CUDA device"
    try:
        import tilelang  # noqa: F401
    except Exception as e:
        return f"tilelang not importable ({type(e).__name__}: {e})"
    return None
