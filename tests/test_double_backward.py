"""Second-order gradients: every backend that declares ``double_backward`` passes gradgradcheck in float64; through any
other backend, create_graph=True raises DoubleBackwardError naming the operator and the backend (never a wrong value,
never autograd's "element 0 of tensors does not require grad"). Generated from the declarations."""
import functools

import pytest
import torch

import kernel_dispatch as kd
from kernel_dispatch import declaration, registry
from kernel_dispatch.testing import matrix

DIFFERENTIABLE = [op for op in declaration.operators() if declaration.operator(op).gradients]


def _small_cases(op):
    return [c for c in declaration.operator(op).cases if not c.gpu_only]


@functools.lru_cache(maxsize=None)
def _numel(op, case) -> int:
    return sum(t.numel() for t in matrix.make_inputs(op, case, torch.float32).tensors.values())


def _function_of_leaves(op, inp):
    """(f, leaves): f(*leaves) calls the operator with the differentiable inputs replaced by ``leaves``."""
    decl = declaration.operator(op)
    names = [k for k in inp.tensors if k in decl.gradients]

    def f(*leaves, backend="golden"):
        tensors = {**inp.tensors, **dict(zip(names, leaves))}
        return decl.function(**tensors, **inp.kwargs, backend=backend)

    return f, [inp.tensors[k].detach().clone().requires_grad_() for k in names]


def _params():
    for op in DIFFERENTIABLE:
        for backend in registry.BACKEND_NAMES:
            if registry.impl(op, backend) is not None:
                yield pytest.param(op, backend, id=f"{op}-{backend}")


@pytest.mark.parametrize("op,backend", list(_params()))
def test_second_order_gradients_are_right_or_refused(op, backend):
    caps = registry.impl(op, backend).caps
    by_size = sorted(_small_cases(op), key=lambda c: _numel(op, c))
    if caps.double_backward:
        # the two smallest declared cases in float64: gradgradcheck compares the double backward with finite
        # differences of the backward
        for case in by_size[:2]:
            inp = matrix.upcast(matrix.make_inputs(op, case, torch.float64))
            reasons = registry.why_not(op, backend, matrix.facts(op, inp))
            if reasons:
                pytest.skip(f"{backend}: " + "; ".join(reasons))
            f, leaves = _function_of_leaves(op, inp)
            assert torch.autograd.gradgradcheck(lambda *a: f(*a, backend=backend), leaves, fast_mode=True), case.name
        return
    # the smallest declared case, in fp32 (or the first dtype the backend takes)
    case = by_size[0]
    inp = matrix.make_inputs(op, case, torch.float32 if torch.float32 in caps.dtypes else caps.dtypes[0])
    reasons = registry.why_not(op, backend, matrix.facts(op, inp))
    if reasons:
        pytest.skip(f"{backend}: " + "; ".join(reasons))
    f, leaves = _function_of_leaves(op, inp)
    outs = f(*leaves, backend=backend)
    outs = outs if isinstance(outs, tuple) else (outs,)
    with pytest.raises(kd.DoubleBackwardError, match=rf"{op}: .*create_graph=True.*'{backend}' backward"):
        torch.autograd.grad(outs, leaves, inp.grads, create_graph=True)
    # without create_graph the same call is an ordinary backward
    outs = f(*leaves, backend=backend)
    outs = outs if isinstance(outs, tuple) else (outs,)
    assert all(g is not None for g in torch.autograd.grad(outs, leaves, inp.grads))


@pytest.mark.parametrize("op", DIFFERENTIABLE)
def test_refusal_names_the_backends_that_can(op, monkeypatch):
    """A backward backend without double_backward (golden's capability switched off here) is refused with the list of
    those that have it; the forward backend does not matter."""
    golden = registry.impl(op, "golden")
    monkeypatch.setitem(registry._impls, (op, "golden"),
                        registry.Impl(op, "golden", type(golden.caps)(double_backward=False), golden.priority,
                                      golden.kernels))
    inp = matrix.make_inputs(op, min(_small_cases(op), key=lambda c: _numel(op, c)), torch.float32)
    f, leaves = _function_of_leaves(op, inp)
    outs = f(*leaves, backend="golden")
    outs = outs if isinstance(outs, tuple) else (outs,)
    with pytest.raises(kd.DoubleBackwardError, match="backends whose backward supports them: none"):
        torch.autograd.grad(outs, leaves, inp.grads, create_graph=True)
