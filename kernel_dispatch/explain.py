"""Ask which backend would run for given inputs, and why each other one cannot."""
from __future__ import annotations

import importlib
import inspect
from typing import Any

from . import registry

# The op modules share their names with the functions ops/__init__ re-exports.
_la, _pre, _post = (importlib.import_module(f"kernel_dispatch.ops.{m}") for m in ("lazy_attention", "mhc_pre", "mhc_post"))


def _meta(op: str, args: tuple, kwargs: dict) -> dict:
    if op == "lazy_attention":
        q, k, _v, bias = args[:4]
        return _la.lazy_attention_meta(q, k, bias, kwargs.get("lengths"), kwargs.get("causal", True))
    x = args[0] if op == "mhc_pre" else args[1]
    return {"device": x.device.type, "dtype": x.dtype, "n": x.shape[-2], "D": x.shape[-1]}


def which_backend(op: str, *args: Any, backend: Any = None, **kwargs: Any) -> registry.Resolution:
    """The backends ``op`` would use for these arguments (the op's own signature), and why not the others.

    Example: ``kd.which_backend("lazy_attention", q, k, v, bias, tau, lengths=lens)`` returns a
    :class:`Resolution` whose ``forward``/``backward`` name the backends, ``source`` says where
    the choice came from and ``reasons`` maps every backend to what stops it ([] if nothing).
    Raises like the op would for bad inputs or an impossible explicit choice.
    """
    modules = {"lazy_attention": _la, "mhc_pre": _pre, "mhc_post": _post}
    if op not in modules:
        raise ValueError(f"op: unknown operator {op!r}; operators are {', '.join(modules)}")
    sig = inspect.signature(getattr(modules[op], op)).bind(*args, **kwargs)
    sig.apply_defaults()
    p = sig.arguments
    if op == "lazy_attention":
        _la.validate(p["q"], p["k"], p["v"], p["bias"], p["tau"], p["scale"], p["lengths"], p["causal"])
    elif op == "mhc_pre":
        _pre.validate(p["x"], p["phi"], p["alpha"], p["bias"], p["gamma"], p["sinkhorn_iters"], p["post_mult"],
                      p["norm_eps"], p["pre_eps"], p["sinkhorn_eps"])
    else:
        _post.validate(p["f"], p["x"], p["h_post"], p["h_res"])
    return registry.resolve(op, _meta(op, args, kwargs), backend)
