"""The equivalence matrix's pieces: one call's inputs, the runner that drives any backend through the public
API, the float64 reference, and the comparison against a declared tolerance.

Everything here is read from the operator declarations (:mod:`kernel_dispatch.declaration`); no operator
is named.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from .. import declaration

UNIT_ROUNDOFF = {
    torch.float64: 2.0 ** -53,
    torch.float32: 2.0 ** -24,
    torch.float16: 2.0 ** -11,
    torch.bfloat16: 2.0 ** -8,
}
U_FP32 = 2.0 ** -24
U_TF32 = 2.0 ** -11


@dataclass
class Inputs:
    """Inputs of one call: tensors by parameter name (the leaves), other keyword arguments, and the
    upstream gradients of the outputs (empty for a forward-only operator)."""

    tensors: dict[str, torch.Tensor]
    kwargs: dict = field(default_factory=dict)
    grads: tuple[torch.Tensor, ...] = ()


def replacing(name: str, value) -> "Callable[[Inputs], Inputs]":
    """A function of :class:`Inputs` that returns them with the tensor or keyword argument ``name`` replaced by
    ``value`` (for a tensor, a tensor of ``value`` in the original's dtype and on its device), for
    :class:`kernel_dispatch.declaration.BadValues` examples."""
    def alter(inp: Inputs) -> Inputs:
        tensors, kwargs = dict(inp.tensors), dict(inp.kwargs)
        where = tensors if name in tensors else kwargs
        old = where[name]
        where[name] = (torch.tensor(value, dtype=old.dtype, device=old.device) if isinstance(old, torch.Tensor)
                       else value)
        return Inputs(tensors, kwargs, inp.grads)
    return alter


def tolerance(op: str, dtype: torch.dtype, tensor: str, tf32: bool = False) -> float:
    """The relative-error bound of ``tensor`` of ``op`` computed from ``dtype`` inputs.

    tol = c_round * u(dtype) + c_acc * u(fp32) + c_tf32 * u(tf32) (the last only where the backend declares
    TF32 GEMMs): c_round counts the roundings to the dtype a correct kernel may make (with a factor 2 of
    margin), c_acc bounds fp32 accumulation and exp/log error; the operator declares both per tensor.
    """
    t = declaration.operator(op).tolerances[tensor]
    return t.c_round * UNIT_ROUNDOFF[dtype] + t.c_acc * U_FP32 + (t.c_tf32 * U_TF32 if tf32 else 0.0)


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in float64 (ref == 0 everywhere: the absolute error); inf if out is not finite."""
    out64, ref64 = out.detach().double().cpu(), ref.detach().double().cpu()
    if not torch.isfinite(out64).all():
        return float("inf")
    den = ref64.norm().item()
    num = (out64 - ref64).norm().item()
    return num / den if den > 0 else num


def make_inputs(op: str, case, dtype: torch.dtype, device: str = "cpu", seed: int = 0) -> Inputs:
    """Random inputs of one of ``op``'s declared cases, activations in ``dtype``."""
    return declaration.operator(op).make_inputs(case, dtype, device, seed)


def upcast(inp: Inputs) -> Inputs:
    """The same values in float64 (the golden reference's inputs); integer tensors stay as they are."""
    def up(t):
        return t.detach().double() if t.is_floating_point() else t
    return Inputs({k: up(v) for k, v in inp.tensors.items()}, inp.kwargs, tuple(g.double() for g in inp.grads))


def facts(op: str, inp: Inputs) -> dict:
    """The selection facts of a call with these inputs (what the registry decides by)."""
    decl = declaration.operator(op)
    return decl.facts(decl.bind(**inp.tensors, **inp.kwargs))


def run(op: str, inp: Inputs, backend, backward: bool = True) -> dict[str, torch.Tensor]:
    """Call ``op`` through its public function with ``backend``; return outputs and input gradients by name.

    Tensors whose name the declaration lists in ``gradients`` are leaves that require grad (when
    ``backward``), those in ``mutated`` fresh copies; clones keep the caller's strides.
    """
    decl = declaration.operator(op)
    backward = backward and bool(decl.gradients)
    leaves = {k: (v.detach().clone().requires_grad_(backward) if k in decl.gradients
                  else v.clone() if k in decl.mutated else v) for k, v in inp.tensors.items()}
    outs = decl.function(**leaves, **inp.kwargs, backend=backend)
    outs = outs if isinstance(outs, tuple) else (outs,)
    result = {name: o.detach() for name, o in zip(decl.outputs, outs)}
    if backward:
        wrt = {k: v for k, v in leaves.items() if k in decl.gradients}
        grads = torch.autograd.grad(outs, list(wrt.values()), inp.grads)
        for name, gr in zip(wrt, grads):
            result[decl.gradients[name]] = gr
    return result


def check(op: str, got: dict[str, torch.Tensor], ref: dict[str, torch.Tensor], dtype: torch.dtype,
          names, tf32: bool = False) -> list[str]:
    """Failures of ``got`` against the float64 reference ``ref``: every tensor of ``names`` whole, and head by
    head for the tensors the declaration lists in ``per_head`` (a kernel right for head 0 only fails)."""
    decl = declaration.operator(op)
    failures = []
    for name in names:
        tol = tolerance(op, dtype, name, tf32)
        if got[name].shape != ref[name].shape:
            failures.append(f"{name}: shape {tuple(got[name].shape)} != {tuple(ref[name].shape)}")
            continue
        err = rel_err(got[name], ref[name])
        if err > tol:
            failures.append(f"{name}: rel err {err:.3e} > tol {tol:.3e}")
        dim = decl.per_head.get(name)
        if dim is not None:
            for h in range(got[name].shape[dim]):
                eh = rel_err(got[name].select(dim, h), ref[name].select(dim, h))
                if eh > tol:
                    failures.append(f"{name} head {h}: rel err {eh:.3e} > tol {tol:.3e}")
    return failures


def why_not(op: str, backend: str, inp: Inputs) -> str | None:
    """Why ``backend`` cannot run ``op`` on ``inp`` here ("backend: reason; reason"), or None."""
    from .. import registry

    reasons = registry.why_not(op, backend, facts(op, inp))
    return f"{backend}: " + "; ".join(reasons) if reasons else None


def check_backend(op: str, backend: str, got: dict[str, torch.Tensor], ref: dict[str, torch.Tensor],
                  dtype: torch.dtype, names=None) -> list[str]:
    """:func:`check` of ``backend``'s results with its own tolerance class (TF32 where its capabilities say so);
    ``names`` default to every tensor of ``ref``."""
    from .. import registry

    return check(op, got, ref, dtype, list(ref) if names is None else names, registry.impl(op, backend).caps.tf32)


def poison_cuda_cache(nbytes: int = 1 << 30) -> None:
    """Leave 0xFF bytes (NaN in every float dtype) in the free blocks of torch's CUDA caching allocator, one
    large block and many small ones, so an output element a kernel never writes reads back as NaN whenever
    its buffer comes from those blocks."""
    big = torch.full((nbytes,), 0xFF, dtype=torch.uint8, device="cuda")
    small = [torch.full((1 << 19,), 0xFF, dtype=torch.uint8, device="cuda") for _ in range(64)]
    del big, small
