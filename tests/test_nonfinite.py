"""Non-finite tensor inputs propagate by the documented rule (the public docstrings, README's API section), the golden
backend's: a NaN or +inf score poisons exactly its output row, padding reaches nothing, a non-finite mHC token value
only its token. Every backend that runs here is held to the same rule."""
import pytest
import torch

import kernel_dispatch as kd
from kernel_dispatch import registry
from kernel_dispatch.testing import matrix

NAN, INF = float("nan"), float("inf")
B, H, HKV, L, D, W = 2, 2, 1, 12, 16, 4
LENGTHS = (12, 7)


def _runnable(op: str, meta: dict) -> list:
    out = []
    for b in registry.BACKEND_NAMES:
        reasons = registry.why_not(op, b, meta)
        out.append(pytest.param(b, marks=pytest.mark.skip(reason=f"{b}: " + "; ".join(reasons))) if reasons else b)
    return out


ATTN_BACKENDS = _runnable("lazy_attention", {"device": "cpu", "dtype": torch.float32, "head_dim": D, "gqa": True,
                                             "lengths": True, "causal": True, "bias_length": W})
MHC_BACKENDS = {op: _runnable(op, {"device": "cpu", "dtype": torch.float32, "n": 4, "D": 16})
                for op in ("mhc_pre", "mhc_post")}


def _attn_inputs():
    g = torch.Generator().manual_seed(0)
    t = {"q": torch.randn(B, H, L, D, generator=g), "k": torch.randn(B, HKV, L, D, generator=g),
         "v": torch.randn(B, HKV, L, D, generator=g), "bias": 0.5 * torch.randn(H, W, generator=g),
         "tau": torch.tensor([-0.4, 0.2])}
    return t, torch.tensor(LENGTHS), torch.randn(B, H, L, D, generator=g)


def _attn(t, lengths, backend, do=None):
    leaves = {k: v.clone().requires_grad_(do is not None) for k, v in t.items()}
    o = kd.lazy_attention(**leaves, lengths=lengths, backend=backend)
    if do is None:
        return o.detach(), None
    grads = torch.autograd.grad(o, list(leaves.values()), do)
    return o.detach(), dict(zip(("dq", "dk", "dv", "dbias", "dtau"), grads))


def _valid_rows() -> torch.Tensor:
    """[B, H, L]: rows inside lengths."""
    return (torch.arange(L)[None, :] < torch.tensor(LENGTHS)[:, None])[:, None, :].expand(B, H, L)


def _bad_rows(o: torch.Tensor) -> torch.Tensor:
    return ~torch.isfinite(o).all(-1)


# (input, index, value) -> the rows [B, H, L] the rule makes non-finite (every other valid row stays finite)
def _rows(fill):
    r = torch.zeros(B, H, L, dtype=torch.bool)
    fill(r)
    return r & _valid_rows()


POISON = {
    "q_nan": ("q", (0, 1, 5, 3), NAN, _rows(lambda r: r.__setitem__((0, 1, 5), True))),
    "q_row_inf": ("q", (1, 0, 3), INF, _rows(lambda r: r.__setitem__((1, 0, 3), True))),  # +inf - inf: NaN scores
    "k_nan": ("k", (0, 0, 4, 2), NAN, _rows(lambda r: r[0, :, 4:].fill_(True))),  # every row that sees key 4
    "bias_nan": ("bias", (1, 2), NAN, _rows(lambda r: r[:, 1, 2:].fill_(True))),  # head 1, rows at distance >= 2
    "bias_inf": ("bias", (0, 3), INF, _rows(lambda r: r[:, 0, 3:].fill_(True))),
    "tau_nan": ("tau", (1,), NAN, _rows(lambda r: r[:, 1].fill_(True))),
    "tau_inf": ("tau", (0,), INF, _rows(lambda r: r[:, 0].fill_(True))),
}


@pytest.mark.parametrize("backend", ATTN_BACKENDS)
@pytest.mark.parametrize("case", list(POISON))
def test_lazy_attention_nonfinite_score_poisons_exactly_its_rows(case, backend):
    name, index, value, expected = POISON[case]
    t, lengths, _ = _attn_inputs()
    t[name][index] = value
    o, _ = _attn(t, lengths, backend)
    bad = _bad_rows(o)
    assert torch.equal(bad & _valid_rows(), expected), f"non-finite rows {bad.nonzero().tolist()}"
    assert torch.equal(o[~_valid_rows()], torch.zeros_like(o[~_valid_rows()])), "padded rows must stay exactly zero"


@pytest.mark.parametrize("backend", ATTN_BACKENDS)
def test_lazy_attention_minus_inf_bias_masks_its_distance(backend):
    """-inf at distance 2 removes those keys: every row stays finite and equals golden float64 with the key masked."""
    t, lengths, _ = _attn_inputs()
    t["bias"][0, 2] = -INF
    o, _ = _attn(t, lengths, backend)
    assert torch.isfinite(o).all()
    ref, _ = _attn({k: v.double() for k, v in t.items()}, lengths, "golden")
    assert matrix.rel_err(o, ref) <= matrix.tolerance("lazy_attention", torch.float32, "o")


@pytest.mark.parametrize("backend", ATTN_BACKENDS)
def test_lazy_attention_nonfinite_value_reaches_the_rows_that_see_it(backend):
    t, lengths, _ = _attn_inputs()
    t["v"][0, 0, 4, 1] = NAN
    o, _ = _attn(t, lengths, backend)
    bad = _bad_rows(o)
    assert bad[0, :, 4:].all(), "every row that sees key 4"
    assert not bad[1].any(), "the other batch element"


