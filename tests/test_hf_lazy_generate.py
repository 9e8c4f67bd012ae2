"""Lazy attention inside transformers beyond one training batch: generate() with caches, packed documents,
save_pretrained / from_pretrained. Tiny random models with nonzero bias and tau (tests/hf_tiny.py)."""
from __future__ import annotations

import pytest

pytest.importorskip("transformers", minversion="5.23")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from transformers import DataCollatorWithFlattening, DynamicCache  # noqa: E402

import kernel_dispatch as kd  # noqa: E402
from kernel_dispatch.integrations import transformers as kd_hf  # noqa: E402
from kernel_dispatch.testing.matrix import rel_err  # noqa: E402

from .hf_tiny import FAMILIES, VOCAB, as_reference, grads, lazy_copy, tiny_model  # noqa: E402

RTOL64 = 2.0 ** -52 * 2 ** 20
GREEDY = dict(max_new_tokens=8, do_sample=False)


def _lazy(family: str, dtype=torch.float32):
    return lazy_copy(tiny_model(family, dtype), randomize_seed=5, backend="golden")


def _prompts(B: int = 2, L: int = 6, seed: int = 4):
    return torch.randint(1, VOCAB, (B, L), generator=torch.Generator().manual_seed(seed))


def _spy(monkeypatch, name: str) -> list:
    calls = []
    real = getattr(kd.ops, name)
    monkeypatch.setattr(kd.ops, name, lambda *a, **k: calls.append(a[0].shape) or real(*a, **k))
    return calls


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_greedy_generate_with_cache_equals_no_cache(family, cache, monkeypatch):
    model = _lazy(family)
    ids = _prompts()
    want = model.generate(ids, use_cache=False, **GREEDY)
    decode = _spy(monkeypatch, "lazy_attention_with_kvcache")
    got = model.generate(ids, cache_implementation=cache, **GREEDY)
    assert torch.equal(got, want)
    assert len(decode) == 2 * (GREEDY["max_new_tokens"] - 1)  # every decode step of both layers
    assert all(shape[2] == 1 for shape in decode)  # one query per row, keys from the cache


@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_left_padded_batch_generates_each_row_as_alone(cache):
    model = _lazy("llama")
    ids = _prompts(L=7)
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    ids = ids.masked_fill(mask == 0, 0)
    batched = model.generate(ids, attention_mask=mask, cache_implementation=cache, **GREEDY)
    for row, start in ((0, 0), (1, 3)):
        alone = model.generate(ids[row:row + 1, start:], cache_implementation=cache, **GREEDY)
        assert torch.equal(batched[row, start:], alone[0]), row


def test_right_padded_prompt_raises_in_generate():
    model = _lazy("llama")
    ids = _prompts()
    mask = torch.ones_like(ids)
    mask[0, -2:] = 0
    with pytest.raises(kd_hf.LazyAttentionUnsupportedError, match="padding between valid tokens"):
        model.generate(ids, attention_mask=mask, **GREEDY)


@pytest.mark.parametrize("grad", [False, True], ids=["no_grad", "grad"])
def test_cached_chunk_equals_dense_reference(grad):
    """A chunk of 3 new tokens over a cache of 5 (left-padded row included); with gradients enabled the
    differentiable path runs and bias and tau get the reference's gradients."""
    lazy = lazy_copy(tiny_model("qwen3"), randomize_seed=6, backend="golden")
    ref = as_reference(lazy)
    ids = _prompts(L=8, seed=7)
    mask = torch.ones_like(ids)
    mask[0, :2] = 0
    outs = []
    for model in (lazy, ref):
        cache = DynamicCache(config=model.config)
        with torch.no_grad():
            model(input_ids=ids[:, :5], attention_mask=mask[:, :5], cache=cache)
        with torch.set_grad_enabled(grad):
            logits = model(input_ids=ids[:, 5:], attention_mask=mask, cache=cache).logits
        if grad:
            logits.pow(2).sum().backward()
        outs.append(logits.detach())
    assert rel_err(outs[0], outs[1]) <= RTOL64
    if grad:
        for name, g in grads(ref).items():
            assert rel_err(grads(lazy)[name], g) <= RTOL64, name


def _documents():
    g = torch.Generator().manual_seed(8)
    return [torch.randint(1, VOCAB, (n,), generator=g).tolist() for n in (5, 1, 9, 3)]


