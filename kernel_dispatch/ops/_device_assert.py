"""One-kernel range checks on a CUDA device: every element of an integer tensor in [low, high], else a device-side
assert that prints the message (the CUDA context is then unusable, as after any device-side assert).

The torch expression of the same check (``aminmax``, compares, ``_assert_async``) is five kernels; in a captured
decode step of ``lazy_attention_with_kvcache`` they cost more than the attention itself at small caches (H100, bf16,
B=1, 4K keys: 42 us against 25 us for the kernels alone). This is one Triton kernel compiled with its device
asserts on (``debug=True`` for this function only). Not for torch.compile, whose traced checks Inductor fuses.
"""
from __future__ import annotations

import functools
import importlib.util

import torch

BLOCK = 1024


@functools.lru_cache(maxsize=None)
def _kernel():
    import triton
    import triton.language as tl

    @triton.jit(debug=True)
    def in_range_kernel(X, n, low, high, HAS_LOW: tl.constexpr, HAS_HIGH: tl.constexpr, MESSAGE: tl.constexpr,
                        BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        inside = offs < n
        x = tl.load(X + offs, mask=inside, other=0).to(tl.int64)
        ok = ~inside
        if HAS_LOW:
            lo_ok = x >= low
        else:
            lo_ok = inside
        if HAS_HIGH:
            hi_ok = x <= high
        else:
            hi_ok = inside
        tl.device_assert(ok | (lo_ok & hi_ok), MESSAGE)

    return in_range_kernel


def available(values: torch.Tensor) -> bool:
    """Whether :func:`assert_in_range` serves ``values``: a contiguous CUDA integer tensor, Triton importable, not
    while torch.compile traces."""
    if not values.is_cuda or values.is_floating_point() or values.is_complex() or values.dtype == torch.bool:
        return False
    if torch.compiler.is_compiling() or not values.is_contiguous():
        return False
    return importlib.util.find_spec("triton") is not None


def assert_in_range(values: torch.Tensor, low: int | None, high: int | None, message: str) -> None:
    """Device-side assert that every element of ``values`` (contiguous CUDA integer tensor) is in [low, high]
    (None: unbounded); no synchronisation, capturable in a CUDA graph."""
    n = values.numel()
    if n == 0:
        return
    with torch.cuda.device(values.device):
        _kernel()[(-(-n // BLOCK),)](values, n, 0 if low is None else int(low), 0 if high is None else int(high),
                                     HAS_LOW=low is not None, HAS_HIGH=high is not None, MESSAGE=message,
                                     BLOCK=BLOCK, num_warps=4)
