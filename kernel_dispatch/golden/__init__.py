"""The golden backend: plain PyTorch, forward and closed-form backward, the executable SPEC.

Runs anywhere torch runs, in any float dtype; with float64 inputs it computes in float64.
"""
from ..registry import Capabilities

CAPABILITIES = {
    "lazy_attention": Capabilities(notes="dense O(L^2) memory; the reference"),
    "mhc_pre": Capabilities(notes="the reference"),
    "mhc_post": Capabilities(notes="the reference"),
}
PRIORITY = {"lazy_attention": 0, "mhc_pre": 0, "mhc_post": 0}


def unavailable() -> str | None:
    return None