def _token_loss(logits, ids):
    return F.cross_entropy(logits[:-1], ids[1:], reduction="sum")


@pytest.mark.parametrize("flash_kwargs", [False, True], ids=["position_ids", "cu_seq_lens"])
@pytest.mark.parametrize("use_cache", [False, None], ids=["use_cache_false", "use_cache_default"])
def test_packed_batch_equals_documents_one_by_one(flash_kwargs, use_cache, monkeypatch):
    """DataCollatorWithFlattening: logits and gradients (summed token losses) equal the documents run alone,
    whether transformers builds a packed mask (use_cache=False) or not (a cache object is created)."""
    docs = _documents()
    alone = _lazy("mistral", torch.float64)
    packed = lazy_copy(alone, window=8)  # same weights, bias and tau
    packed.load_state_dict(alone.state_dict())
    want = [alone(input_ids=torch.tensor([d])).logits[0] for d in docs]
    sum(_token_loss(lg, torch.tensor(d)) for lg, d in zip(want, docs)).backward()
    batch = DataCollatorWithFlattening(return_flash_attn_kwargs=flash_kwargs)([{"input_ids": d} for d in docs])
    varlen = _spy(monkeypatch, "lazy_attention_varlen")
    kwargs = {} if use_cache is None else {"use_cache": use_cache}
    got = packed(input_ids=batch["input_ids"], position_ids=batch["position_ids"],
                 **{k: batch[k] for k in ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")
                    if k in batch}, **kwargs).logits[0]
    bounds = [0, 5, 6, 15, 18]
    sum(_token_loss(got[a:b], batch["input_ids"][0, a:b]) for a, b in zip(bounds[:-1], bounds[1:])).backward()
    assert len(varlen) == 2
    assert rel_err(got.detach(), torch.cat(want).detach()) <= RTOL64
    for name, g in grads(alone).items():
        assert rel_err(grads(packed)[name], g) <= RTOL64, name


def test_cu_seq_lens_disagreeing_with_position_ids_raises():
    model = _lazy("llama")
    batch = DataCollatorWithFlattening(return_flash_attn_kwargs=True)([{"input_ids": d} for d in _documents()])
    with pytest.raises(kd_hf.LazyAttentionUnsupportedError, match="cu_seq_lens_q"):
        model(input_ids=batch["input_ids"], position_ids=batch["position_ids"], use_cache=False,
              cu_seq_lens_q=torch.tensor([0, 6, 18], dtype=torch.int32),
              cu_seq_lens_k=torch.tensor([0, 6, 18], dtype=torch.int32))


def test_save_and_reload_keep_bias_tau_and_attention(tmp_path, capfd):
    model = _lazy("qwen3")
    model.save_pretrained(tmp_path)
    reloaded = kd_hf.from_pretrained(str(tmp_path), backend="golden")
    assert "UNEXPECTED" not in capfd.readouterr().err  # the lazy tensors are read, not left over
    assert type(reloaded) is type(model)
    assert reloaded.config._attn_implementation == kd_hf.ATTN_IMPLEMENTATION
    assert reloaded.config.lazy_attention == model.config.lazy_attention
    for (n, p), (m, q) in zip(model.named_parameters(), reloaded.named_parameters()):
        assert n == m and torch.equal(p, q), n
    ids = _prompts(L=9)
    with torch.no_grad():
        assert torch.equal(reloaded(input_ids=ids).logits, model(input_ids=ids).logits)
    assert torch.equal(reloaded.generate(ids, **GREEDY), model.generate(ids, **GREEDY))


def test_reload_of_a_model_without_lazy_attention_raises(tmp_path):
    tiny_model("llama").save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="not saved with lazy attention"):
        kd_hf.from_pretrained(str(tmp_path))


@pytest.mark.slow
def test_static_cache_generate_compiled_equals_no_cache():
    """generate() compiles the forward for static caches on a GPU; the attention call runs eagerly inside it
    (torch.compiler.disable). Here the same path on the CPU through dynamo's eager backend."""
    from transformers import CompileConfig

    model = _lazy("llama")
    ids = _prompts()
    want = model.generate(ids, use_cache=False, **GREEDY)
    config = CompileConfig(backend="eager", mode=None)
    config._compile_all_devices = True
    got = model.generate(ids, cache_implementation="static", compile_config=config, **GREEDY)
    assert torch.equal(got, want)
