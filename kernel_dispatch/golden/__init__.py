"""The golden backend: plain PyTorch, forward and closed-form backward, the executable SPEC.

Runs anywhere torch runs, in any float dtype; with float64 inputs it computes in float64.
"""
from ..ops.lazy_attention import LazyAttentionCaps
from ..ops.lazy_attention_varlen import VarlenCaps
from ..ops.lazy_attention_with_kvcache import KVCacheCaps
from ..ops.mhc_pre import MHCCaps

CAPABILITIES = {
    "lazy_attention": LazyAttentionCaps(double_backward=True, notes="dense O(L^2) memory; the reference"),
    "lazy_attention_varlen": VarlenCaps(double_backward=True, notes="each document dense O(L_d^2), documents of one length batched; "
                                              "the reference"),
    "lazy_attention_with_kvcache": KVCacheCaps(notes="forward only; each row dense over its keys; the reference"),
    "mhc_pre": MHCCaps(double_backward=True, notes="the reference"),
    "mhc_post": MHCCaps(double_backward=True, notes="the reference"),
}
PRIORITY = {"lazy_attention": 0, "lazy_attention_varlen": 0, "lazy_attention_with_kvcache": 0, "mhc_pre": 0, "mhc_post": 0}


def unavailable() -> str | None:
    return None