@pytest.mark.parametrize("backend", ATTN_BACKENDS)
def test_lazy_attention_padding_reaches_nothing(backend):
    """NaN in every padded position of q, k, v and dO: outputs and gradients equal those of finite padding, padded rows
    and their gradients exactly zero."""
    t, lengths, do = _attn_inputs()
    o_ref, g_ref = _attn(t, lengths, backend, do)
    pad = ~_valid_rows()[1, 0]
    for name in ("q", "k", "v"):
        t[name][1, :, pad] = NAN
    do[1, :, pad] = NAN
    o, g = _attn(t, lengths, backend, do)
    assert torch.equal(o, o_ref)
    for name in g:
        assert torch.equal(g[name], g_ref[name]), name
    for name in ("dq", "dk", "dv"):
        assert not g[name][1, :, pad].any(), name


# The kernel backends keep scores in log2 units (S * log2 e): the documented limit on a finite score's magnitude.
LOG2_DOMAIN = {"triton", "tilelang"}
LOG2_LIMIT = 3.4028234663852886e38 / 1.4426950408889634  # 2.36e38


@pytest.mark.parametrize("backend", ATTN_BACKENDS)
@pytest.mark.parametrize("size", [1e30, 2e38, 3e38])
def test_lazy_attention_huge_finite_biases(size, backend):
    """Biases up to the edge of fp32 (one dominant key per row at +size, a key that vanishes at -size) are finite
    scores: output and gradients are finite and match golden float64. Past the log2-domain limit a kernel backend's
    rows that see the huge score are NaN (loud, the documented limit), and the other head still matches."""
    t, lengths, do = _attn_inputs()
    t["bias"][0, 0] = size
    t["bias"][1, 1] = -size
    o, g = _attn(t, lengths, backend, do)
    ref, g_ref = _attn({k: v.double() for k, v in t.items()}, lengths, "golden", do.double())
    if backend in LOG2_DOMAIN and size > LOG2_LIMIT:
        many_keys = _valid_rows()[:, 0] & (torch.arange(L) > 0)  # causal row 0 has one key: P = 1 exactly
        assert torch.isnan(o[:, 0][many_keys]).all(), "head 0 sees +size at distance 0 in every row"
        tol = matrix.tolerance("lazy_attention", torch.float32, "o")
        assert matrix.rel_err(o[:, 1], ref[:, 1]) <= tol and matrix.rel_err(o[:, 0, 0], ref[:, 0, 0]) <= tol
        return
    assert matrix.rel_err(o, ref) <= matrix.tolerance("lazy_attention", torch.float32, "o")
    for name in g:
        assert matrix.rel_err(g[name], g_ref[name]) <= matrix.tolerance("lazy_attention", torch.float32, name), name


def _pre_inputs(T=6, n=4, Dm=16):
    g = torch.Generator().manual_seed(1)
    M = n * n + 2 * n
    return {"x": torch.randn(T, n, Dm, generator=g), "phi": 0.1 * torch.randn(M, n * Dm, generator=g),
            "alpha": torch.tensor([0.8, 1.1, 0.9]), "bias": 0.2 * torch.randn(M, generator=g),
            "gamma": 1 + 0.1 * torch.randn(n * Dm, generator=g)}


@pytest.mark.parametrize("backend", MHC_BACKENDS["mhc_pre"])
@pytest.mark.parametrize("value", [NAN, INF, -INF], ids=["nan", "inf", "-inf"])
def test_mhc_pre_nonfinite_x_poisons_exactly_its_token(value, backend):
    t = _pre_inputs()
    clean = kd.mhc_pre(**t, backend=backend)
    t["x"][2, 1, 3] = value
    got = kd.mhc_pre(**t, backend=backend)
    others = torch.arange(6) != 2
    for name, c, o in zip(("h_in", "h_post", "h_res"), clean, got):
        assert not torch.isfinite(o[2]).any(), f"{name}: every value of token 2"
        assert torch.equal(o[others], c[others]), f"{name}: the other tokens"


def _post_inputs(T=6, n=4, Dm=16):
    g = torch.Generator().manual_seed(2)
    return {"f": torch.randn(T, Dm, generator=g), "x": torch.randn(T, n, Dm, generator=g),
            "h_post": 2 * torch.rand(T, n, generator=g), "h_res": torch.softmax(torch.randn(T, n, n, generator=g), -1)}


POST_POISON = {  # input index -> the out[t, o, d] it reaches
    "f": ((2, 3), (2, slice(None), 3)),
    "x": ((1, 0, 5), (1, slice(None), 5)),
    "h_post": ((3, 2), (3, 2, slice(None))),
    "h_res": ((4, 1, 0), (4, 0, slice(None))),
}


@pytest.mark.parametrize("backend", MHC_BACKENDS["mhc_post"])
@pytest.mark.parametrize("name", list(POST_POISON))
def test_mhc_post_nonfinite_input_poisons_exactly_what_reads_it(name, backend):
    t = _post_inputs()
    clean = kd.mhc_post(**t, backend=backend)
    index, reached = POST_POISON[name]
    t[name][index] = NAN
    out = kd.mhc_post(**t, backend=backend)
    hit = torch.zeros_like(out, dtype=torch.bool)
    hit[reached] = True
    assert torch.isnan(out[hit]).all()
    assert torch.equal(out[~hit], clean[~hit])
