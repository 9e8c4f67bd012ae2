"""Ask which backend would run for given inputs, and why each other one cannot."""
from __future__ import annotations

from typing import Any

from . import declaration, registry


def which_backend(op: str, *args: Any, backend: Any = None, **kwargs: Any) -> registry.Resolution:
    """The backends ``op`` would use for these arguments (the op's own signature), and why not the others.

    Example: ``kd.which_backend("lazy_attention", q, k, v, bias, tau, lengths=lens)`` returns a
    :class:`Resolution` whose ``forward``/``backward`` name the backends, ``source`` says where
    the choice came from and ``reasons`` maps every backend to what stops it ([] if nothing).
    Raises like the op would for bad inputs or an impossible explicit choice.
    """
    decl = declaration.operator(op)
    arguments = decl.bind(*args, **kwargs)
    decl.check(arguments)
    return registry.resolve(op, decl.facts(arguments), backend)
