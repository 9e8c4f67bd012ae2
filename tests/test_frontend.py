"""The front end: custom ops pass opcheck, forward/backward backends compose, torch.compile matches eager."""
import itertools

import pytest
import torch

import kernel_dispatch as kd
from kernel_dispatch import declaration, registry
from kernel_dispatch.testing.matrix import facts

from .cases import make_inputs, run, upcast
from .tolerances import rel_err, tolerance


def _sample_calls():
    g = torch.Generator().manual_seed(0)
    B, H, Hkv, L, D, W = 2, 4, 2, 9, 8, 3
    q, k, v = torch.randn(B, H, L, D, generator=g), torch.randn(B, Hkv, L, D, generator=g), torch.randn(B, Hkv, L, D)
    bias, tau = 0.3 * torch.randn(H, W, generator=g), torch.tensor([-0.5, -1.3, 0.2, -0.1])
    lens = torch.tensor([9, 4])
    o, lse = torch.ops.kernel_dispatch.lazy_attention_fwd(q, k, v, bias, tau, 0.3, lens, True, "golden")
    yield torch.ops.kernel_dispatch.lazy_attention_fwd, (q, k, v, bias, tau, 0.3, lens, True, "golden")
    yield torch.ops.kernel_dispatch.lazy_attention_fwd, (q, k, v, bias, tau, 0.3, None, False, "golden")
    yield torch.ops.kernel_dispatch.lazy_attention_bwd, (torch.randn_like(o), q, k, v, bias, tau, o, lse, 0.3, lens,
                                                         True, "golden")
    n, Dm, T = 4, 8, 5
    M = n * n + 2 * n
    x, phi = torch.randn(T, n, Dm, generator=g), 0.1 * torch.randn(M, n * Dm, generator=g)
    alpha, b, gamma = torch.tensor([1.0, 0.9, 1.1]), 0.1 * torch.randn(M, generator=g), 1 + 0.1 * torch.randn(n * Dm)
    hp = (20, 2.0, 1e-6, 1e-6, 1e-6)
    for gm in (gamma, None):
        yield torch.ops.kernel_dispatch.mhc_pre_fwd, (x, phi, alpha, b, gm, *hp, "golden")
        h_in, h_post, h_res, z, inv = torch.ops.kernel_dispatch.mhc_pre_fwd(x, phi, alpha, b, gm, *hp, "golden")
        yield torch.ops.kernel_dispatch.mhc_pre_bwd, (torch.randn_like(h_in), torch.randn_like(h_post),
                                                      torch.randn_like(h_res), x, phi, alpha, b, gm, z, inv, *hp,
                                                      "golden")
    f = torch.randn(T, Dm)
    yield torch.ops.kernel_dispatch.mhc_post_fwd, (f, x, torch.rand(T, n), torch.rand(T, n, n), "golden")
    yield torch.ops.kernel_dispatch.mhc_post_bwd, (torch.randn(T, n, Dm), f, x, torch.rand(T, n), torch.rand(T, n, n),
                                                   "golden")


@pytest.mark.parametrize("call", list(_sample_calls()), ids=lambda c: str(c[0]) if callable(c) else "")
def test_opcheck(call):
    op, args = call
    torch.library.opcheck(op, args)


def _runnable(op, inp):
    meta = facts(op, inp)
    return [b for b in kd.BACKEND_NAMES if not registry.why_not(op, b, meta)]


def _first_small_case(op):
    """The operator's first declared case that runs on the CPU (a GPU-sized one does not)."""
    return next(c for c in declaration.operator(op).cases if not c.gpu_only)


DIFFERENTIABLE = [op for op in declaration.operators() if declaration.operator(op).gradients]


@pytest.mark.parametrize("op", DIFFERENTIABLE)
def test_forward_and_backward_backends_compose(op):
    dtype = torch.float32
    inp = make_inputs(op, _first_small_case(op), dtype)
    ref = run(op, upcast(inp), "golden")
    backends = _runnable(op, inp)
    assert "golden" in backends
    for fwd, bwd in itertools.product(backends, repeat=2):
        got = run(op, inp, (fwd, bwd))
        for name in ref:
            err, tol = rel_err(got[name], ref[name]), tolerance(op, dtype, name)
            assert err <= tol, f"{fwd} fwd / {bwd} bwd: {name} rel err {err:.2e} > {tol:.2e}"


