"""Implementations, their capabilities, and the choice of which one runs. Names no operator.

Operators are declared in :mod:`kernel_dispatch.declaration` (by their modules in ``ops/``). A backend
package (``kernel_dispatch/golden``, ``kernel_dispatch/backends/<name>``) declares, without importing any
heavy dependency:

- ``CAPABILITIES``: ``{operator: <the operator's Capabilities subclass>}``, what its kernels support;
- ``PRIORITY``: ``{operator: int}``, its rank in ``auto`` (higher runs first);
- ``unavailable() -> str | None``: why the backend cannot run on this machine at all;
- optionally ``extra_reasons(op, meta) -> list[str]``: conditions the table cannot express.

Its kernels live in ``<package>.<operator>`` with ``forward`` and ``backward`` functions,
imported only when chosen. :func:`register_impl` adds an implementation from anywhere else (an operator
declared outside the package). Anything that stops a backend from running becomes a reason.

Precedence of choices, strongest first: the ``backend=`` argument, :func:`use_backend`, the operator's
environment variable (``LAZYATTN_BACKEND``, ``MHC_BACKEND``), ``KERNEL_BACKEND``, the YAML ``backend:`` key,
auto.
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
import importlib
import logging
import os
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping


from . import config, declaration
from .config import Choice, ConfigError
from .declaration import Capabilities, dtype_name

log = logging.getLogger("kernel_dispatch")

# The one place that names every backend: its package declares CAPABILITIES ({operator: Capabilities}),
# PRIORITY ({operator: int}) and unavailable(), and holds each operator's kernels in <package>.<operator>.
BACKEND_PACKAGES = {
    "golden": "kernel_dispatch.golden",
    "triton": "kernel_dispatch.backends.triton",
    "tilelang": "kernel_dispatch.backends.tilelang",
    "cute": "kernel_dispatch.backends.cute",
}
BACKEND_NAMES = tuple(BACKEND_PACKAGES)


class BackendUnavailableError(RuntimeError):
    """An explicitly chosen backend cannot run these inputs; the message lists every reason."""


class DoubleBackwardError(NotImplementedError):
    """A second-order gradient (create_graph=True) through an operator whose backward backend does not declare
    ``double_backward``; the message names the operator, the backend and the backends that do."""


@dataclass(frozen=True)
class Impl:
    """One operator's implementation in one backend.

    kernels: the module (or its import path) holding ``forward`` and ``backward``.
    """

    op: str
    backend: str
    caps: Capabilities
    priority: int
    kernels: Any

    @property
    def module_name(self) -> str:
        return self.kernels if isinstance(self.kernels, str) else self.kernels.__name__


@dataclass
class Resolution:
    """The outcome of choosing a backend for one call.

    forward/backward: the backend names that run each direction; source: where the choice
    came from; reasons: for every backend, why it cannot run these inputs ([] when it can).
    """

    op: str
    forward: str
    backward: str
    source: str
    reasons: dict[str, list[str]] = field(default_factory=dict)

    def __str__(self) -> str:
        why = "; ".join(f"{b}: {', '.join(r)}" for b, r in self.reasons.items() if r)
        pair = self.forward if self.forward == self.backward else f"{self.forward} fwd / {self.backward} bwd"
        return f"{self.op} -> {pair} (from {self.source})" + (f" [not chosen: {why}]" if why else "")


# ----------------------------------------------------------------------------- backends


_package_cache: dict[str, Any] = {}
_unavailable_cache: dict[str, str | None] = {}
_module_cache: dict[str, Any] = {}
_impls: dict[tuple[str, str], Impl] = {}


def register_impl(op: str, backend: str, caps: Capabilities, priority: int, kernels: Any) -> Impl:
    """Register ``backend``'s implementation of ``op``: its capabilities (an instance of the operator's
    Capabilities class), its rank in ``auto`` (higher runs first) and its kernels (a module or module path
    with ``forward`` and ``backward``). Backend packages register theirs when first loaded."""
    _check_backend(backend)
    expected = declaration.operator(op).capabilities
    if not isinstance(caps, expected):
        raise TypeError(f"caps: expected a {expected.__name__} for {op}, got {type(caps).__name__}")
    entry = _impls[(op, backend)] = Impl(op, backend, caps, priority, kernels)
    _module_cache.pop(entry.module_name, None)
    _resolve_cached.cache_clear()
    return entry


def unregister_impl(op: str, backend: str) -> None:
    """Forget a registered implementation (tests that declare their own operator)."""
    _impls.pop((op, backend), None)
    _resolve_cached.cache_clear()


def _package(backend: str):
    if backend not in _package_cache:
        pkg = _package_cache[backend] = importlib.import_module(BACKEND_PACKAGES[backend])
        for op, caps in pkg.CAPABILITIES.items():
            _impls.setdefault((op, backend), Impl(op, backend, caps, pkg.PRIORITY[op], f"{pkg.__name__}.{op}"))
    return _package_cache[backend]


def _check_backend(backend: str) -> None:
    if backend not in BACKEND_NAMES:
        raise ConfigError(f"unknown backend {backend!r}; valid names are {', '.join(BACKEND_NAMES)}")


def impl(op: str, backend: str) -> Impl | None:
    """The registered implementation of ``op`` in ``backend``, or None when the backend has none."""
    _check_op(op)
    _check_backend(backend)
    _package(backend)
    return _impls.get((op, backend))


def implementations(op: str) -> list[Impl]:
    """Every registered implementation of ``op``, highest auto priority first."""
    found = [i for i in (impl(op, b) for b in BACKEND_NAMES) if i is not None]
    return sorted(found, key=lambda i: -i.priority)


def backend_unavailable(backend: str) -> str | None:
    """Why ``backend`` cannot run on this machine at all (missing package, no GPU), or None."""
    if backend not in _unavailable_cache:
        try:
            _unavailable_cache[backend] = _package(backend).unavailable()
        except Exception as e:  # a broken install is a reason, never a crash
            _unavailable_cache[backend] = f"{type(e).__name__}: {e}"
    return _unavailable_cache[backend]


def kernels(op: str, backend: str):
    """The module holding ``forward`` and ``backward`` of ``op`` in ``backend`` (imported on first use)."""
    entry = impl(op, backend)
    if entry is None:
        raise BackendUnavailableError(f"{op}: backend {backend!r} has no implementation")
    if not isinstance(entry.kernels, str):
        return entry.kernels
    name = entry.kernels
    if name not in _module_cache:
        _module_cache[name] = importlib.import_module(name)
    return _module_cache[name]


def _kernels_missing(op: str, backend: str) -> str | None:
    try:
        mod = kernels(op, backend)
    except ModuleNotFoundError as e:
        if e.name == impl(op, backend).module_name:
            return "kernels not implemented yet"
        return f"import failed: {e}"
    except Exception as e:
        return f"import failed: {type(e).__name__}: {e}"
    if not hasattr(mod, "forward"):
        return "kernels not implemented yet (no forward)"
    if declaration.operator(op).gradients and not hasattr(mod, "backward"):
        return "kernels not implemented yet (no backward)"
    return None


def why_not(op: str, backend: str, meta: Mapping[str, Any]) -> list[str]:
    """Every reason ``backend`` cannot run ``op`` on inputs described by ``meta`` ([] if it can)."""
    entry = impl(op, backend)
    if entry is None:
        return [f"no {backend} implementation of {op}"]
    reasons = []
    unavailable = backend_unavailable(backend)
    if unavailable:
        reasons.append(unavailable)
    reasons += entry.caps.why_not(meta)
    extra = getattr(_package(backend), "extra_reasons", None)
    if extra is not None:
        reasons += extra(op, meta)
    if not reasons:
        missing = _kernels_missing(op, backend)
        if missing:
            reasons.append(missing)
    return reasons


# ----------------------------------------------------------------------------- choices

_context: contextvars.ContextVar[dict[str, Choice]] = contextvars.ContextVar("kernel_dispatch_backend", default={})
_yaml_state: dict[str, Any] = {"choices": {}, "source": None}


@contextlib.contextmanager
def use_backend(backend: Any = None, /, **per_operator: Any) -> Iterator[None]:
    """Choose backends inside a ``with`` block (stronger than environment and YAML).

    ``use_backend("triton")``: every operator; ``use_backend(("triton", "golden"))``: forward
    and backward; ``use_backend(lazy_attention="tilelang", mhc="golden")``: per operator or group
    (the keys of :func:`kernel_dispatch.declaration.groups`: ``mhc`` names both mHC halves).
    Blocks nest; the innermost choice for an operator wins.
    """
    new = dict(_context.get())
    if backend is not None:
        new.update(config.parse_per_operator(backend, "use_backend"))
    if per_operator:
        new.update(config.parse_per_operator(per_operator, "use_backend"))
    token = _context.set(new)
    try:
        yield
    finally:
        _context.reset(token)


def set_yaml_backend(value: Any, source: str = "YAML") -> None:
    """Install the YAML ``backend:`` value (``None`` clears it); ``source`` names the file."""
    if value is None:
        _yaml_state.update(choices={}, source=None)
    else:
        _yaml_state.update(choices=config.parse_per_operator(value, f"{source}: backend"), source=source)
    _resolve_cached.cache_clear()


def load_config(path: str | os.PathLike) -> dict:
    """Read a YAML file, install its ``backend:`` key, and return the whole mapping."""
    data = config.load_yaml(path)
    set_yaml_backend(data.get("backend"), f"YAML {os.fspath(path)}")
    return data


def current_choice(op: str, backend: Any = None) -> tuple[Choice, str]:
    """The (forward, backward) choice for ``op`` before capability checks, and its source."""
    _check_op(op)
    if backend is not None:
        return config.parse_choice(backend, "backend="), "argument"
    ctx = _context.get()
    if op in ctx:
        return ctx[op], "use_backend"
    env = config.env_choice(op)
    if env is not None:
        return env[0], f"environment {env[1]}"
    if op in _yaml_state["choices"]:
        return _yaml_state["choices"][op], _yaml_state["source"]
    return ("auto", "auto"), "auto"


def _pick(op: str, name: str, meta: Mapping[str, Any], reasons: dict, source: str, direction: str) -> str:
    if name != "auto":
        r = reasons.setdefault(name, why_not(op, name, meta))
        if r:
            raise BackendUnavailableError(
                f"{op}: backend {name!r} (from {source}) cannot run the {direction} for these inputs: "
                + "; ".join(f"{name}: {x}" for x in r))
        return name
    device = meta.get("device", "cpu")
    for cand in implementations(op):
        r = reasons.setdefault(cand.backend, why_not(op, cand.backend, meta))
        auto_devices = cand.caps.auto_devices or cand.caps.devices
        if not r and device in auto_devices:
            return cand.backend
        if not r:
            reasons[cand.backend] = [f"auto does not pick it on {device}"]
    raise BackendUnavailableError(f"{op}: no backend can run these inputs: {reasons}")


_logged: set[str] = set()
declaration.on_change(lambda: _resolve_cached.cache_clear())


def _meta_key(meta: Mapping[str, Any]) -> tuple:
    return tuple(sorted(meta.items()))


def resolve(op: str, meta: Mapping[str, Any], backend: Any = None) -> Resolution:
    """Choose the forward and backward backends of ``op`` for inputs described by ``meta``.

    Explicit choices (argument, use_backend, environment, YAML) are strict and raise
    :class:`BackendUnavailableError` listing every reason; ``auto`` takes the first backend
    in priority order that can run (golden always can). Results are cached.
    """
    choice, source = current_choice(op, backend)
    return _resolve_cached(op, _meta_key(meta), choice, source)


@functools.lru_cache(maxsize=4096)
def _resolve_cached(op: str, meta_key: tuple, choice: Choice, source: str) -> Resolution:
    meta = dict(meta_key)
    reasons: dict[str, list[str]] = {}
    fwd = _pick(op, choice[0], meta, reasons, source, "forward")
    bwd = _pick(op, choice[1], meta, reasons, source, "backward")
    for b in BACKEND_NAMES:
        reasons.setdefault(b, why_not(op, b, meta))
    res = Resolution(op, fwd, bwd, source, reasons)
    if op not in _logged:
        _logged.add(op)
        log.info("kernel_dispatch: %s", res)
    return res


def resolved_names(op: str, meta_key: tuple, backend: Any) -> tuple[str, str]:
    """(forward, backward) backend names; a constant to torch.compile (see ops/_frontend.py)."""
    r = resolve(op, dict(meta_key), backend)
    return r.forward, r.backward


def reset() -> None:
    """Forget cached resolutions, availability and the once-per-operator log (for tests)."""
    _resolve_cached.cache_clear()
    _unavailable_cache.clear()
    _logged.clear()


def _check_op(op: str) -> None:
    declaration.operator(op)  # ValueError listing the operators


def support_table() -> list[dict[str, str]]:
    """One row per operator x backend: the declared capabilities, for the README and info."""
    rows = []
    for op in declaration.operators():
        for b in BACKEND_NAMES:
            entry = impl(op, b)
            if entry is None:
                continue
            c = entry.caps
            rows.append({
                "operator": op, "backend": b, "devices": ", ".join(c.devices),
                "dtypes": ", ".join(dtype_name(d) for d in c.dtypes),
                "features": c.features(), "deterministic": "yes" if c.deterministic else "no",
                "double backward": "yes" if c.double_backward else "no",
                "auto priority": str(entry.priority), "notes": c.notes,
            })
    return rows


__all__ = [
    "BackendUnavailableError", "DoubleBackwardError", "Capabilities", "Impl", "Resolution", "implementations", "impl", "why_not",
    "resolve", "use_backend", "set_yaml_backend", "load_config", "current_choice", "support_table", "kernels",
    "reset", "backend_unavailable", "register_impl", "unregister_impl", "BACKEND_NAMES",
]
