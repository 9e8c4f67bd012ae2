"""Implementations, their capabilities, and the choice of which one runs.

Every operator has one implementation per backend (golden, triton, tilelang), registered
from the start. A backend package (``kernel_dispatch/golden``, ``kernel_dispatch/backends/<name>``)
declares, without importing any heavy dependency:

- ``CAPABILITIES``: ``{operator: Capabilities}``, what its kernels support, as data;
- ``PRIORITY``: ``{operator: int}``, its rank in ``auto`` (higher runs first);
- ``unavailable() -> str | None``: why the backend cannot run on this machine at all;
- optionally ``extra_reasons(op, meta) -> list[str]``: conditions the table cannot express.

Its kernels live in ``<package>.<operator>`` with ``forward`` and ``backward`` functions,
imported only when chosen. Anything that stops a backend from running becomes a reason.

Precedence of choices, strongest first: the ``backend=`` argument, :func:`use_backend`,
``LAZYATTN_BACKEND`` / ``MHC_BACKEND``, ``KERNEL_BACKEND``, the YAML ``backend:`` key, auto.
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

import torch

from . import config
from .config import BACKEND_NAMES, OPERATORS, Choice, ConfigError

log = logging.getLogger("kernel_dispatch")

BACKEND_PACKAGES = {
    "golden": "kernel_dispatch.golden",
    "triton": "kernel_dispatch.backends.triton",
    "tilelang": "kernel_dispatch.backends.tilelang",
}


class BackendUnavailableError(RuntimeError):
    """An explicitly chosen backend cannot run these inputs; the message lists every reason."""


@dataclass(frozen=True)
class Capabilities:
    """What one implementation of one operator supports. ``None`` means any value.

    devices: device types it runs on; auto_devices: where ``auto`` may pick it.
    head_dims / max_bias_length: lazy attention limits. n_streams / d_multiple / max_d: mHC limits.
    gqa, lengths, non_causal: lazy attention features. deterministic: parameter gradients
    are fixed-order reductions (bitwise reproducible).
    """

    devices: tuple[str, ...] = ("cpu", "cuda")
    auto_devices: tuple[str, ...] | None = None
    dtypes: tuple[torch.dtype, ...] = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
    head_dims: tuple[int, ...] | None = None
    max_bias_length: int | None = None
    n_streams: tuple[int, ...] | None = None
    d_multiple: int = 1
    max_d: int | None = None
    gqa: bool = True
    lengths: bool = True
    non_causal: bool = True
    deterministic: bool = True
    notes: str = ""

    def why_not(self, meta: Mapping[str, Any]) -> list[str]:
        """Reasons these capabilities do not cover ``meta`` (empty when they do)."""
        r = []
        dev = meta.get("device")
        if dev is not None and dev not in self.devices:
            r.append(f"device {dev} not in {{{', '.join(self.devices)}}}")
        dt = meta.get("dtype")
        if dt is not None and dt not in self.dtypes:
            r.append(f"dtype {_dtype_name(dt)} not in {{{', '.join(map(_dtype_name, self.dtypes))}}}")
        hd = meta.get("head_dim")
        if hd is not None and self.head_dims is not None and hd not in self.head_dims:
            r.append(f"head_dim {hd} not in {{{', '.join(map(str, self.head_dims))}}}")
        w = meta.get("bias_length")
        if w is not None and self.max_bias_length is not None and w > self.max_bias_length:
            r.append(f"bias length {w} > {self.max_bias_length}")
        if meta.get("gqa") and not self.gqa:
            r.append("grouped-query attention (H != Hkv) not supported")
        if meta.get("lengths") and not self.lengths:
            r.append("lengths (padding) not supported")
        if meta.get("causal") is False and not self.non_causal:
            r.append("causal=False not supported")
        n = meta.get("n")
        if n is not None and self.n_streams is not None and n not in self.n_streams:
            r.append(f"n {n} not in {{{', '.join(map(str, self.n_streams))}}}")
        d = meta.get("D")
        if d is not None and d % self.d_multiple:
            r.append(f"D {d} is not a multiple of {self.d_multiple}")
        if d is not None and self.max_d is not None and d > self.max_d:
            r.append(f"D {d} > {self.max_d}")
        return r


def _dtype_name(dt: torch.dtype) -> str:
    return str(dt).replace("torch.", "")


@dataclass(frozen=True)
class Impl:
    """One operator's implementation in one backend."""

    op: str
    backend: str
    caps: Capabilities
    priority: int

    @property
    def module_name(self) -> str:
        return f"{BACKEND_PACKAGES[self.backend]}.{self.op}"


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


def _package(backend: str):
    if backend not in _package_cache:
        _package_cache[backend] = importlib.import_module(BACKEND_PACKAGES[backend])
    return _package_cache[backend]


def impl(op: str, backend: str) -> Impl:
    """The registered implementation of ``op`` in ``backend``."""
    _check_op(op)
    if backend not in BACKEND_NAMES:
        raise ConfigError(f"unknown backend {backend!r}; valid names are {', '.join(BACKEND_NAMES)}")
    pkg = _package(backend)
    return Impl(op, backend, pkg.CAPABILITIES[op], pkg.PRIORITY[op])


def implementations(op: str) -> list[Impl]:
    """Every registered implementation of ``op``, highest auto priority first."""
    return sorted((impl(op, b) for b in BACKEND_NAMES), key=lambda i: -i.priority)


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
    name = impl(op, backend).module_name
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
    if not (hasattr(mod, "forward") and hasattr(mod, "backward")):
        return "kernels not implemented yet (no forward/backward)"
    return None


def why_not(op: str, backend: str, meta: Mapping[str, Any]) -> list[str]:
    """Every reason ``backend`` cannot run ``op`` on inputs described by ``meta`` ([] if it can)."""
    reasons = []
    unavailable = backend_unavailable(backend)
    if unavailable:
        reasons.append(unavailable)
    reasons += impl(op, backend).caps.why_not(meta)
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
    and backward; ``use_backend(lazy_attention="tilelang", mhc="golden")``: per operator
    (``mhc`` names both mHC halves). Blocks nest; the innermost choice for an operator wins.
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
    if op not in OPERATORS:
        raise ValueError(f"unknown operator {op!r}; operators are {', '.join(OPERATORS)}")


def support_table() -> list[dict[str, str]]:
    """One row per operator x backend: the declared capabilities, for the README and info."""
    rows = []
    for op in OPERATORS:
        for b in BACKEND_NAMES:
            c = impl(op, b).caps
            feats = []
            if op == "lazy_attention":
                feats.append(f"head_dim {'any' if c.head_dims is None else '/'.join(map(str, c.head_dims))}")
                feats += [f for f, ok in (("GQA", c.gqa), ("lengths", c.lengths), ("causal=False", c.non_causal)) if ok]
            else:
                feats.append(f"n {'any' if c.n_streams is None else '/'.join(map(str, c.n_streams))}")
                feats.append("D any" if c.d_multiple == 1 else f"D % {c.d_multiple} == 0")
            rows.append({
                "operator": op, "backend": b, "devices": ", ".join(c.devices),
                "dtypes": ", ".join(_dtype_name(d) for d in c.dtypes),
                "features": ", ".join(feats), "deterministic": "yes" if c.deterministic else "no",
                "auto priority": str(impl(op, b).priority), "notes": c.notes,
            })
    return rows


__all__ = [
    "BackendUnavailableError", "Capabilities", "Impl", "Resolution", "implementations", "impl", "why_not",
    "resolve", "use_backend", "set_yaml_backend", "load_config", "current_choice", "support_table", "kernels",
    "reset", "backend_unavailable",
]
