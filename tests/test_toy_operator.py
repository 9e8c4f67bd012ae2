"""One declaration per operator, proved by a fourth one: a toy operator declared in this module alone appears in
``python -m kernel_dispatch.info``, in the support table, in the equivalence matrix (its cases run and pass) and
in ``python -m kernel_dispatch.bench --quick``, without any other file naming it.

The toy is a scaled add, out = x + alpha * y, with a golden implementation only, its own Capabilities
subclass (a longest last dimension), an info option, cases, tolerances and a bench module (a class used as the
module object). The fixture declares and registers it and takes both back afterwards.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Mapping

import pytest
import torch

import kernel_dispatch as kd
from kernel_dispatch import bench, declaration, info, registry
from kernel_dispatch.benchmarks.common import Candidate, check_record, compare, from_fn, int_list, short_error
from kernel_dispatch.declaration import Capabilities, Fact, Operator, Tolerance
from kernel_dispatch.ops._frontend import backend_pair, check_float, check_same_device, check_shape, check_tensor
from kernel_dispatch.testing import matrix
from kernel_dispatch.testing.matrix import Inputs

from .test_equivalence import DTYPES, check_case, params, why_skip

OP = "toy_scaled_add"
MAX_SIZE = 4096


# ----------------------------------------------------------------------------- the operator


@dataclass(frozen=True)
class ScaledAddCaps(Capabilities):
    """Toy limits: the longest last dimension (None: any)."""

    max_size: int | None = None

    def operator_reasons(self, meta: Mapping[str, Any]) -> list[str]:
        size = meta.get("size")
        if size is not None and self.max_size is not None and size > self.max_size:
            return [f"size {size} > {self.max_size}"]
        return []

    def features(self) -> str:
        return "size any" if self.max_size is None else f"size <= {self.max_size}"


GOLDEN_CAPS = ScaledAddCaps(max_size=MAX_SIZE, notes="toy: a scaled add")


class GoldenKernels:
    """The golden implementation: out = x + alpha * y and its gradients, in the inputs' dtype."""

    @staticmethod
    def forward(x: torch.Tensor, y: torch.Tensor, alpha: float) -> torch.Tensor:
        return x + alpha * y

    @staticmethod
    def backward(g: torch.Tensor, x: torch.Tensor, y: torch.Tensor, alpha: float) -> tuple[torch.Tensor, torch.Tensor]:
        return g.clone(), alpha * g


class WrongKernels(GoldenKernels):
    """A kernel whose gradient of y is 5% off: the matrix must catch it."""

    @staticmethod
    def backward(g: torch.Tensor, x: torch.Tensor, y: torch.Tensor, alpha: float) -> tuple[torch.Tensor, torch.Tensor]:
        return g.clone(), 1.05 * alpha * g


class ScaledAddFunction(torch.autograd.Function):
    """Autograd node: forward through one backend, backward through another (names as strings)."""

    @staticmethod
    def forward(ctx, x, y, alpha, fwd_backend, bwd_backend):
        ctx.save_for_backward(x, y)
        ctx.alpha, ctx.bwd_backend = alpha, bwd_backend
        return registry.kernels(OP, fwd_backend).forward(x, y, alpha)

    @staticmethod
    def backward(ctx, g):
        x, y = ctx.saved_tensors
        dx, dy = registry.kernels(OP, ctx.bwd_backend).backward(g, x, y, ctx.alpha)
        return dx, dy, None, None, None


def selection_facts(x: torch.Tensor) -> dict:
    return {"device": x.device.type, "dtype": x.dtype, "size": x.shape[-1]}


def validate(x, y, alpha) -> None:
    check_tensor("x", x, min_ndim=1)
    check_tensor("y", y)
    if y.dtype != x.dtype:
        raise TypeError(f"y: expected the dtype of x ({x.dtype}), got {y.dtype}")
    check_shape("y", y, tuple(x.shape), "the shape of x")
    check_float("alpha", alpha)
    check_same_device(x=x, y=y)


def scaled_add(x: torch.Tensor, y: torch.Tensor, *, alpha: float = 1.0, backend: Any = None) -> torch.Tensor:
    """out = x + alpha * y. x, y: [..., size], one float dtype and device; out: x's shape and dtype."""
    validate(x, y, alpha)
    fwd, bwd = backend_pair(OP, selection_facts(x), backend)
    return ScaledAddFunction.apply(x, y, float(alpha), fwd, bwd)


@dataclass(frozen=True)
class ToyCase:
    name: str
    shape: tuple[int, ...] = (3, 5)
    alpha: float = 0.5
    gpu_only: bool = False  # runs on a CUDA device only


CASES = (ToyCase("basic"), ToyCase("one_element", (1,), -2.0), ToyCase("wide", (2, 300), 3.0))


