"""Recompute of the mHC residual streams in the backward (the mHC paper's "recomputing", arXiv 2512.24880).

Every mHC wrapper keeps its input streams x_l [..., n, D] for the backward (mhc_pre and mhc_post save
them): n times the activation of a plain residual, per wrapper. :class:`StreamRecompute` keeps only the
first input x_{l0} of every ``block`` consecutive wrappers. The other x_l are dropped after the forward
and rebuilt in the backward from x_{l0} by re-running mhc_post, x_{l+1} = mhc_post(f_l, x_l, h_post_l,
h_res_l): the sublayer outputs f_l and the small mixings are saved by mhc_post anyway, so no sublayer
runs twice. The autograd graph is the one without recompute (a saved-tensor hook swaps the stored
x_l for a handle), and mhc_post runs again with the backend of its forward call, so every gradient
is bitwise the one without recompute.

Memory: the forward keeps ceil(W / block) stream tensors instead of W (W wrappers); the backward of a
block holds up to block - 1 rebuilt ones. ``block`` = sqrt(n W / (n + 2)) balances the two (the paper's
L_r*, counting the sublayer outputs, C per wrapper, against the streams, nC).

Limits: inside mhc_pre and mhc_post calls the hook replaces any outer ``saved_tensors_hooks`` (such as
``torch.autograd.graph.save_on_cpu``) for what those two ops save; torch.compile does not trace it.
"""
from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import Tensor


def optimal_block(n_streams: int, n_wrappers: int) -> int:
    """The paper's L_r* = sqrt(n W / (n + 2)) rounded, at least 1: wrappers per recompute block."""
    return max(1, round(math.sqrt(n_streams * n_wrappers / (n_streams + 2))))


@dataclass(frozen=True)
class _Handle:
    """What the saved-tensor hook keeps instead of a view of stream ``index`` of ``block``."""

    block: "_Block"
    index: int
    size: tuple
    stride: tuple
    offset: int  # storage offset relative to the stream's own


@dataclass(frozen=True)
class _Step:
    """What mhc_post of one wrapper took besides its streams, detached, and the backend that ran it."""

    f: Tensor
    h_post: Tensor
    h_res: Tensor
    backend: str


class _Block:
    """One recompute block: its first input, the post inputs of its wrappers, and the rebuilt streams."""

    def __init__(self, x0: Tensor):
        self.streams: list[Tensor | None] = [x0.detach()]  # stream l: kept for l = 0, dropped after its wrapper
        self.steps: list[_Step] = []
        self.geometry: list[tuple] = [(x0.stride(), x0.storage_offset())]
        self.cache: dict[int, Tensor] = {}
        self.pending: dict[int, int] = {}
        self.current = -1  # the stream whose tensors the hook replaces now (only while its wrapper runs)

    def pack(self, t: Tensor):
        j = self.current
        if j < 1 or t.dtype != self.streams[j].dtype:
            return t
        stream = self.streams[j]
        if t.untyped_storage().data_ptr() != stream.untyped_storage().data_ptr():
            return t
        self.pending[j] = self.pending.get(j, 0) + 1
        return _Handle(self, j, tuple(t.shape), t.stride(), t.storage_offset() - stream.storage_offset())

    @staticmethod
    def unpack(packed):
        if not isinstance(packed, _Handle):
            return packed
        block, j = packed.block, packed.index
        base = block.rebuild(j)
        block.pending[j] -= 1
        if block.pending[j] <= 0:
            block.cache.pop(j, None)
        return base.as_strided(packed.size, packed.stride, base.storage_offset() + packed.offset)

    def rebuild(self, j: int) -> Tensor:
        """Stream j, recomputed from the nearest kept or cached stream before it with the forward's backend."""
        from .ops import mhc_post

        if j in self.cache:
            return self.cache[j]
        start = max([i for i in self.cache if i < j], default=0)
        x = self.cache[start] if start else self.streams[0]
        with torch.no_grad(), torch.autocast(x.device.type, enabled=False):
            for i in range(start, j):
                s = self.steps[i]
                x = mhc_post(s.f, x, s.h_post, s.h_res, backend=s.backend)
                if self.pending.get(i + 1, 0) > 0:
                    self.cache[i + 1] = x
        stride, offset = self.geometry[j]
        if x.stride() != stride or x.storage_offset() != offset:
            raise RuntimeError(f"mHC recompute: stream {j} came back with strides {x.stride()} (offset "
                               f"{x.storage_offset()}), the forward made {stride} (offset {offset})")
        return x

    @contextmanager
    def hooks(self, j: int):
        self.current = j
        try:
            with torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack):
                yield
        finally:
            self.current = -1


class StreamRecompute:
    """One forward pass of consecutive mHC wrappers that keeps one stream tensor per ``block`` wrappers.

    Make one per forward pass and give it to every wrapper, in order, each taking the previous
    wrapper's output::

        recompute = StreamRecompute(block=4)
        for layer in mhc_layers:
            x = layer(x, recompute=recompute)

    Outside autograd (``torch.no_grad``, inference) the wrappers ignore it.
    """

    def __init__(self, block: int):
        if isinstance(block, bool) or not isinstance(block, int) or block < 1:
            raise ValueError(f"block: expected an int >= 1 (mHC wrappers per recompute block), got {block!r}")
        self.block_size = block
        self._block: _Block | None = None
        self._last: Tensor | None = None
        self._backends: dict[tuple, str] = {}

    def _post_backend(self, f: Tensor, x: Tensor, h_post: Tensor, h_res: Tensor) -> str:
        """The backend mhc_post's forward ran on for these inputs (resolved once per kind of input and choice)."""
        from . import registry
        from .explain import which_backend

        key = (x.device.type, x.dtype, tuple(x.shape[-2:]), registry.current_choice("mhc_post"))
        if key not in self._backends:
            self._backends[key] = which_backend("mhc_post", f, x, h_post, h_res).forward
        return self._backends[key]

    def __call__(self, mhc, x: Tensor, *args, **kwargs) -> Tensor:
        """``mhc(x, *args, **kwargs)`` for the wrapper ``mhc`` (a :class:`kernel_dispatch.nn.MHC`)."""
        block = self._block
        if block is None or len(block.steps) == self.block_size:
            block = self._block = _Block(x)
        elif x is not self._last:
            raise ValueError("x: with mHC recompute, each wrapper must take the previous wrapper's output "
                             "(start a new StreamRecompute for another sequence of wrappers)")
        j = len(block.steps)
        with block.hooks(j):
            h_in, h_post, h_res, x_res = mhc.pre(x)
        f = mhc.sublayer(h_in, *args, **kwargs).to(x.dtype)
        with block.hooks(j):
            out = mhc.post(f, x_res, h_post, h_res)
        backend = self._post_backend(f, x_res, h_post, h_res)
        block.steps.append(_Step(f.detach(), h_post.detach(), h_res.detach(), backend))
        if j > 0:
            block.streams[j] = None  # the handles rebuild it; no reference is kept
        if len(block.steps) < self.block_size:
            block.streams.append(out.detach())
            block.geometry.append((out.stride(), out.storage_offset()))
        self._last = out
        return out
