"""Tensors the cute launchers keep per (device, stream) instead of making them each call: the all-L lengths and the
persistent forward kernels' tile counters (each kernel's last tile claim sets its counter back to zero). Imports no
DSL."""
import torch


def kept(device: torch.device, what: tuple, make) -> torch.Tensor:
    """The tensor ``make()`` gives, kept per (device, current stream, ``what``) and made with that stream current, so
    that dropping one (past KEPT_PER_STREAM of a stream) frees it in that stream's order. Fresh each call off CUDA or
    while a CUDA graph is being captured (a tensor of the capture's private memory pool must not outlive it)."""
    if device.type != "cuda" or torch.cuda.is_current_stream_capturing():
        return make()
    stream = torch.cuda.current_stream(device)
    store = _KEPT.setdefault((stream.device_index, stream.cuda_stream), {})
    if what not in store:
        if len(store) >= KEPT_PER_STREAM:
            store.pop(next(iter(store)))
        store[what] = make()
    return store[what]


KEPT_PER_STREAM = 64
_KEPT: dict[tuple[int, int], dict[tuple, torch.Tensor]] = {}


def full_lengths(device: torch.device, B: int, L: int) -> torch.Tensor:
    """[B] int32 of L on ``device`` (the kernels only read it), kept per (B, L) by :func:`kept`."""
    return kept(device, ("lengths", B, L), lambda: torch.full((B,), L, dtype=torch.int32, device=device))


def tile_counters(device: torch.device) -> torch.Tensor:
    """[2] int32 zeros on ``device``, one per persistent kernel, kept by :func:`kept`: each kernel's last tile claim
    sets its counter back to zero (``_tiles.claim_next_tile``), so one pair serves every call on a stream, the calls
    running in stream order."""
    return kept(device, ("counters",), lambda: torch.zeros(2, dtype=torch.int32, device=device))
