"""What every autotuned Triton kernel of this backend shares: the disk cache and the size class in the key."""
from __future__ import annotations

import inspect

import triton


def disk_cache() -> dict:
    """``triton.autotune`` keyword arguments that cache the winners on disk (triton >= 3.4; {} before)."""
    return {"cache_results": True} if "cache_results" in inspect.signature(triton.autotune).parameters else {}


def size_class(n: int) -> int:
    """The autotuning class of a size (the mHC token count T, the attention sequence length L): its bit
    length, so each power-of-two band is tuned once. The best tiles and splits depend on it: an mHC winner
    picked at T = 4096 ran T = 16384 at 53% of the speed of light instead of 71-73% (H100)."""
    return max(int(n), 1).bit_length()
