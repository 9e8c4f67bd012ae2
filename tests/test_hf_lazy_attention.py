"""Lazy attention inside transformers: oracles on tiny random Llama, Qwen3 and Mistral models (no download).

- tau = 0 and a zero bias: logits and gradients equal the same model on ``attn_implementation="sdpa"``;
- any bias and tau, padded batches included: equal the dense reference of tests/hf_tiny.py, bias and tau
  gradients too;
- backend selection (the helper's argument, use_backend, environment) and the errors that name what is
  supported.
Relative errors in float64 (golden) are bounded by 2^20 machine epsilons of float64 (2.3e-10), in float32
(Triton through its interpreter) by 2^10 of float32 (1.2e-4): whole-model sums in another order, nothing
approximated.
"""
from __future__ import annotations

import pytest

pytest.importorskip("transformers", minversion="5.23")

import torch  # noqa: E402

import kernel_dispatch as kd  # noqa: E402
from kernel_dispatch.integrations import transformers as kd_hf  # noqa: E402
from kernel_dispatch.testing.matrix import rel_err  # noqa: E402

from .hf_tiny import FAMILIES, VOCAB, as_reference, grads, lazy_copy, tiny_model  # noqa: E402

RTOL = {torch.float64: 2.0 ** -52 * 2 ** 20, torch.float32: 2.0 ** -23 * 2 ** 10}


def _batch(seed: int = 1, B: int = 2, L: int = 12):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, VOCAB, (B, L), generator=g)


def _padded(ids):
    """Row 0 left-padded by 3, row 1 right-padded by 4 (training batches carry either)."""
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    mask[1, -4:] = 0
    return ids.masked_fill(mask == 0, 0), mask


def _fwd_bwd(model, ids, mask=None):
    labels = ids if mask is None else ids.masked_fill(mask == 0, -100)
    out = model(input_ids=ids, attention_mask=mask, labels=labels)
    out.loss.backward()
    return out.logits.detach()


def _assert_close(got: dict, ref: dict, dtype, what: str) -> None:
    assert got.keys() == ref.keys(), what
    for name in ref:
        err = rel_err(got[name], ref[name])
        assert err <= RTOL[dtype], f"{what}: {name} rel err {err:.2e} > {RTOL[dtype]:.1e}"


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("padded", [False, True], ids=["dense", "padded"])
def test_zero_bias_tau0_equals_sdpa(family, padded):
    """The oracle no one here wrote: at tau = 0 with a zero bias lazy attention is softmax attention."""
    sdpa = tiny_model(family)
    lazy = lazy_copy(sdpa, tau_init=0.0, backend="golden")
    ids = _batch()
    ids, mask = _padded(ids) if padded else (ids, None)
    want, got = _fwd_bwd(sdpa, ids, mask), _fwd_bwd(lazy, ids, mask)
    keep = slice(None) if mask is None else mask.bool()
    _assert_close({"logits": got[keep]}, {"logits": want[keep]}, torch.float64, family)
    _assert_close(grads(lazy, skip_lazy=True), grads(sdpa), torch.float64, family)
    for m in kd_hf.attention_modules(lazy):
        assert m.lazy_attention.bias.grad.abs().sum() > 0 and m.lazy_attention.tau.grad.abs().sum() > 0


def test_triton_interpreter_equals_sdpa():
    """The Triton kernels (interpreter on the CPU, float32) inside the model, forward and backward."""
    sdpa = tiny_model("llama", torch.float32)
    lazy = lazy_copy(sdpa, tau_init=0.0, backend="triton")
    ids, mask = _padded(_batch())
    want, got = _fwd_bwd(sdpa, ids, mask), _fwd_bwd(lazy, ids, mask)
    _assert_close({"logits": got[mask.bool()]}, {"logits": want[mask.bool()]}, torch.float32, "triton")
    _assert_close(grads(lazy, skip_lazy=True), grads(sdpa), torch.float32, "triton")


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("padded", [False, True], ids=["dense", "padded"])
def test_any_bias_tau_equals_dense_reference(family, padded):
    """Nonzero bias and tau, left and right padding: logits and every gradient (bias and tau included)."""
    lazy = lazy_copy(tiny_model(family), randomize_seed=3, backend="golden")
    ref = as_reference(lazy)
    ids = _batch(seed=2)
    ids, mask = _padded(ids) if padded else (ids, None)
    want, got = _fwd_bwd(ref, ids, mask), _fwd_bwd(lazy, ids, mask)
    keep = slice(None) if mask is None else mask.bool()
    _assert_close({"logits": got[keep]}, {"logits": want[keep]}, torch.float64, family)
    _assert_close(grads(lazy), grads(ref), torch.float64, family)


def test_training_step_calls_lazy_attention(monkeypatch):
    calls = []
    real = kd.ops.lazy_attention
    monkeypatch.setattr(kd.ops, "lazy_attention", lambda *a, **k: calls.append(k.get("backend")) or real(*a, **k))
    lazy = lazy_copy(tiny_model("llama"), backend=("golden", "golden"))
    lazy.train()
    _fwd_bwd(lazy, _batch())
    assert calls == [("golden", "golden")] * 2  # one call per layer, the helper's backend


