"""How the KV-cache kernels of every backend cut a batch row's keys into splits (SPEC section 5).

Backend-neutral and free of GPU imports. The split count depends on shapes only (the grid of a decode step that a
CUDA graph captures must not depend on the cache lengths); each kernel then cuts its row's n_b keys into that many
chunks of whole key tiles on the device, and splits past n_b have no keys.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SplitPolicy:
    """Programs for ``ctas_per_sm`` per SM in all (a memory-bound pass needs the whole GPU), no split of a full
    cache shorter than ``min_keys`` keys (a multiple of the kernels' key tile), and at most ``max_splits`` (the
    output pass reads every split's partial LSE of its rows at once). With ``one_split_fill``, one split whenever
    one program per batch row and kv head (and row block) fills that fraction of the SMs: one split needs no wait
    between the passes, so both run in one kernel."""
    ctas_per_sm: int
    min_keys: int
    max_splits: int = 128
    one_split_fill: float | None = None


def num_splits(programs: int, capacity: int, sms: int, policy: SplitPolicy) -> int:
    """Splits of each batch row's keys, given ``programs`` = B * Hkv * row blocks and the cache capacity S."""
    if policy.one_split_fill is not None and programs >= policy.one_split_fill * sms:
        return 1
    want = max(1, policy.ctas_per_sm * sms // max(programs, 1))
    return max(1, min(want, -(-capacity // policy.min_keys), policy.max_splits))


def keep_scores(rows: int, head_dim: int, elem_bytes: int) -> bool:
    """Whether pass 2 reads pass 1's fp32 scores, R of them per key written and read back (8 R bytes), rather than
    reading the key again (head_dim * elem_bytes): R = (H / Hkv) * Lq rows share each key."""
    return 8 * rows < head_dim * elem_bytes


@functools.lru_cache(maxsize=None)
def _cuda_sms(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def sm_count(device: torch.device, default: int) -> int:
    """The SMs of a CUDA ``device``; ``default`` for any other device (the Triton interpreter)."""
    if device.type != "cuda":
        return default
    return _cuda_sms(device.index if device.index is not None else torch.cuda.current_device())
