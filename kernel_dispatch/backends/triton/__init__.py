"""The Triton backend: capabilities as data; kernels in one module per operator.

On a machine without CUDA it runs only under the Triton interpreter (TRITON_INTERPRET=1,
set before triton is imported), and ``auto`` never picks it there.
"""
from __future__ import annotations

import os

import torch

from ...ops.lazy_attention import LazyAttentionCaps
from ...ops.lazy_attention_varlen import VarlenCaps
from ...ops.lazy_attention_with_kvcache import KVCacheCaps
from ...ops.mhc_pre import MHCCaps
from ._fit import unfit_reason

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
_DEVICES = ("cuda", "cpu")  # cpu: only through the interpreter, see extra_reasons
_DTYPES = (torch.float16, torch.bfloat16, torch.float32)

CAPABILITIES = {
    "lazy_attention": LazyAttentionCaps(devices=_DEVICES, auto_devices=("cuda",), dtypes=_DTYPES,
                                   head_dims=(16, 32, 64, 128),
                                   notes="two key sweeps; backward without atomics (bitwise deterministic); "
                                         "fp32 dots in IEEE fp32; no float64"),
    "lazy_attention_varlen": VarlenCaps(devices=_DEVICES, auto_devices=("cuda",), dtypes=_DTYPES,
                                        head_dims=(16, 32, 64, 128),
                                        notes="the lazy attention kernels over (document, block) programs, no "
                                              "padding; backward without atomics (bitwise deterministic); no "
                                              "float64"),
    "lazy_attention_with_kvcache": KVCacheCaps(
        devices=_DEVICES, auto_devices=("cuda",), dtypes=_DTYPES, head_dims=(16, 32, 64, 128),
        notes="split-key decode (flash-decoding): partial LSEs, scores kept for the output pass when they fit, one "
              "read of K and V per kv head for all its query heads; one split in one kernel when the batch fills the "
              "GPU; no host read (CUDA-graph safe); no float64"),
    "mhc_pre": MHCCaps(devices=_DEVICES, auto_devices=("cuda",), dtypes=_DTYPES, n_streams=(1, 2, 4, 8),
                            d_multiple=8, notes="GEMMs on tensor cores keep ~17 bits (bf16 hi/lo splits; TF32x3 "
                                                "for fp32 x); parameter gradients without atomics; no float64"),
    "mhc_post": MHCCaps(devices=_DEVICES, auto_devices=("cuda",), dtypes=_DTYPES, n_streams=(1, 2, 4, 8),
                             d_multiple=8, notes="single streaming pass each way, no atomics; no float64"),
}
PRIORITY = {"lazy_attention": 20, "lazy_attention_varlen": 20, "lazy_attention_with_kvcache": 20, "mhc_pre": 20,
            "mhc_post": 20}


def extra_reasons(op: str, meta: dict) -> list[str]:
    """Reasons beyond the capability table: CPU tensors need the interpreter; a GPU's shared memory must fit the
    kernels."""
    if meta.get("device") == "cpu" and not INTERPRET:
        return ["CPU tensors need TRITON_INTERPRET=1 (set before triton is imported)"]
    unfit = unfit_reason(op, meta)
    return [unfit] if unfit else []


def unavailable() -> str | None:
    try:
        import triton  # noqa: F401
    except Exception as e:
        return f"triton not importable ({type(e).__name__}: {e})"
    if not torch.cuda.is_available() and not INTERPRET:
        return "no CUDA device (TRITON_INTERPRET=1 runs it on the CPU)"
    return None