def test_backend_selection_reaches_the_model(monkeypatch):
    """No helper argument: use_backend and the environment choose, strictly; the helper's argument wins."""
    lazy = lazy_copy(tiny_model("llama", torch.float32))
    ids = _batch()
    with kd.use_backend(lazy_attention="tilelang"):
        with pytest.raises(kd.BackendUnavailableError, match="tilelang"):
            lazy(input_ids=ids)
    monkeypatch.setenv("LAZYATTN_BACKEND", "tilelang")
    with pytest.raises(kd.BackendUnavailableError, match="LAZYATTN_BACKEND|tilelang"):
        lazy(input_ids=ids)
    kd_hf.add_lazy_attention(lazy, window=8, backend="golden")
    lazy(input_ids=ids)


def test_helper_arguments_and_reapplication():
    model = tiny_model("llama")
    with pytest.raises(ValueError, match="window"):
        kd_hf.add_lazy_attention(model, window=0)
    with pytest.raises(ValueError, match="tau_init"):
        kd_hf.add_lazy_attention(model, tau_init=float("nan"))
    with pytest.raises(ValueError, match="backend"):
        kd_hf.add_lazy_attention(model, backend={"mhc_pre": "golden"})
    with pytest.raises(TypeError, match="model"):
        kd_hf.add_lazy_attention(torch.nn.Linear(2, 2))
    lazy = kd_hf.add_lazy_attention(model, window=8, tau_init=-1.0)
    mods = kd_hf.attention_modules(lazy)
    assert len(mods) == 2 and lazy.config._attn_implementation == kd_hf.ATTN_IMPLEMENTATION
    p = mods[0].lazy_attention
    assert p.bias.shape == (4, 8) and p.bias.dtype == torch.float32 and (p.tau == -1.0).all()
    with torch.no_grad():
        p.tau.fill_(0.25)
    kd_hf.add_lazy_attention(lazy, window=8, backend="golden")  # keeps the trained values
    assert (mods[0].lazy_attention.tau == 0.25).all() and mods[0].lazy_attention.backend == "golden"
    with pytest.raises(ValueError, match="window"):
        kd_hf.add_lazy_attention(lazy, window=16)
    assert lazy.config.lazy_attention == {"window": 8, "tau_init": -1.0}


def test_padding_inside_a_row_raises():
    lazy = lazy_copy(tiny_model("llama"))
    ids = _batch()
    mask = torch.ones_like(ids)
    mask[1, 5] = 0
    with pytest.raises(kd_hf.LazyAttentionUnsupportedError, match="row 1 has padding between valid tokens"):
        lazy(input_ids=ids, attention_mask=mask)
    mask[1] = 0
    with pytest.raises(kd_hf.LazyAttentionUnsupportedError, match="row 1 has no valid token"):
        lazy(input_ids=ids, attention_mask=mask)


def test_custom_4d_mask_raises():
    lazy = lazy_copy(tiny_model("llama"))
    ids = _batch()
    mask4d = torch.zeros(2, 1, 12, 12, dtype=torch.float64)
    with pytest.raises(kd_hf.LazyAttentionUnsupportedError, match="Custom 4-D masks are not supported"):
        lazy(input_ids=ids, attention_mask=mask4d)


def test_sliding_window_that_cuts_raises():
    lazy = lazy_copy(tiny_model("mistral", sliding_window=6))
    lazy(input_ids=_batch(L=6))  # the window holds every row: plain causal
    with pytest.raises(kd_hf.LazyAttentionUnsupportedError, match="sliding window of 6 tokens cuts"):
        lazy(input_ids=_batch(L=7))


def test_attention_dropout_raises():
    lazy = lazy_copy(tiny_model("llama", attention_dropout=0.1))
    lazy.train()
    with pytest.raises(kd_hf.LazyAttentionUnsupportedError, match="dropout"):
        lazy(input_ids=_batch())


def test_module_without_parameters_raises():
    model = tiny_model("llama")
    model.set_attn_implementation(kd_hf.ATTN_IMPLEMENTATION)
    with pytest.raises(kd_hf.LazyAttentionUnsupportedError, match="add_lazy_attention"):
        model(input_ids=_batch())


def test_bf16_model_keeps_fp32_bias_and_tau():
    lazy = lazy_copy(tiny_model("llama", torch.float32), randomize_seed=1, backend="golden").to(torch.bfloat16)
    p = kd_hf.attention_modules(lazy)[0].lazy_attention
    assert p.bias.dtype == torch.float32 and p.tau.dtype == torch.float32
    assert lazy.model.layers[0].self_attn.q_proj.weight.dtype == torch.bfloat16
    ids, mask = _padded(_batch())
    logits = _fwd_bwd(lazy, ids, mask)
    assert logits.dtype == torch.bfloat16 and torch.isfinite(logits).all()
    assert p.bias.grad.dtype == torch.float32 and p.tau.grad.abs().sum() > 0


def test_non_causal_or_chunked_configs_raise():
    model = tiny_model("llama")
    model.config.is_causal = False
    with pytest.raises(kd_hf.LazyAttentionUnsupportedError, match="is_causal"):
        kd_hf.add_lazy_attention(model)
    model = tiny_model("llama")
    model.config.attention_chunk_size = 4
    with pytest.raises(kd_hf.LazyAttentionUnsupportedError, match="chunked"):
        kd_hf.add_lazy_attention(model)