def make_inputs(case: ToyCase, dtype: torch.dtype, device: str = "cpu", seed: int = 0) -> Inputs:
    """x, y [*shape] in ``dtype``; alpha; the upstream gradient of out."""
    g = torch.Generator().manual_seed(seed)
    x, y, grad = (torch.randn(*case.shape, generator=g).to(dtype).to(device) for _ in range(3))
    return Inputs({"x": x, "y": y}, {"alpha": case.alpha}, (grad,))


# out: alpha * y and the sum round (x2 margin); dx = g is exact; dy = alpha * g rounds once (x2 margin).
TOLERANCES = {"out": Tolerance(4, 1), "dx": Tolerance(2, 1), "dy": Tolerance(2, 1)}


# ----------------------------------------------------------------------------- its bench module


@dataclass(frozen=True)
class BenchShape:
    size: int

    def as_dict(self) -> dict:
        return {"size": self.size}

    def label(self) -> str:
        return f"size {self.size}"


@dataclass
class BenchInputs:
    leaves: tuple[torch.Tensor, torch.Tensor]
    grad: torch.Tensor


BENCH_ALPHA = 0.5


class ToyReference:
    """scaled_add through golden in float64 on the same inputs."""

    def __init__(self, t: BenchInputs, s: BenchShape):
        self.t = t

    def check(self, fn) -> dict:
        leaves = [p.detach().clone().requires_grad_() for p in self.t.leaves]
        out = fn(*leaves)
        ref_leaves = [p.detach().double().requires_grad_() for p in self.t.leaves]
        ref_out = scaled_add(*ref_leaves, alpha=BENCH_ALPHA, backend="golden")
        ref_dx, ref_dy = torch.autograd.grad(ref_out, ref_leaves, self.t.grad.double())
        fwd = compare({"out": out}, {"out": ref_out})
        try:
            dx, dy = torch.autograd.grad(out, leaves, self.t.grad)
            bwd = compare({"dx": dx, "dy": dy}, {"dx": ref_dx, "dy": ref_dy})
        except Exception as e:  # the forward's errors still count
            bwd = short_error(e)
        return check_record("golden float64 on the same inputs", ("out",), ("dx", "dy"), fwd, bwd)


class ToyBench:
    """The toy's bench module (the protocol of kernel_dispatch.benchmarks.common), as a class object."""

    NAME = OP
    BASELINES = ()
    Reference = ToyReference

    @staticmethod
    def add_arguments(parser) -> None:
        parser.add_argument("--toy-size", type=int_list, help="toy scaled_add sizes")

    @staticmethod
    def shapes(args, quick: bool, Ds) -> list[BenchShape]:
        return [BenchShape(n) for n in (args.toy_size or ((64,) if quick else (MAX_SIZE,)))]

    @staticmethod
    def make_inputs(s: BenchShape, dtype: torch.dtype, device: torch.device) -> BenchInputs:
        g = torch.Generator(device=device).manual_seed(0)
        x, y, grad = (torch.randn(s.size, generator=g, device=device).to(dtype) for _ in range(3))
        return BenchInputs((x.requires_grad_(), y.requires_grad_()), grad)

    @staticmethod
    def candidate(name: str, s: BenchShape, t: BenchInputs, ref: ToyReference) -> Candidate:
        x = t.leaves[0]
        reasons = registry.why_not(OP, name, {"device": x.device.type, "dtype": x.dtype, "size": s.size})
        if reasons:
            return Candidate(name, reason="; ".join(reasons))
        return from_fn(name, lambda x, y: scaled_add(x, y, alpha=BENCH_ALPHA, backend=name), t.leaves, t.grad, ref)

    @staticmethod
    def metrics(s: BenchShape, rec: dict, copy_gbps: float | None) -> dict:
        """Elements per second of each timed direction."""
        return {f"{k}_elements_per_s": s.size / (rec[k]["median_ms"] * 1e-3)
                for k in ("fwd", "fwd_bwd") if rec.get(k) and "median_ms" in rec[k]}


# ----------------------------------------------------------------------------- declared for each test


@pytest.fixture
def toy():
    decl = declaration.declare(Operator(
        name=OP, function=scaled_add, capabilities=ScaledAddCaps, selection_facts=selection_facts, validate=validate,
        outputs=("out",), gradients={"x": "dx", "y": "dy"},
        info_facts=(Fact("size", "--toy-size", 64, "toy scaled_add last dimension"),),
        tolerances=TOLERANCES, cases=CASES, make_inputs=make_inputs, bench=ToyBench))
    registry.register_impl(OP, "golden", GOLDEN_CAPS, priority=0, kernels=GoldenKernels)
    try:
        yield decl
    finally:
        registry.unregister_impl(OP, "golden")
        declaration.undeclare(OP)
    assert OP not in declaration.operators()


