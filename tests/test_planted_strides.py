"""The layout tests catch the bug this field is known for: a launcher handing a kernel one tensor's stride for another's
(the public lazy-attention kernel read dO with q's head stride, and trained head 0 only).

Each plant replaces, in the argument list of one Triton kernel launch, a stride of one tensor by the same dimension's
stride of another tensor of that kernel (``stride_doh`` <- ``stride_qh``: the known bug). The operator then runs as in
tests/test_layouts.py (inputs, upstream gradients and everything the backend receives in distinct strides) and must
fail the comparison with golden float64. Plants are generated from the kernels' argument names, for every kernel a
Triton launcher of a declared operator imports; the quick suite plants the known bug and one stride per kernel, the
slow suite every stride. TileLang's launchers make their inputs contiguous instead of passing strides: the planted
bug there is a launcher that forgets to (a gpu test).
"""
from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass

import pytest
import torch

from kernel_dispatch import declaration, registry
from kernel_dispatch.testing import layouts, matrix

from .test_layouts import dtype_for, layout_case, run_relaid

STRIDE_NAMES = (re.compile(r"^stride_([a-z]+)([bhmndw])$"), re.compile(r"^s([a-z])([tiod])$"))
KNOWN_BUG = ("lazy_attention_bwd_dkdv_kernel", "stride_doh", "stride_qh")
# (kernel, tensor) whose values cannot change a result, so that no test of values sees a wrong stride of theirs
INSENSITIVE = {
    ("lazy_attention_bwd_dq_kernel", "o"): "O only sets D0 = dO . O, the row constant the far sweep subtracts and adds "
                                           "back: dQ does not depend on it (its rounding does)",
}


@dataclass(frozen=True)
class Plant:
    op: str
    kernel: str
    target: str  # the stride argument replaced
    source: str  # by the value of this one

    @property
    def id(self) -> str:
        return f"{self.op}-{self.kernel}-{self.target}<-{self.source}"


def stride_groups(arg_names) -> dict[str, list[tuple[str, str]]]:
    """tensor -> [(dim letter, argument name)] in argument order, from names like stride_qh or sxt."""
    groups: dict[str, list[tuple[str, str]]] = {}
    for a in arg_names:
        for pat in STRIDE_NAMES:
            m = pat.match(a)
            if m:
                groups.setdefault(m.group(1), []).append((m.group(2), a))
                break
    return groups


def kernel_plants(op: str, kernel) -> list[Plant]:
    """For each stride of each tensor of ``kernel``: the same dimension's stride of the first other tensor that has
    one (the same position for tensors of equal rank, else the same dimension letter)."""
    groups = stride_groups(kernel.arg_names)
    out = []
    for t, dims in groups.items():
        for j, (letter, arg) in enumerate(dims):
            for u, other in groups.items():
                if u == t:
                    continue
                match = other[j] if len(other) == len(dims) else next((o for o in other if o[0] == letter), None)
                if match is not None:
                    out.append(Plant(op, kernel.__name__, arg, match[1]))
                    break
    return out


def _kernels(module) -> list:
    """The Triton kernels a launcher module holds (autotuned ones by their function)."""
    found = {}
    for obj in vars(module).values():
        fn = getattr(obj, "fn", obj)
        if hasattr(fn, "arg_names") and hasattr(fn, "run"):
            found[fn.__name__] = fn
    return list(found.values())


def _plants() -> list:
    out = []
    for op in declaration.operators():
        impl = registry.impl(op, "triton")
        if impl is None or registry.backend_unavailable("triton") or not declaration.operator(op).gradients:
            continue
        quick_kernels: set[str] = set()
        for kernel in _kernels(registry.kernels(op, "triton")):
            for p in kernel_plants(op, kernel):
                slow = p.kernel in quick_kernels and (p.kernel, p.target, p.source) != KNOWN_BUG
                quick_kernels.add(p.kernel)
                out.append(pytest.param(p, id=p.id, marks=[pytest.mark.slow] if slow else []))
    return out


def _arg_names(plant: Plant) -> list[str]:
    return next(k.arg_names for k in _kernels(registry.kernels(plant.op, "triton")) if k.__name__ == plant.kernel)


@contextlib.contextmanager
def planted(plant: Plant, relaid_strides: set[int]):
    """Launches of ``plant.kernel`` under the interpreter get ``plant.target`` = the value of ``plant.source``.
    Yields a record: {"applied": launches changed, "skipped": why not}. Only strides of re-laid tensors (inputs,
    residuals, upstream gradients: all read) are replaced; a launcher-allocated output read through a wrong stride
    could be written outside its allocation."""
    from triton.runtime.interpreter import InterpretedFunction

    record = {"applied": 0, "skipped": None}
    original = InterpretedFunction.run

    def run(self, *args, grid, warmup, **kwargs):
        if self.fn.__name__ == plant.kernel:
            named = dict(zip(self.arg_names, args))
            target_group = next(g for g in stride_groups(self.arg_names).values() if plant.target in [a for _, a in g])
            if not all(named[a] in relaid_strides for _, a in target_group):
                record["skipped"] = f"{plant.target}: a tensor the launcher allocates (not re-laid)"
            elif named[plant.target] != named[plant.source]:
                named[plant.target] = named[plant.source]
                args = tuple(named[a] for a in self.arg_names[:len(args)])
                record["applied"] += 1
        return original(self, *args, grid=grid, warmup=warmup, **kwargs)

    InterpretedFunction.run = run
    try:
        yield record
    finally:
        InterpretedFunction.run = original


