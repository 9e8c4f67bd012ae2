"""What an operator declares once, and the table of declared operators.

An operator's module in ``kernel_dispatch/ops/`` builds one :class:`Operator` and hands it to
:func:`declare`. Everything generic reads that declaration instead of naming the operator: the
registry (capabilities, reasons, auto order), the front end (validation and selection facts),
:func:`kernel_dispatch.which_backend`, ``python -m kernel_dispatch.info`` and the README support table,
the YAML / environment / ``use_backend`` keys, the equivalence matrix and ``kernel_dispatch.bench``.
Implementations are registered per backend (see :mod:`kernel_dispatch.registry`).
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import torch

ALL_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def dtype_name(dt: torch.dtype) -> str:
    return str(dt).replace("torch.", "")


def _listed(values: Sequence) -> str:
    return "{" + ", ".join(map(str, values)) + "}"


@dataclass(frozen=True)
class Capabilities:
    """What one implementation of one operator supports; an operator subclasses it with its own fields.

    devices: device types it runs on; auto_devices: where ``auto`` may pick it (None: ``devices``).
    deterministic: gradients are fixed-order reductions (bitwise reproducible).
    tf32: its fp32 GEMMs round their inputs to TF32 (the tolerance of the matrix then says so).
    double_backward: its backward's gradients are differentiable (second-order gradients, create_graph=True);
        where False, create_graph=True through the operator raises :class:`kernel_dispatch.DoubleBackwardError`.
    """

    devices: tuple[str, ...] = ("cpu", "cuda")
    auto_devices: tuple[str, ...] | None = None
    dtypes: tuple[torch.dtype, ...] = ALL_DTYPES
    deterministic: bool = True
    tf32: bool = False
    double_backward: bool = False
    notes: str = ""

    def why_not(self, meta: Mapping[str, Any]) -> list[str]:
        """Reasons these capabilities do not cover the call described by ``meta`` ([] when they do)."""
        r = []
        dev = meta.get("device")
        if dev is not None and dev not in self.devices:
            r.append(f"device {dev} not in {_listed(self.devices)}")
        dt = meta.get("dtype")
        if dt is not None and dt not in self.dtypes:
            r.append(f"dtype {dtype_name(dt)} not in {_listed(map(dtype_name, self.dtypes))}")
        return r + self.operator_reasons(meta)

    def operator_reasons(self, meta: Mapping[str, Any]) -> list[str]:
        """The operator's own reasons (its subclass's fields against ``meta``)."""
        return []

    def features(self) -> str:
        """The operator's own fields in a few words, for the support table."""
        return ""


@dataclass(frozen=True)
class Fact:
    """A selection fact that ``python -m kernel_dispatch.info`` sets from its command line.

    key: the meta key; flag: the option (``--head-dim``); default: its value when the flag is absent;
    a bool default makes a switch, and ``invert`` stores ``not switch`` (``--non-causal`` -> causal).
    """

    key: str
    flag: str
    default: Any
    help: str = ""
    invert: bool = False


@dataclass(frozen=True)
class Tolerance:
    """A relative-error bound derived from rounding (see :mod:`kernel_dispatch.testing.compare`)."""

    c_round: float
    c_acc: float
    c_tf32: float = 0.0


@dataclass(frozen=True)
class RangeCheck:
    """A check of tensor values: every element of ``values`` lies in [low, high] (None: unbounded).

    argument: the argument an error names; expected: the rule in words (``every value in [1, L] = [1, 6]``);
    values: a tensor computed from the call's tensors, on their device (building the check reads nothing).
    :func:`kernel_dispatch.ops._frontend.check_values` evaluates it: on the host in plain eager mode, inside the
    traced graph under torch.compile and CUDA-graph capture.
    """

    argument: str
    values: Any
    low: Any = None
    high: Any = None
    expected: str = ""


@dataclass(frozen=True)
class BadValues:
    """A test example of values a :class:`RangeCheck` refuses: ``alter(inputs)`` returns the declared ``case``'s
    inputs (:class:`kernel_dispatch.testing.matrix.Inputs`) with offending values; the eager error is a ValueError
    whose message contains every string of ``words`` (the argument's name first)."""

    name: str
    case: str
    alter: Callable
    words: tuple[str, ...]


