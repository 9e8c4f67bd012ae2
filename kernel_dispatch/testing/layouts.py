"""Layouts that catch a kernel reading one tensor with another tensor's strides.

:func:`distinct` re-lays tensors so that no two share a stride value in any dimension (dimensions of size 1
excepted: their stride is never read), nor with a contiguous tensor of any of their shapes (the outputs a
launcher allocates). :func:`relaid` applies it to every floating tensor and upstream gradient of a test's
:class:`~kernel_dispatch.testing.matrix.Inputs`; :func:`relaid_kernel_calls` to every floating tensor a backend's
``forward`` and ``backward`` receive (so also the saved residuals: O, LSE, z, inv_rms). Each re-laid tensor is a
view into a NaN-filled buffer with room behind it: a read through a wrong stride lands on NaN or on another
element, never outside the allocation (the room is capped at ROOM_CAP elements, far above the layout tests' needs).
"""
from __future__ import annotations

import contextlib
import itertools
from typing import Iterator, Sequence

import torch

from .. import registry
from .matrix import Inputs


ROOM_CAP = 1 << 24  # elements of NaN room behind a re-laid view, at most


def _contiguous_strides(shape: Sequence[int]) -> list[int]:
    out, acc = [], 1
    for n in reversed(shape):
        out.append(acc)
        acc *= n
    return out[::-1]


def _layout(shape: Sequence[int], order: Sequence[int], pad: Sequence[int], step: int) -> list[int]:
    """Strides of ``shape`` stored with dims in ``order`` (outermost first), each dim padded by ``pad[d]`` places
    and the innermost stored dim taking every ``step``-th element."""
    strides = [0] * len(shape)
    acc = step
    for d in reversed(order):
        strides[d] = acc
        acc *= shape[d] + pad[d]
    return strides


def _strides_for(shape, k: int, taken: set[int]) -> list[int]:
    """Strides for the k-th tensor of ``shape``: one of the dims' storage orders, an inner step from k + 1 and
    paddings, both grown until no dimension of size > 1 reuses a value of ``taken``."""
    rank = len(shape)
    orders = list(itertools.permutations(range(rank)))
    order = orders[(k * 7 + 1) % len(orders)] if rank > 1 else (0,)
    for extra in itertools.count():
        pad = [1 + (k + d + extra) % 3 + extra for d in range(rank)]
        strides = _layout(shape, order, pad, k + 1 + extra)
        vals = [s for s, n in zip(strides, shape) if n > 1]
        if len(set(vals)) == len(vals) and not set(vals) & taken:
            return strides


def _view(t: torch.Tensor, strides: Sequence[int], room: int) -> torch.Tensor:
    """A view with ``strides`` of t's values, in a NaN-filled buffer of ``room`` elements past its last one."""
    extent = 1 + sum((n - 1) * s for n, s in zip(t.shape, strides)) if t.numel() else 1
    fill = float("nan") if t.is_floating_point() else 0
    buf = torch.full((extent + room,), fill, dtype=t.dtype, device=t.device)
    out = buf.as_strided(t.shape, strides)
    out.copy_(t)
    return out


def distinct(tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """The same values, each tensor in its own layout: no stride value (dims of size > 1) is shared between two of
    them or with a contiguous tensor of any of their shapes. Integer tensors are returned as they are."""
    taken = {s for t in tensors for s, n in zip(_contiguous_strides(t.shape), t.shape) if n > 1}
    chosen: list = []
    for k, t in enumerate(tensors):
        if not t.is_floating_point() or t.dim() == 0:
            chosen.append(None)
            continue
        strides = _strides_for(t.shape, k, taken)
        taken |= {s for s, n in zip(strides, t.shape) if n > 1}
        chosen.append(strides)
    # room behind each view for a read through any other tensor's strides (or a contiguous output's): every index
    # at its largest times the largest stride there is
    largest = max([1] + [max(s) for s in chosen if s] + [max(_contiguous_strides(t.shape), default=1) for t in tensors])
    room = max((t.dim() * max(t.shape, default=1) for t in tensors), default=1) * largest
    # the bound grows with the square of the sizes: past ROOM_CAP elements (larger shapes than the layout tests', e.g.
    # the GPU property draws) a read through a wrong stride may leave the allocation (a device fault: still a failure)
    return [t if s is None else _view(t, s, min(room, ROOM_CAP)) for t, s in zip(tensors, chosen)]


def relaid(inp: Inputs) -> Inputs:
    """``inp`` with every floating tensor and upstream gradient re-laid by :func:`distinct` (together)."""
    names = [k for k, v in inp.tensors.items() if isinstance(v, torch.Tensor)]
    out = distinct([inp.tensors[k] for k in names] + list(inp.grads))
    tensors = {**inp.tensors, **dict(zip(names, out[:len(names)]))}
    return Inputs(tensors, inp.kwargs, tuple(out[len(names):]))


class _Relaying:
    """Stands for a backend's kernel module: ``forward`` and ``backward`` get every floating tensor argument
    re-laid by :func:`distinct` (the residuals and upstream gradients included); anything else is the module's."""

    def __init__(self, module):
        self._module = module

    def __getattr__(self, name):
        return getattr(self._module, name)

    def _relay(self, fn, args, kwargs):
        flat = list(args) + list(kwargs.values())
        idx = [i for i, a in enumerate(flat) if isinstance(a, torch.Tensor) and a.is_floating_point()]
        new = distinct([flat[i] for i in idx])
        for i, t in zip(idx, new):
            flat[i] = t
        return fn(*flat[:len(args)], **dict(zip(kwargs, flat[len(args):])))

    def forward(self, *args, **kwargs):
        return self._relay(self._module.forward, args, kwargs)

    def backward(self, *args, **kwargs):
        return self._relay(self._module.backward, args, kwargs)


@contextlib.contextmanager
def relaid_kernel_calls(op: str, backend: str) -> Iterator[None]:
    """Inside the block, ``backend``'s ``forward`` and ``backward`` of ``op`` receive every floating tensor in a
    :func:`distinct` layout (what the front end hands them: inputs, upstream gradients, saved residuals)."""
    original = registry.kernels

    def kernels(o: str, b: str):
        mod = original(o, b)
        return _Relaying(mod) if (o, b) == (op, backend) else mod

    registry.kernels = kernels
    try:
        yield
    finally:
        registry.kernels = original


def stride_values(tensors: Sequence[torch.Tensor]) -> list[int]:
    """Every stride of a dimension of size > 1, over ``tensors`` (for tests of :func:`distinct`)."""
    return [s for t in tensors for s, n in zip(t.stride(), t.shape) if n > 1]


__all__ = ["distinct", "relaid", "relaid_kernel_calls", "stride_values"]
