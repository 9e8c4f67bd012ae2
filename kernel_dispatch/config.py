"""Backend choices from the environment and from YAML, and strict YAML/dataclass loading.

A *choice* is a pair ``(forward, backward)`` of backend names, each one of
:data:`BACKEND_NAMES` or ``"auto"``. Users write a choice as

- one name: ``"triton"`` (both directions),
- a pair: ``("triton", "golden")``, ``"triton,golden"`` in an environment variable,
  ``{"forward": "triton", "backward": "golden"}`` in YAML.

A YAML ``backend:`` value is a choice for every operator, or a mapping from a key to a choice: an
operator's name, a group of operators (``mhc``: both mHC halves) or ``default``; the keys and the
environment variables come from the operator declarations (:mod:`kernel_dispatch.declaration`).
Unknown names are errors when read, listing the valid names.
"""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any, Mapping

from . import declaration

Choice = tuple[str, str]


class ConfigError(ValueError):
    """A configuration value (environment, YAML or argument) that cannot be used."""


def choice_names() -> tuple[str, ...]:
    """Every registered backend name, then ``auto``."""
    from .registry import BACKEND_NAMES  # the registry imports this module

    return BACKEND_NAMES + ("auto",)


def parse_choice(value: Any, where: str) -> Choice:
    """Turn one user-written choice into ``(forward, backward)``.

    Accepts a name, a ``"fwd,bwd"`` string, a 2-sequence of names or a mapping with keys
    ``forward`` and ``backward``. ``where`` names the source in error messages.
    """
    if isinstance(value, str):
        parts = [p.strip() for p in value.split(",")] if "," in value else [value.strip()] * 2
    elif isinstance(value, Mapping):
        unknown = set(value) - {"forward", "backward"}
        if unknown:
            raise ConfigError(f"{where}: unknown key(s) {sorted(unknown)}; expected 'forward' and/or 'backward'")
        parts = [value.get("forward", "auto"), value.get("backward", "auto")]
    elif isinstance(value, (tuple, list)) and len(value) == 2:
        parts = list(value)
    else:
        raise ConfigError(
            f"{where}: expected a backend name, a (forward, backward) pair or a mapping, got {value!r}")
    if len(parts) != 2:
        raise ConfigError(f"{where}: expected 'forward,backward', got {value!r}")
    valid = choice_names()
    for p in parts:
        if not isinstance(p, str) or p not in valid:
            raise ConfigError(f"{where}: unknown backend {p!r}; valid names are {', '.join(valid)}")
    return parts[0], parts[1]


def parse_per_operator(value: Any, where: str) -> dict[str, Choice]:
    """Parse a choice for every operator or a per-operator mapping into {operator: choice}."""
    if isinstance(value, Mapping) and not (set(value) <= {"forward", "backward"}):
        keys = declaration.groups()
        unknown = set(value) - set(keys)
        if unknown:
            raise ConfigError(f"{where}: unknown operator key(s) {sorted(unknown)}; valid keys are {', '.join(keys)}")
        out: dict[str, Choice] = {}
        for key, ops in keys.items():  # broad keys first, so a narrower one overrides them
            if key in value:
                choice = parse_choice(value[key], f"{where}.{key}")
                out.update({op: choice for op in ops})
        return out
    choice = parse_choice(value, where)
    return {op: choice for op in declaration.operators()}


def env_choice(op: str, environ: Mapping[str, str] | None = None) -> tuple[Choice, str] | None:
    """The environment's choice for ``op`` and the variable it came from, or None."""
    environ = os.environ if environ is None else environ
    for var, ops in declaration.env_vars():
        raw = environ.get(var)
        if raw and op in ops:
            return parse_choice(raw, f"environment variable {var}"), var
    return None


def check_environment(environ: Mapping[str, str] | None = None) -> None:
    """Raise ConfigError if any backend environment variable holds an unknown name."""
    environ = os.environ if environ is None else environ
    for var, _ in declaration.env_vars():
        if environ.get(var):
            parse_choice(environ[var], f"environment variable {var}")


def load_yaml(path: str | os.PathLike) -> dict:
    """Read a YAML mapping from ``path``; an empty file is an empty mapping.

    A missing or unreadable file and malformed YAML raise ConfigError naming the file (and, for
    malformed YAML, the line and column: ``configs/x.yaml:3:7: malformed YAML: ...``).
    """
    import yaml

    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{os.fspath(path)}: no such file") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{os.fspath(path)}: not a UTF-8 text file (byte {e.start})") from None
    except OSError as e:
        raise ConfigError(f"{os.fspath(path)}: cannot read it: {e.strerror or e}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f"{os.fspath(path)}:{mark.line + 1}:{mark.column + 1}" if mark else os.fspath(path)
        context = e.context or ""
        if context and e.context_mark and mark is not e.context_mark and e.context_mark.line != mark.line:
            context += f" started at line {e.context_mark.line + 1}"
        what = "; ".join(x for x in (context, e.problem) if x)
        raise ConfigError(f"{where}: malformed YAML: {what}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{os.fspath(path)}: malformed YAML: {' '.join(str(e).split())}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{os.fspath(path)}: expected a mapping at the top level, got {type(data).__name__}")
    return data


def dataclass_from_dict(cls, values: Mapping[str, Any], where: str):
    """Build dataclass ``cls`` from ``values``, rejecting keys it does not have.

    Nested dataclass fields take nested mappings. Values are converted to the field's
    declared scalar type (int, float, bool, str) when that type is one of those.
    """
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = set(values) - set(fields)
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {sorted(unknown)}; valid keys are {', '.join(fields)}")
    kwargs = {}
    for name, raw in values.items():
        ftype = fields[name].type if not isinstance(fields[name].type, str) else eval(fields[name].type)  # noqa: S307
        if dataclasses.is_dataclass(ftype):
            if not isinstance(raw, Mapping):
                raise ConfigError(f"{where}.{name}: expected a mapping, got {raw!r}")
            kwargs[name] = dataclass_from_dict(ftype, raw, f"{where}.{name}")
        elif ftype in (int, float, str) and raw is not None:
            try:
                kwargs[name] = ftype(raw)
            except (TypeError, ValueError) as e:
                raise ConfigError(f"{where}.{name}: expected {ftype.__name__}, got {raw!r}") from e
        elif ftype is bool and not isinstance(raw, bool):
            raise ConfigError(f"{where}.{name}: expected true or false, got {raw!r}")
        else:
            kwargs[name] = raw
    return cls(**kwargs)
