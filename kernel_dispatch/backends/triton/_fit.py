"""Whether a CUDA device has the shared memory the Triton kernels need (no triton import: the registry asks it).

The autotuner leaves out the configs that do not fit a device (_autotune.fitting); a device with less shared memory
per block than ``NEEDS`` says has a launch class with no config at all, and the registry gives that as a reason (auto
takes the next backend). ``NEEDS[op]`` is the largest, over the launch classes, of the shared memory of the class's
smallest config, compiled for sm_89 (the largest of sm_80, sm_86, sm_89 and sm_120; tests/test_triton_compile_archs.py
checks it): one number, or one per (dtype kind, head dim) where the call decides it. Hopper, whose kernels differ,
fits every config. An operator not in ``NEEDS`` is not measured: on a device too small for it the launch raises
``_autotune.NoFittingConfig``.
"""
from __future__ import annotations

# lazy attention (sm_89 build of every shipped config, causal): the dK/dV kernel decides; fp32 at head dim 128 needs
# 106752 bytes, more than the 101376 of sm_86, sm_89 and sm_120 (RTX cards, A10, L4, L40): those take another
# backend for it. Head dims below 64 use smaller tiles than 64 (bounded by its entry).
_ATTENTION = {("fp32", 128): 106752, ("fp32", 64): 40960, ("half", 128): 73728, ("half", 64): 49152}
NEEDS = {"mhc_post": 128, "mhc_pre": 81920, "lazy_attention": _ATTENTION, "lazy_attention_varlen": _ATTENTION}


def needed_bytes(op: str, meta: dict) -> int | None:
    """Shared memory per block the Triton kernels of ``op`` need for a call with the registry's facts ``meta``
    (its "dtype" and "head_dim" where they decide), or None where not measured."""
    need = NEEDS.get(op)
    if not isinstance(need, dict):
        return need
    dtype, head_dim = meta.get("dtype"), meta.get("head_dim")
    if dtype is None or head_dim is None:
        return max(need.values())
    kind = "fp32" if str(dtype).endswith("float32") else "half"
    return need.get((kind, 128 if head_dim > 64 else 64))


def unfit_reason(op: str, meta: dict) -> str | None:
    """Why the Triton kernels of ``op`` cannot run on the current CUDA device, or None; ``meta`` holds the
    registry's facts of the call (its "device" type, and dtype and head dim where they decide)."""
    need = needed_bytes(op, meta)
    if meta.get("device") != "cuda" or not need:
        return None
    import torch

    if not torch.cuda.is_available():
        return None
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    limit = int(getattr(props, "shared_memory_per_block_optin", 0) or props.shared_memory_per_block)
    if limit < need:
        return f"{props.name} has {limit} bytes of shared memory per block, the Triton {op} kernels need {need}"
    return None