@dataclass(frozen=True)
class Operator:
    """One operator, declared once.

    name: the operator's name (``torch.ops.kernel_dispatch.<name>_fwd`` / ``_bwd``, YAML key).
    function: the public function; its signature is how arguments are read.
    capabilities: the operator's :class:`Capabilities` subclass.
    selection_facts: (bound arguments of ``function``) -> meta, the facts backends are chosen by.
    validate: (bound arguments) -> None, raising an error that names the argument.
    outputs: names of the forward outputs, in order.
    gradients: input name -> gradient name, for every differentiable input (empty: forward only).
    mutated: inputs the operator writes in place (the matrix gives each call its own copy).
    env_var: the environment variable for this operator (``KERNEL_BACKEND`` applies to every one).
    group: a YAML / ``use_backend`` key naming every operator of the group (``mhc``).
    info_facts: the facts ``kernel_dispatch.info`` exposes as options.
    per_head: tensors the matrix also checks head by head: name -> the dimension of heads.
    tolerances: tensor name (outputs and gradients) -> :class:`Tolerance`.
    cases: test cases (objects with ``name`` and ``gpu_only``: realistic sizes run on a CUDA device only); make_inputs(case, dtype, device, seed) ->
        :class:`kernel_dispatch.testing.matrix.Inputs`.
    bench: its bench module, as an import path or the module object (the protocol is in
        :mod:`kernel_dispatch.benchmarks.common`; operators benchmarked as one block share one), or None.
    value_checks: (bound arguments) -> the call's :class:`RangeCheck` s (checks of tensor values), or None.
    bad_values: :class:`BadValues` examples, one per way a value check can fail.
    """

    name: str
    function: Callable
    capabilities: type[Capabilities]
    selection_facts: Callable[..., dict]
    validate: Callable[..., None]
    outputs: tuple[str, ...]
    gradients: Mapping[str, str] = field(default_factory=dict)
    mutated: tuple[str, ...] = ()
    env_var: str | None = None
    group: str | None = None
    info_facts: tuple[Fact, ...] = ()
    per_head: Mapping[str, int] = field(default_factory=dict)
    tolerances: Mapping[str, Tolerance] = field(default_factory=dict)
    cases: tuple = ()
    make_inputs: Callable | None = None
    bench: Any = None
    value_checks: Callable[..., Sequence[RangeCheck]] | None = None
    bad_values: tuple[BadValues, ...] = ()

    def bind(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """The arguments of a call of ``function`` by parameter name, defaults applied."""
        bound = inspect.signature(self.function).bind(*args, **kwargs)
        bound.apply_defaults()
        return dict(bound.arguments)

    def facts(self, arguments: Mapping[str, Any]) -> dict:
        """The selection facts of a call, from its bound arguments."""
        return _call_with(self.selection_facts, arguments)

    def check(self, arguments: Mapping[str, Any]) -> None:
        """Validate a call from its bound arguments."""
        _call_with(self.validate, arguments)

    def range_checks(self, arguments: Mapping[str, Any]) -> Sequence[RangeCheck]:
        """The value checks of a call, from its bound arguments (none when the operator declares none)."""
        return () if self.value_checks is None else tuple(_call_with(self.value_checks, arguments))


def _call_with(fn: Callable, arguments: Mapping[str, Any]):
    params = inspect.signature(fn).parameters
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return fn(**arguments)
    return fn(**{k: v for k, v in arguments.items() if k in params})


_OPERATORS: dict[str, Operator] = {}
_listeners: list[Callable[[], None]] = []


def declare(op: Operator) -> Operator:
    """Add ``op`` to the table (a second declaration of the same name replaces the first)."""
    _OPERATORS[op.name] = op
    for fn in _listeners:
        fn()
    return op


def undeclare(name: str) -> None:
    """Remove an operator (tests that declare their own)."""
    _OPERATORS.pop(name, None)
    for fn in _listeners:
        fn()


def on_change(fn: Callable[[], None]) -> None:
    """Call ``fn`` whenever the table changes (caches that depend on it)."""
    _listeners.append(fn)


def operators() -> tuple[str, ...]:
    """Names of every declared operator, in declaration order."""
    return tuple(_OPERATORS)


def operator(name: str) -> Operator:
    """The declaration of ``name``; ValueError listing the operators when there is none."""
    try:
        return _OPERATORS[name]
    except KeyError:
        raise ValueError(f"op: unknown operator {name!r}; operators are {', '.join(_OPERATORS)}") from None


def groups() -> dict[str, tuple[str, ...]]:
    """Every key that names operators where a choice is given per operator, broadest first.

    ``default`` (every operator), each group, then each operator by name. A group and an operator
    of the same name (``lazy_attention``) are one key: the group.
    """
    out: dict[str, tuple[str, ...]] = {"default": operators()}
    for op in _OPERATORS.values():
        if op.group:
            out[op.group] = out.get(op.group, ()) + (op.name,)
    for name in _OPERATORS:
        out.setdefault(name, (name,))
    return out


def env_vars() -> tuple[tuple[str, tuple[str, ...]], ...]:
    """Environment variables, strongest first, and the operators each one governs."""
    per: dict[str, tuple[str, ...]] = {}
    for op in _OPERATORS.values():
        if op.env_var:
            per[op.env_var] = per.get(op.env_var, ()) + (op.name,)
    return tuple(per.items()) + (("KERNEL_BACKEND", operators()),)
