"""Checks of tensor values hold in eager mode, under torch.compile(fullgraph=True) with the values changed after
compiling, and after in-place writes that bump no version (``.data``). Generated from the declarations: every declared
BadValues example of every operator."""
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from kernel_dispatch import declaration
from kernel_dispatch.testing import matrix

EXAMPLES = [pytest.param(op, bad, id=f"{op}-{bad.name}") for op in declaration.operators()
            for bad in declaration.operator(op).bad_values]
CHECKED = sorted({op for op in declaration.operators() if declaration.operator(op).bad_values})


def _inputs(op, case_name):
    case = next(c for c in declaration.operator(op).cases if c.name == case_name)
    return matrix.make_inputs(op, case, torch.float32)


def _call(op, tensors, kwargs):
    return declaration.operator(op).function(**tensors, **kwargs, backend="golden")


@pytest.mark.parametrize("op,bad", EXAMPLES)
def test_eager_call_refuses_the_values(op, bad):
    inp = bad.alter(_inputs(op, bad.case))
    with pytest.raises(ValueError) as e:
        _call(op, inp.tensors, inp.kwargs)
    for w in bad.words:
        assert w in str(e.value), (w, str(e.value))


@pytest.mark.parametrize("op,bad", EXAMPLES)
def test_in_place_writes_through_data_are_seen(op, bad):
    """A call with good values, then the same tensors overwritten through ``.data`` (no version bump): refused."""
    good = _inputs(op, bad.case)
    _call(op, good.tensors, good.kwargs)
    altered = bad.alter(good)
    written = 0
    for where, new in ((good.tensors, altered.tensors), (good.kwargs, altered.kwargs)):
        for name, t in where.items():
            if isinstance(t, torch.Tensor) and new[name] is not t:
                version = t._version
                t.data.copy_(new[name])
                assert t._version == version
                written += 1
    if not written:
        pytest.skip("the example changes no tensor (a Python argument): nothing to write in place")
    with pytest.raises(ValueError, match=bad.words[0]):
        _call(op, good.tensors, good.kwargs)


class _Passthrough(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("op,bad", [p for p in EXAMPLES if declaration.operator(p.values[0]).value_checks])
def test_device_path_refuses_the_values(op, bad):
    """The path CUDA tensors, capture and tracing take (no host read: torch._assert_async), taken here on the CPU
    under a dispatch mode: a RuntimeError naming the argument."""
    inp = bad.alter(_inputs(op, bad.case))
    with _Passthrough(), pytest.raises(RuntimeError, match=rf"{bad.words[0]}: expected"):
        _call(op, inp.tensors, inp.kwargs)


@pytest.mark.parametrize("op", CHECKED)
def test_compiled_call_refuses_the_values(op):
    """Compiled once with good values (fullgraph), then called with each bad example: the check runs inside the graph
    (a RuntimeError naming the argument), not only while tracing."""
    torch._dynamo.reset()
    fn = torch.compile(lambda tensors, kwargs: _call(op, tensors, kwargs), fullgraph=True)
    for bad in declaration.operator(op).bad_values:
        good = _inputs(op, bad.case)
        fn(good.tensors, good.kwargs)
        inp = bad.alter(_inputs(op, bad.case))
        with pytest.raises(RuntimeError, match=rf"{bad.words[0]}: "):
            fn(inp.tensors, inp.kwargs)