@pytest.mark.parametrize("plant", _plants())
def test_planted_stride_swap_fails_the_layout_test(plant, monkeypatch):
    from kernel_dispatch.backends.triton import INTERPRET  # noqa: F401  (the interpreter is what is patched)
    from triton.runtime.interpreter import InterpretedFunction  # noqa: F401

    group = next(t for t, dims in stride_groups(_arg_names(plant)).items() if plant.target in [a for _, a in dims])
    if (plant.kernel, group) in INSENSITIVE:
        pytest.skip(INSENSITIVE[(plant.kernel, group)])
    op = plant.op
    dtype = dtype_for(registry.impl(op, "triton").caps)
    plain = matrix.make_inputs(op, layout_case(op), dtype)
    reasons = registry.why_not(op, "triton", matrix.facts(op, plain))
    if reasons:
        pytest.skip("triton: " + "; ".join(reasons))
    strides: set[int] = set()
    distinct = layouts.distinct

    def recording(tensors):
        out = distinct(tensors)
        strides.update(layouts.stride_values([t for t in out if t.is_floating_point()]))
        return out

    monkeypatch.setattr(layouts, "distinct", recording)
    inp = layouts.relaid(matrix.make_inputs(op, layout_case(op), dtype))
    ref = matrix.run(op, matrix.upcast(plain), "golden")
    with planted(plant, strides) as record:
        try:
            got = run_relaid(op, "triton", inp)
        except Exception as e:  # a wrong stride may also make the launch fail: that is caught too
            failures = [f"raised {type(e).__name__}"]
        else:
            failures = matrix.check(op, got, ref, dtype, list(ref))
    if record["skipped"]:
        pytest.skip(record["skipped"])
    assert record["applied"], f"{plant.kernel} never launched by {op}'s case"
    assert failures, f"{plant.id}: the planted stride swap passed the layout test"


def test_the_known_bug_is_planted():
    """The plant list holds the known bug: dK/dV read dO with q's head stride."""
    ids = [p.values[0] for p in _plants()]
    assert any((p.kernel, p.target, p.source) == KNOWN_BUG for p in ids), [p.id for p in ids]


def _tilelang_inputs():
    for op in declaration.operators():
        if registry.impl(op, "tilelang") is not None and declaration.operator(op).gradients:
            yield op


@pytest.mark.gpu
@pytest.mark.parametrize("op", list(_tilelang_inputs()))
def test_tilelang_launcher_that_keeps_a_strided_input_fails(op, monkeypatch):
    """TileLang kernels read dense tensors; their launchers copy strided inputs (``.contiguous()``, ``dense``).
    Everything the backend receives is re-laid (as in tests/test_layouts.py); planted: the i-th ``.contiguous()``
    call on a strided tensor during the call returns the tensor itself, for each i. Each plant must fail the layout
    test or be refused (TileLang's adapter refuses a strided tensor: a RuntimeError)."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    dtype = dtype_for(registry.impl(op, "tilelang").caps)
    plain = matrix.make_inputs(op, layout_case(op, "tilelang"), dtype, "cuda")
    reasons = registry.why_not(op, "tilelang", matrix.facts(op, plain))
    if reasons:
        pytest.skip("tilelang: " + "; ".join(reasons))
    ref = matrix.run(op, matrix.upcast(plain), "golden")
    inp = layouts.relaid(plain)
    contiguous = torch.Tensor.contiguous
    calls = {"n": 0, "skip": -1}

    def planted(self, *a, **k):
        if self.is_floating_point() and not self.is_contiguous(*a, **k):
            calls["n"] += 1
            if calls["n"] - 1 == calls["skip"]:
                return self
        return contiguous(self, *a, **k)

    monkeypatch.setattr(torch.Tensor, "contiguous", planted)
    run_relaid(op, "tilelang", inp)
    copies = calls["n"]
    caught, read_right = [], []
    for i in range(copies):
        calls.update(n=0, skip=i)
        try:
            got = run_relaid(op, "tilelang", inp)
        except Exception as e:  # refused: a named error or the kernel's own check
            caught.append(f"copy {i}: raised {type(e).__name__}")
            continue
        (caught if matrix.check(op, got, ref, dtype, list(ref)) else read_right).append(f"copy {i}")
    monkeypatch.setattr(torch.Tensor, "contiguous", contiguous)
    print(f"{op}: {copies} copies of strided tensors; caught {caught}; read right while strided: {read_right}")
    assert copies, f"{op}: the TileLang launchers made no strided tensor contiguous"
    assert not read_right, f"{op}: planted strided inputs passed the layout test: {read_right}"
