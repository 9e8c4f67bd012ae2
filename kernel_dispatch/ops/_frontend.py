"""Shared pieces of the operator front ends: input checks and backend resolution.

Resolution reads the environment, context variables and caches, which torch.compile cannot
trace; :func:`backend_pair` is therefore a constant to Dynamo (computed once while tracing,
baked into the graph) and the chosen names flow into the custom ops as strings.

The autograd nodes reach the kernels through :func:`call_op`: the custom op while anything
traces (torch.compile, fake tensors, functionalization, tensor subclasses), the same Python
implementation directly in plain eager mode, where the dispatcher's wrapper (its autograd and
aliasing checks) cost 60-200 us of host time per call on an H100 host. Their backward goes through
:func:`call_backward`, which decides whether a second-order gradient may pass.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import torch

from .. import registry
from . import _device_assert
from ..declaration import RangeCheck

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
PARAM_DTYPES = (torch.float32, torch.float64)


@torch._dynamo.assume_constant_result
def _pair(op: str, meta_key: tuple, backend: Any) -> tuple[str, str]:
    return registry.resolved_names(op, meta_key, backend)


def backend_pair(op: str, meta: dict, backend: Any) -> tuple[str, str]:
    """(forward, backward) backend names for ``op`` on inputs described by ``meta``."""
    if isinstance(backend, list):
        backend = tuple(backend)
    return _pair(op, tuple(sorted(meta.items())), backend)


_PLAIN = (torch.Tensor, torch.nn.Parameter)


def call_op(op: Callable, impl: Callable, *args: Any) -> Any:
    """``impl(*args)`` in plain eager mode, else the custom op ``op(*args)`` that wraps ``impl``.

    Plain eager: not compiling, no TorchDispatchMode active, every tensor argument a plain tensor or
    Parameter off the meta device. Both paths run the same implementation on the same arguments.
    """
    if torch.compiler.is_compiling() or torch._C._len_torch_dispatch_stack():
        return op(*args)
    for a in args:
        if isinstance(a, torch.Tensor) and (type(a) not in _PLAIN or a.device.type == "meta"):
            return op(*args)
    return impl(*args)


def call_backward(op: str, backend: str, custom: Callable, impl: Callable, *args: Any) -> Any:
    """The backward of ``op`` on ``backend``, called from an autograd node's ``backward``.

    With create_graph=True autograd runs ``backward`` in grad mode, and the gradients it returns must then be
    differentiable. A backend that declares ``double_backward`` runs ``impl`` directly, so that autograd records
    its torch operations; any other raises :class:`~kernel_dispatch.registry.DoubleBackwardError` (a kernel's
    outputs carry no graph, and a golden backward that reads forward residuals as constants would be wrong).
    Without create_graph this is :func:`call_op`.
    """
    if torch.is_grad_enabled():
        if not registry.impl(op, backend).caps.double_backward:
            able = [i.backend for i in registry.implementations(op) if i.caps.double_backward]
            raise registry.DoubleBackwardError(
                f"{op}: second-order gradients (create_graph=True) are not supported by the {backend!r} backward; "
                f"backends whose backward supports them: {', '.join(able) or 'none'}")
        return impl(*args)
    return call_op(custom, impl, *args)


def _host_read(t: torch.Tensor) -> bool:
    """Whether a check may read ``t`` on the host: a plain CPU tensor of a plain eager call (nothing to wait for)."""
    if torch.compiler.is_compiling() or torch._C._len_torch_dispatch_stack():
        return False
    return type(t) in _PLAIN and t.device.type == "cpu"


_READ_WHOLE = 4096  # value tensors up to this many elements are copied whole to the host, larger ones reduced first


def check_values(checks: Sequence[RangeCheck]) -> None:
    """Evaluate data-dependent checks (see :class:`~kernel_dispatch.declaration.RangeCheck`) on every call.

    CPU tensors in plain eager mode: the values are read on the host and a violation is a ValueError naming the
    argument and the values found. Anywhere else (CUDA tensors, torch.compile, CUDA-graph capture, fake tensors)
    nothing is read: the condition runs on the device as ``torch._assert_async``, inside the traced graph or the
    captured one, so it also holds for values written after tracing or capture, through ``.data`` included. A
    violation there is a RuntimeError with the same message on CPU, and on CUDA a device-side assert that
    prints it (the CUDA context is then unusable, as after any device-side assert). Cost on CUDA: one small
    kernel per check (:mod:`._device_assert`; a few one-element kernels under torch.compile, fused there), no
    synchronisation.
    """
    for c in checks:
        if c.values.numel() == 0:
            continue
        if _host_read(c.values):
            if c.values.numel() <= _READ_WHOLE:
                values = c.values.flatten().tolist()
                lo, hi = min(values), max(values)
            else:
                lo, hi = torch.stack(torch.aminmax(c.values)).tolist()
            if (c.low is not None and lo < c.low) or (c.high is not None and hi > c.high):
                raise ValueError(f"{c.argument}: expected {c.expected}, got min {lo}, max {hi}")
            continue
        if _device_assert.available(c.values):
            _device_assert.assert_in_range(c.values, c.low, c.high, f"{c.argument}: expected {c.expected}")
            continue
        lo, hi = torch.aminmax(c.values)
        ok = torch.ones((), dtype=torch.bool, device=c.values.device)
        if c.low is not None:
            ok = ok & (lo >= c.low)
        if c.high is not None:
            ok = ok & (hi <= c.high)
        torch._assert_async(ok, f"{c.argument}: expected {c.expected}")


def fmt_shape(t: torch.Tensor) -> str:
    return "[" + ", ".join(str(s) for s in t.shape) + "]"


def check_tensor(name: str, t: Any, *, dtypes: Sequence[torch.dtype] = FLOAT_DTYPES, ndim: int | None = None,
                 min_ndim: int | None = None) -> None:
    """TypeError/ValueError naming ``name`` if ``t`` is not a tensor of the given dtypes and rank."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        raise TypeError(f"{name}: expected dtype in {{{', '.join(str(d).replace('torch.', '') for d in dtypes)}}}, "
                        f"got {str(t.dtype).replace('torch.', '')}")
    if ndim is not None and t.dim() != ndim:
        raise ValueError(f"{name}: expected a {ndim}-D tensor, got shape {fmt_shape(t)}")
    if min_ndim is not None and t.dim() < min_ndim:
        raise ValueError(f"{name}: expected at least {min_ndim} dims, got shape {fmt_shape(t)}")


