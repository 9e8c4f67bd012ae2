"""The CuTe DSL backend: lazy attention kernels written in CUTLASS's CuTe DSL (Python; NVIDIA's licence, see the
README), compiled ahead of time for Hopper (sm_90a) into small shared objects, or at first use where the DSL is
installed (``_store``). Capabilities as data; nothing here imports the DSL or its runtime.
"""
import torch

from ...ops.lazy_attention import LazyAttentionCaps
from ._kernel_key import KernelKey

CAPABILITIES = {
    "lazy_attention": LazyAttentionCaps(
        devices=("cuda",), dtypes=(torch.float16, torch.bfloat16), head_dims=(64, 128),
        notes="Hopper (sm_90) only; kernels prebuilt (python -m kernel_dispatch.backends.cute.build) or compiled at "
              "first use where the DSL is installed; fp32 and float64: no; non-contiguous inputs are copied; first "
              "in auto: the fastest here at every benchmarked shape (H200, docs/benchmarks.md: fwd+bwd 1.42x of "
              "cuDNN against TileLang's 2.06x at D=128, 1.60x against 2.25x at D=64)"),
}
# First in auto where it runs: its forward and forward + backward are the fastest lazy attention here at every
# benchmarked shape (docs/benchmarks.md; docs/cute-backend.md, "Speed").
PRIORITY = {"lazy_attention": 40}

_DTYPE_NAMES = {torch.float16: "float16", torch.bfloat16: "bfloat16"}


def unavailable() -> str | None:
    if not torch.cuda.is_available():
        return "no CUDA device"
    major, minor = torch.cuda.get_device_capability()
    if (major, minor) != (9, 0):
        return f"needs a Hopper GPU (sm_90); cuda:{torch.cuda.current_device()} is sm_{major}{minor}"
    from . import _store

    return _store.runtime_unavailable()


def extra_reasons(op: str, meta: dict) -> list[str]:
    """A kernel the call needs that is neither stored nor compilable here: its name and how to build it."""
    dtype, head_dim = _DTYPE_NAMES.get(meta.get("dtype")), meta.get("head_dim")
    if op != "lazy_attention" or dtype is None or head_dim not in (64, 128) or meta.get("device") != "cuda":
        return []
    from . import _store

    causal = meta.get("causal") is not False
    reasons = [_store.why_missing(KernelKey(k, head_dim, dtype, causal)) for k in _store.KERNEL_MODULES]
    return [r for r in reasons if r]
