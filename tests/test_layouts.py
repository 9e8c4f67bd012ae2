"""Every operator and backend is right when no two tensors it reads share a stride: inputs and upstream gradients in
:func:`kernel_dispatch.testing.layouts.relaid`'s layouts, and every tensor the backend's forward and backward receive
(saved residuals included) re-laid again on the way in; plus each operator's declared practical layouts (q, k, v as
slices of one fused projection). A kernel that reads a tensor with another tensor's strides fails here; the equivalence
matrix's non-contiguous cases, which transpose every tensor alike, keep such strides equal. Generated from the
declarations."""
import functools

import pytest
import torch

from kernel_dispatch import declaration, registry
from kernel_dispatch.testing import layouts, matrix


def _size(op: str, case) -> tuple:
    inp = matrix.make_inputs(op, case, torch.float32)
    ts = [t for t in list(inp.tensors.values()) + list(inp.grads) if t.is_floating_point()]
    # a stride of a dimension of size 1 is never read, so a layout cannot test it: such cases come last
    return (any(1 in t.shape for t in ts if t.dim() > 1), sum(t.numel() for t in ts))


@functools.lru_cache(maxsize=None)
def layout_case(op: str, backend: str = "golden"):
    """The operator's declared layout case, else the smallest CPU-sized declared case whose floating inputs have no
    dimension of size 1; for a backend that cannot run that case here (a head dim or stream count it does not
    build), the smallest CPU-sized case it can run on :func:`device_for`'s device."""
    decl = declaration.operator(op)
    cases = sorted((c for c in decl.cases if not c.gpu_only), key=lambda c: _size(op, c))
    if decl.layout_case is not None:
        cases.insert(0, next(c for c in decl.cases if c.name == decl.layout_case))
    if backend == "golden":
        return cases[0]
    dtype, device = dtype_for(registry.impl(op, backend).caps), device_for(backend)
    runnable = [c for c in cases if not matrix.why_not(op, backend, matrix.make_inputs(op, c, dtype, device))]
    return runnable[0] if runnable else cases[0]


def device_for(backend: str) -> str:
    """Where the layout test runs ``backend``: CUDA when there is a device (the kernels themselves), else the CPU
    (golden; Triton through its interpreter)."""
    return "cuda" if backend != "golden" and torch.cuda.is_available() else "cpu"


def dtype_for(caps) -> torch.dtype:
    return torch.float32 if torch.float32 in caps.dtypes else caps.dtypes[0]


def _params():
    for op in declaration.operators():
        decl = declaration.operator(op)
        for name in ("distinct", *decl.layouts):
            for backend in registry.BACKEND_NAMES:
                if registry.impl(op, backend) is not None:
                    yield pytest.param(op, name, backend, id=f"{op}-{name}-{backend}")


def run_relaid(op: str, backend: str, inp: matrix.Inputs) -> dict:
    with layouts.relaid_kernel_calls(op, backend):
        return matrix.run(op, inp, backend)


@pytest.mark.parametrize("op,layout,backend", list(_params()))
def test_distinct_strides_everywhere(op, layout, backend):
    decl = declaration.operator(op)
    dtype = dtype_for(registry.impl(op, backend).caps)
    case = layout_case(op, backend)
    plain = matrix.make_inputs(op, case, dtype, device_for(backend))
    reason = matrix.why_not(op, backend, plain)
    if reason:
        pytest.skip(reason)
    inp = (layouts.relaid if layout == "distinct" else decl.layouts[layout])(plain)
    ref = matrix.run(op, matrix.upcast(plain), "golden")
    failures = matrix.check_backend(op, backend, run_relaid(op, backend, inp), ref, dtype)
    assert not failures, f"{case.name}: " + "; ".join(failures)


def test_relaid_strides_are_all_different():
    """The layouts themselves: same values; no stride value shared between tensors (or with a contiguous tensor of
    their shapes) in a dimension of size > 1."""
    g = torch.Generator().manual_seed(0)
    ts = [torch.randn(2, 4, 40, 32, generator=g), torch.randn(2, 2, 40, 32, generator=g),
          torch.randn(2, 2, 40, 32, generator=g), torch.randn(2, 4, 40, 32, generator=g), torch.randn(4, 8),
          torch.randn(4), torch.tensor([3, 1])]
    out = layouts.distinct(ts)
    for a, b in zip(ts, out):
        assert torch.equal(a, b)
    assert out[-1] is ts[-1]
    values = layouts.stride_values(out[:-1])
    assert len(values) == len(set(values))
    contiguous = {s for t in ts for s, n in zip(t.contiguous().stride(), t.shape) if n > 1}
    assert not set(values) & contiguous


@pytest.mark.parametrize("op", [op for op in declaration.operators() if declaration.operator(op).layouts])
def test_declared_layouts_keep_the_values(op):
    decl = declaration.operator(op)
    plain = matrix.make_inputs(op, layout_case(op), torch.float32)
    for name, fn in decl.layouts.items():
        inp = fn(plain)
        for k, t in plain.tensors.items():
            assert torch.equal(inp.tensors[k], t), (name, k)
        for a, b in zip(inp.grads, plain.grads):
            assert torch.equal(a, b), name