def check_shape(name: str, t: torch.Tensor, expected: Sequence[int], described: str) -> None:
    """ValueError naming ``name`` unless ``t.shape == expected``; ``described`` spells the symbols."""
    if tuple(t.shape) != tuple(expected):
        raise ValueError(f"{name}: expected shape {described} = [{', '.join(map(str, expected))}], "
                         f"got {fmt_shape(t)}")


def check_same_device(**tensors: torch.Tensor | None) -> None:
    """ValueError naming the first tensor whose device differs from the first one's."""
    items = [(n, t) for n, t in tensors.items() if t is not None]
    first_name, first = items[0]
    for n, t in items[1:]:
        if t.device != first.device:
            raise ValueError(f"{n}: expected device {first.device} (the device of {first_name}), got {t.device}")


def check_positive_int(name: str, value: Any, minimum: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name}: expected an int >= {minimum}, got {value!r}")


def check_float(name: str, value: Any, *, minimum: float | None = None, strict: bool = False) -> None:
    """TypeError unless ``value`` is a Python number; ValueError naming ``name`` unless it is finite (and
    ``>= minimum``, or ``> minimum`` when ``strict``)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name}: expected a float, got {type(value).__name__}")
    bound = "" if minimum is None else f" {'>' if strict else '>='} {minimum}"
    if not math.isfinite(value) or (minimum is not None and (value <= minimum if strict else value < minimum)):
        raise ValueError(f"{name}: expected a finite float{bound}, got {value!r}")