def _info_block(out: str) -> list[str]:
    """The toy's lines of the info report: its choice, then one line per backend."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"{OP} "))
    return lines[start:start + 1 + len(registry.BACKEND_NAMES)]


def test_info_lists_it_with_golden_and_the_others_reasons(toy, capsys):
    info.main(["--device", "cpu", "--toy-size", "8"])
    choice, *rows = _info_block(capsys.readouterr().out)
    assert "choice auto from auto -> golden" in choice
    by_backend = {row.split()[0]: row.split(None, 2)[1:] for row in rows}
    assert set(by_backend) == set(registry.BACKEND_NAMES)
    assert by_backend["golden"] == ["yes"]
    for b in registry.BACKEND_NAMES:
        if b != "golden":
            assert by_backend[b] == ["no", f"no {b} implementation of {OP}"], by_backend[b]

    info.main(["--device", "cpu", "--toy-size", str(MAX_SIZE + 1)])  # its own fact reaches its capabilities
    choice, golden, *_ = _info_block(capsys.readouterr().out)
    assert "cannot run" in choice and f"size {MAX_SIZE + 1} > {MAX_SIZE}" in golden


def test_support_table_has_its_row(toy):
    rows = [line for line in info.markdown_support_table().splitlines() if line.startswith(f"| {OP} |")]
    assert rows == [f"| {OP} | golden | cpu, cuda | float16, bfloat16, float32, float64 | size <= {MAX_SIZE} | yes | no | 0 "
                    "| toy: a scaled add |"]


def test_choices_and_which_backend_read_its_declaration(toy):
    x, y = torch.randn(2, 8), torch.randn(2, 8)
    r = kd.which_backend(OP, x, y, alpha=2.0)
    assert (r.forward, r.backward) == ("golden", "golden")
    with kd.use_backend(**{OP: "golden"}):
        torch.testing.assert_close(scaled_add(x, y, alpha=2.0), x + 2.0 * y)
    with pytest.raises(kd.BackendUnavailableError, match=f"no triton implementation of {OP}"):
        scaled_add(x, y, backend="triton")
    with pytest.raises(ValueError, match="y: expected shape"):
        scaled_add(x, y[:, :4])


def test_equivalence_matrix_runs_its_cases(toy):
    ran, skipped = [], {}
    for p in params(ops=[OP]):
        op, backend, case, dtype, direction = p.values
        reason = why_skip(op, backend, case, dtype)
        if reason:
            skipped[p.id] = reason
            continue
        failures = check_case(op, backend, case, dtype, direction)
        assert not failures, (p.id, failures)
        ran.append(p.id)
    assert len(ran) == len(CASES) * len(DTYPES) * 2 and all(f"{OP}-golden-" in i for i in ran)
    assert len(skipped) == len(CASES) * len(DTYPES) * 2 * (len(registry.BACKEND_NAMES) - 1)
    for pid, reason in skipped.items():
        backend = pid.split("-")[1]
        assert reason == f"{backend}: no {backend} implementation of {OP}", (pid, reason)


def test_golden_backward_is_the_gradient(toy):
    x, y = (torch.randn(3, 5, dtype=torch.float64, requires_grad=True) for _ in range(2))
    assert torch.autograd.gradcheck(lambda x, y: scaled_add(x, y, alpha=0.7, backend="golden"), (x, y))


def test_matrix_catches_a_wrong_backend(toy):
    """The toy's cells are real comparisons: a second backend with a wrong gradient of y fails them (dy only)."""
    meta = {"device": "cpu", "dtype": torch.float32, "size": 8}
    why = {}
    for backend in registry.BACKEND_NAMES[1:]:
        registry.register_impl(OP, backend, ScaledAddCaps(devices=("cpu",)), priority=0, kernels=WrongKernels)
        why[backend] = registry.why_not(OP, backend, meta)
        if not why[backend]:
            break
        registry.unregister_impl(OP, backend)
    else:
        pytest.skip(f"no backend but golden can run on this machine: {why}")
    try:
        for case in CASES:
            for dtype in DTYPES:
                inp = matrix.make_inputs(OP, case, dtype)
                ref = matrix.run(OP, matrix.upcast(inp), "golden")
                failures = matrix.check(OP, matrix.run(OP, inp, backend), ref, dtype, ("out", "dx", "dy"))
                assert len(failures) == 1 and failures[0].startswith("dy: rel err"), (case, dtype, failures)
    finally:
        registry.unregister_impl(OP, backend)


def test_bench_quick_runs_its_golden_row(toy, tmp_path, capsys):
    path = tmp_path / "quick.json"
    assert bench.main(["--quick", "--ops", OP, "--no-plots", "--json", str(path)]) == 0
    out = capsys.readouterr().out
    data = json.loads(path.read_text())
    assert data["complete"] and data["copy_gbps"] is None
    [rec] = data["records"]
    assert (rec["op"], rec["backend"], rec["kind"], rec["reason"], rec["shape"]) == (OP, "golden", "kernel", None,
                                                                                     {"size": 64})
    for key in ("fwd", "fwd_bwd"):
        assert rec[key]["median_ms"] > 0 and rec["metrics"][f"{key}_elements_per_s"] > 0
    assert rec["check"]["fwd"]["rel"] < 2 ** -8 and rec["check"]["bwd"]["rel"] < 2 ** -8  # bf16 rounding
    assert f"## {OP}" in out and "| 64 | golden |" in out
