"""Whether a CUDA device has the shared memory the Triton kernels need (no triton import: the registry asks it).

The autotuner leaves out the configs that do not fit a device (_autotune.fitting); a device with less shared memory
per block than ``NEEDS[op]`` has a launch class of ``op`` with no config at all. ``NEEDS`` is the largest, over
the launch classes, of the shared memory of the class's smallest config, compiled for sm_80, sm_86, sm_89 and sm_120
(tests/test_triton_compile_archs.py checks it); Hopper, whose kernels differ, fits every config. An operator not in
``NEEDS`` is not measured yet: on a device too small for it the launch raises ``_autotune.NoFittingConfig``.
"""
from __future__ import annotations

NEEDS = {"mhc_post": 128}  # bytes of shared memory per block (sm_89)


def unfit_reason(op: str, meta: dict) -> str | None:
    """Why the Triton kernels of ``op`` cannot run on the current CUDA device, or None; ``meta`` holds the
    registry's facts of the call (its "device" type)."""
    if meta.get("device") != "cuda" or not NEEDS.get(op):
        return None
    import torch

    if not torch.cuda.is_available():
        return None
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    limit = int(getattr(props, "shared_memory_per_block_optin", 0) or props.shared_memory_per_block)
    if limit < NEEDS[op]:
        return (f"{props.name} has {limit} bytes of shared memory per block, the Triton {op} kernels need "
                f"{NEEDS[op]}")
    return None
