"""Tiny random transformers models and an independent lazy-attention reference for the tests/test_hf_* files.

The reference (:func:`reference_lazy_attention`) is SPEC section 1 written densely over transformers' own
boolean mask (``sdpa_mask``, never skipped): each query's position is its last visible key, i is its count
of visible keys and the distance is position minus key slot, so it knows nothing of kernel-dispatch's row
layout, shifting, packing or cache handling. It is registered as ``"lazy_reference"``.
"""
from __future__ import annotations

import copy

import torch
from transformers import (AutoModelForCausalLM, LlamaConfig, MistralConfig, PreTrainedModel, Qwen3Config)
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
from transformers.modeling_utils import AttentionInterface

from kernel_dispatch.integrations import transformers as kd_hf

FAMILIES = ("llama", "qwen3", "mistral")
REFERENCE = "lazy_reference"
VOCAB = 128


def tiny_config(family: str, **overrides):
    """2 layers, hidden 64, 4 heads of 16 over 2 kv heads (GQA), vocabulary 128; Mistral keeps its default
    sliding window (4096, longer than any test row)."""
    common = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  intermediate_size=128, vocab_size=VOCAB, max_position_embeddings=256, pad_token_id=0,
                  bos_token_id=None, eos_token_id=None)
    common.update(overrides)
    if family == "llama":
        return LlamaConfig(**common)
    if family == "qwen3":
        return Qwen3Config(head_dim=16, **common)
    if family == "mistral":
        return MistralConfig(**common)
    raise ValueError(f"family: expected one of {FAMILIES}, got {family!r}")


def tiny_model(family: str, dtype: torch.dtype = torch.float64, seed: int = 0, attn: str = "sdpa",
               **overrides) -> PreTrainedModel:
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(family, **overrides), attn_implementation=attn)
    return model.to(dtype).eval()


def lazy_copy(model: PreTrainedModel, window: int = 8, tau_init: float = 0.0, backend=None,
              randomize_seed: int | None = None) -> PreTrainedModel:
    """A deep copy with lazy attention; with ``randomize_seed``, bias ~ N(0, 0.5) and tau ~ U(-0.8, 0.3)."""
    lazy = kd_hf.add_lazy_attention(copy.deepcopy(model), window=window, tau_init=tau_init, backend=backend)
    lazy.to(model.dtype)  # float64 models: float64 bias and tau too (bf16 and fp16 would keep them fp32)
    if randomize_seed is not None:
        g = torch.Generator().manual_seed(randomize_seed)
        with torch.no_grad():
            for m in kd_hf.attention_modules(lazy):
                p = m.lazy_attention
                p.bias.copy_(torch.randn(p.bias.shape, generator=g) * 0.5)
                p.tau.copy_(torch.rand(p.tau.shape, generator=g) * 1.1 - 0.8)
    return lazy


def as_reference(lazy: PreTrainedModel) -> PreTrainedModel:
    """A deep copy of a lazy model that runs the dense reference instead of kernel-dispatch."""
    ref = copy.deepcopy(lazy)
    ref.set_attn_implementation(REFERENCE)
    return ref


def _reference_mask(*args, **kwargs):
    kwargs["allow_is_causal_skip"] = False
    return sdpa_mask(*args, **kwargs)


def reference_lazy_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Dense lazy attention (float64) over a boolean mask [B, 1, Lq, Lkv]; rows that see nothing are zero."""
    p = module.lazy_attention
    q, k, v = query.double(), key.double(), value.double()
    B, H, Lq, D = q.shape
    rep = H // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    Lkv = k.shape[2]
    vis = attention_mask.expand(B, 1, Lq, Lkv)
    slot = torch.arange(Lkv, device=q.device)
    position = torch.where(vis, slot, -1).amax(-1, keepdim=True)
    count = vis.sum(-1, keepdim=True)
    dist = position - slot
    W = p.bias.shape[1]
    near = vis & (dist >= 0) & (dist < W)
    bias = p.bias.double()[:, dist.clamp(0, W - 1)[:, 0]].permute(1, 0, 2, 3)  # [B, H, Lq, Lkv]
    s = (scaling if scaling is not None else D ** -0.5) * q @ k.transpose(-1, -2) + torch.where(near, bias, 0.0)
    s = s.masked_fill(~vis, float("-inf"))
    prob = torch.softmax(s, -1).nan_to_num(0.0)
    a = torch.relu(prob + p.tau.double()[None, :, None, None] / count.clamp(min=1)) * vis
    o = torch.where(count > 0, a @ v, 0.0)
    return o.transpose(1, 2).contiguous().to(query.dtype), None


AttentionInterface.register(REFERENCE, reference_lazy_attention)
AttentionMaskInterface.register(REFERENCE, _reference_mask)


def grads(model: PreTrainedModel, skip_lazy: bool = False) -> dict[str, torch.Tensor]:
    return {n: p.grad for n, p in model.named_parameters()
            if p.grad is not None and not (skip_lazy and ".lazy_attention." in n)}
