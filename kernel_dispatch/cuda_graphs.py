"""Capturing work that runs these ops in a CUDA graph (README, "Small shapes: capture the step in a CUDA graph").

Every Triton and TileLang op launches on torch's current stream, allocates through the caching allocator and never
waits for the device once warm (but TileLang lazy_attention_varlen, which reads cu_seqlens on the host), so a whole
forward and backward can be captured and replayed.
"""
from __future__ import annotations

from typing import Any, Callable

import torch


def capture(fn: Callable[[], Any], warmup: int = 3,
            before_capture: Callable[[], None] | None = None) -> tuple[torch.cuda.CUDAGraph, Any]:
    """Run ``fn`` ``warmup`` times on a side stream (kernels compile, autotune and load; the allocator warms), call
    ``before_capture``, then capture one call of ``fn``: returns (graph, what that call returned). Each
    ``graph.replay()`` rewrites those returned tensors from the inputs ``fn`` read, in place."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    if before_capture is not None:
        before_capture()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph, out
