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


CU_MESSAGES = {"start": "cu_seqlens: expected cu_seqlens[0] == 0",
               "order": "cu_seqlens: expected non-decreasing values",
               "end": "cu_seqlens: expected the last value to be T (q.shape[0])",
               "longest": "max_seqlen: smaller than the longest document"}


@functools.lru_cache(maxsize=None)
def _cu_seqlens_kernel():
    import triton
    import triton.language as tl

    @triton.jit(debug=True)
    def cu_seqlens_kernel(CU, n_docs, total, max_seqlen, START: tl.constexpr, ORDER: tl.constexpr,
                          END: tl.constexpr, LONGEST: tl.constexpr, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        doc = offs < n_docs
        lo = tl.load(CU + offs, mask=doc, other=0)
        hi = tl.load(CU + offs + 1, mask=doc, other=0)
        tl.device_assert(~doc | (hi >= lo), ORDER)
        tl.device_assert(~doc | (hi - lo <= max_seqlen), LONGEST)
        first = tl.load(CU + offs, mask=offs == 0, other=0)
        tl.device_assert((offs != 0) | (first == 0), START)
        last = tl.load(CU + offs + 1, mask=offs == n_docs - 1, other=0)
        tl.device_assert((offs != n_docs - 1) | (last == total), END)

    return cu_seqlens_kernel


def assert_cu_seqlens(cu_seqlens: torch.Tensor, total: int, max_seqlen: int) -> None:
    """Device-side asserts, in one kernel, that ``cu_seqlens`` [N + 1] (contiguous CUDA int32) starts at 0, never
    decreases, ends at ``total`` and holds no document longer than ``max_seqlen``; each failure prints the message
    of ``CU_MESSAGES`` that names the argument. No synchronisation, capturable in a CUDA graph."""
    n_docs = cu_seqlens.numel() - 1
    with torch.cuda.device(cu_seqlens.device):
        _cu_seqlens_kernel()[(-(-n_docs // BLOCK),)](
            cu_seqlens, n_docs, int(total), int(max_seqlen), START=CU_MESSAGES["start"], ORDER=CU_MESSAGES["order"],
            END=CU_MESSAGES["end"], LONGEST=CU_MESSAGES["longest"], BLOCK=BLOCK, num_warps=4)
