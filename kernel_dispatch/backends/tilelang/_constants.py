"""Device constants the TileLang launchers reuse between calls (ones for gamma=None, 1/i of causal rows).

They are made by fill kernels. While the current stream captures a CUDA graph those kernels are only recorded,
not run, so a tensor made then holds garbage until the graph replays: it is returned but never cached.
"""
from __future__ import annotations

from typing import Callable, Hashable

import torch

MAX_ENTRIES = 256  # distinct (shape, device) keys kept; past that the cache starts over

_cache: dict = {}


def constant(key: Hashable, make: Callable[[], torch.Tensor]) -> torch.Tensor:
    """``make()`` for ``key``, made once and reused (the kernels only read it); not cached while capturing."""
    t = _cache.get(key)
    if t is None:
        t = make()
        if not (t.is_cuda and torch.cuda.is_current_stream_capturing()):
            if len(_cache) >= MAX_ENTRIES:
                _cache.clear()
            _cache[key] = t
    return t