class _TinyBlock(torch.nn.Module):
    """All three operators: mHC pre -> lazy attention (GQA) -> mHC post."""
    residual = False  # x to post through mhc_pre(..., return_residual=True)

    def __init__(self, n=4, H=4, Hkv=2, Dh=4):
        super().__init__()
        D = H * Dh
        M = n * n + 2 * n
        self.H, self.Hkv, self.Dh = H, Hkv, Dh
        self.phi = torch.nn.Parameter(0.1 * torch.randn(M, n * D))
        self.alpha = torch.nn.Parameter(torch.tensor([1.0, 0.8, 1.2]))
        self.b = torch.nn.Parameter(0.1 * torch.randn(M))
        self.gamma = torch.nn.Parameter(torch.ones(n * D))
        self.kv = torch.nn.Linear(D, 2 * Hkv * Dh)
        self.bias = torch.nn.Parameter(0.1 * torch.randn(H, 3))
        self.tau = torch.nn.Parameter(torch.full((H,), -0.5))

    def forward(self, x):  # x [B, L, n, D]
        B, L = x.shape[:2]
        if self.residual:
            h_in, h_post, h_res, x_res = kd.mhc_pre(x, self.phi, self.alpha, self.b, self.gamma, return_residual=True)
        else:
            (h_in, h_post, h_res), x_res = kd.mhc_pre(x, self.phi, self.alpha, self.b, self.gamma), x
        q = h_in.view(B, L, self.H, self.Dh).transpose(1, 2)
        k, v = self.kv(h_in).view(B, L, 2, self.Hkv, self.Dh).permute(2, 0, 3, 1, 4)
        o = kd.lazy_attention(q, k, v, self.bias, self.tau)
        return kd.mhc_post(o.transpose(1, 2).reshape(B, L, -1), x_res, h_post, h_res)


@pytest.mark.parametrize("residual", [False, True], ids=["plain", "return_residual"])
def test_torch_compile_fullgraph_matches_eager(residual):
    torch.manual_seed(0)
    model = _TinyBlock()
    model.residual = residual
    x = torch.randn(2, 7, 4, 16, requires_grad=True)
    eager = model(x)
    eager.square().sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    gx = x.grad.clone()
    model.zero_grad()
    x.grad = None
    compiled = torch.compile(model, fullgraph=True)
    out = compiled(x)
    out.square().sum().backward()
    torch.testing.assert_close(out, eager, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(x.grad, gx, rtol=1e-5, atol=1e-6)
    # Inductor sums the token axis of a parameter gradient (kv.bias: 14 tokens, entries that cancel to ~1e-5)
    # in another order than eager: compared as a whole, within 16 fp32 roundings of the gradient's norm.
    for n, p in model.named_parameters():
        assert rel_err(p.grad, grads[n]) <= 16 * 2.0 ** -24, n


_OP_MODULES = {op: declaration.operator(op).function.__module__ for op in DIFFERENTIABLE}


def _refuse(*args):
    raise AssertionError("this path must not run")


@pytest.mark.parametrize("op", list(_OP_MODULES))
def test_eager_calls_the_implementation_directly(op, monkeypatch):
    """Plain eager mode skips the custom-op dispatcher (host time) and runs the same implementation."""
    import importlib

    mod = importlib.import_module(_OP_MODULES[op])
    inp = make_inputs(op, _first_small_case(op), torch.float32)
    ref = run(op, inp, "golden")
    for custom in (f"{op}_fwd", f"{op}_bwd"):
        monkeypatch.setattr(mod, custom, _refuse)
    got = run(op, inp, "golden")
    for name in ref:
        assert torch.equal(got[name], ref[name]), name
    monkeypatch.setattr(mod, "_fwd", _refuse)
    with pytest.raises(AssertionError, match="must not run"):
        run(op, inp, "golden")


@pytest.mark.parametrize("op", list(_OP_MODULES))
def test_fake_tensors_go_through_the_custom_op(op, monkeypatch):
    """Under FakeTensorMode (as torch.compile and memory estimators trace) the custom op's fake runs, never
    the kernels."""
    import importlib

    from torch._subclasses.fake_tensor import FakeTensorMode

    mod = importlib.import_module(_OP_MODULES[op])
    monkeypatch.setattr(mod, "_fwd", _refuse)
    monkeypatch.setattr(mod, "_bwd", _refuse)
    inp = make_inputs(op, _first_small_case(op), torch.float32)
    with FakeTensorMode(allow_non_fake_inputs=True):
        got = run(op, inp, "golden")
    differentiable = {g: n for n, g in declaration.operator(op).gradients.items() if n in inp.tensors}
    assert set(differentiable) <= set(got), sorted(got)
    for grad, name in differentiable.items():
        t = got[grad]
        assert isinstance(t, torch._subclasses.fake_tensor.FakeTensor) and t.shape == inp.tensors[name].shape, grad
