"""Lazy attention with a KV cache (SPEC section 5, inference): the public function and its contract.

Forward only. New keys and values, when given, are written into the cache in place here (one scatter
each, no host read), then the custom op ``kernel_dispatch::lazy_attention_with_kvcache_fwd`` runs the
chosen backend over the first n_b = cache_seqlens[b] (+ Lq) keys of each row.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Optional

import torch
from torch import Tensor

from .. import registry
from ..declaration import Fact, Operator, RangeCheck, declare
from ._frontend import (backend_pair, call_op, check_same_device, check_shape, check_tensor, check_values,
                        fmt_shape)
from .lazy_attention import INFO_FACTS, TOLERANCES, LazyAttentionCaps, check_parameters

OP = "lazy_attention_with_kvcache"


@dataclass(frozen=True)
class KVCacheCaps(LazyAttentionCaps):
    """Lazy attention limits for cached keys: head dims, bias length, GQA, and the longest query block."""

    max_q_len: int | None = None
    lengths: bool = False
    non_causal: bool = False

    def operator_reasons(self, meta: Mapping[str, Any]) -> list[str]:
        r = super().operator_reasons(meta)
        lq = meta.get("q_len")
        if lq is not None and self.max_q_len is not None and lq > self.max_q_len:
            r.append(f"Lq {lq} > {self.max_q_len}")
        return r

    def features(self) -> str:
        feats = [f"head_dim {'any' if self.head_dims is None else '/'.join(map(str, self.head_dims))}"]
        feats += ["GQA"] if self.gqa else []
        feats.append(f"Lq <= {self.max_q_len}" if self.max_q_len is not None else "any Lq")
        return ", ".join(feats)


def _fwd(q: Tensor, k_cache: Tensor, v_cache: Tensor, bias: Tensor, tau: Tensor, seqlens_k: Tensor, scale: float,
         backend: str) -> Tensor:
    """O [B, H, Lq, D] in q's dtype from ``backend``; row b attends over its first seqlens_k[b] keys."""
    return registry.kernels(OP, backend).forward(q, k_cache, v_cache, bias, tau, seqlens_k, scale)


lazy_attention_with_kvcache_fwd = torch.library.custom_op("kernel_dispatch::lazy_attention_with_kvcache_fwd", _fwd,
                                                          mutates_args=())


@lazy_attention_with_kvcache_fwd.register_fake
def _(q, k_cache, v_cache, bias, tau, seqlens_k, scale, backend):
    return q.new_empty(q.shape)


def kvcache_meta(q: Tensor, k_cache: Tensor, bias: Tensor, **_: Any) -> dict:
    """What the registry needs to know about a call to choose a backend."""
    return {"device": q.device.type, "dtype": q.dtype, "head_dim": q.shape[-1],
            "gqa": q.shape[1] != k_cache.shape[1], "bias_length": bias.shape[1], "q_len": q.shape[2]}


def validate(q, k_cache, v_cache, bias, tau, cache_seqlens, k, v, scale) -> None:
    """Raise TypeError/ValueError naming the argument for anything outside the contract (shapes, dtypes, devices,
    gradients; the values of cache_seqlens are checked by :func:`check_cache_seqlens`)."""
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        check_tensor(name, t, ndim=4)
    B, H, Lq, D = q.shape
    if min(B, H, Lq, D) == 0:
        raise ValueError(f"q: expected [B, H, Lq, D] with every size >= 1, got shape {fmt_shape(q)}")
    Hkv, S = k_cache.shape[1], k_cache.shape[2]
    if Hkv == 0 or H % Hkv:
        raise ValueError(f"k_cache: its head count Hkv = {Hkv} must divide the {H} heads of q (H % Hkv == 0)")
    check_shape("k_cache", k_cache, (B, Hkv, S, D), "[B, Hkv, S, D]")
    check_shape("v_cache", v_cache, (B, Hkv, S, D), "[B, Hkv, S, D] (k_cache's shape)")
    if (k is None) != (v is None):
        raise ValueError(f"{'v' if k is not None else 'k'}: k and v are given together or not at all")
    news = (("k", k), ("v", v)) if k is not None else ()
    for name, t in news:
        check_tensor(name, t, ndim=4)
        check_shape(name, t, (B, Hkv, Lq, D), "[B, Hkv, Lq, D]")
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)) + news:
        if t.dtype != q.dtype:
            raise TypeError(f"{name}: expected the dtype of q ({q.dtype}), got {t.dtype}")
    check_parameters(bias, tau, scale, H)
    check_tensor("cache_seqlens", cache_seqlens, dtypes=(torch.int32,), ndim=1)
    check_shape("cache_seqlens", cache_seqlens, (B,), "[B]")
    grads = torch.is_grad_enabled()
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache), ("bias", bias), ("tau", tau)) + news:
        if grads and t.requires_grad:
            raise ValueError(f"{name}: requires grad, but lazy_attention_with_kvcache is forward only (inference); "
                             "call it under torch.no_grad() or torch.inference_mode(), or detach it; train with "
                             "kd.lazy_attention")
    check_same_device(q=q, k_cache=k_cache, v_cache=v_cache, bias=bias, tau=tau, cache_seqlens=cache_seqlens, k=k, v=v)


def check_cache_seqlens(cache_seqlens: Tensor, q_len: int, capacity: int, appended: bool) -> None:
    """Every row's key count n_b (cache_seqlens[b], + Lq when new keys are appended) in [Lq, S].

    Eager: one device-to-host read, ValueError naming the argument. While compiling or capturing a CUDA graph
    (a decode step) nothing may read the device: the same bounds are one device-side check
    (:func:`~kernel_dispatch.ops._frontend.check_values`, one kernel in a captured step).
    """
    extra = q_len if appended else 0
    if torch.compiler.is_compiling() or (cache_seqlens.is_cuda and torch.cuda.is_current_stream_capturing()):
        low, high = max(0, q_len - extra), capacity - extra
        check_values([RangeCheck("cache_seqlens", cache_seqlens, low, high,
                                 f"every value in [{low}, {high}]: values >= 0, and each row's keys (cached"
                                 f"{' + Lq new' if extra else ''}) at least Lq = {q_len} and at most the cache "
                                 f"capacity S = {capacity}")])
        return
    lo, hi = torch.stack(torch.aminmax(cache_seqlens)).tolist()
    if lo < 0:
        raise ValueError(f"cache_seqlens: expected values >= 0, got min {lo}")
    if hi + extra > capacity:
        raise ValueError(f"cache_seqlens: a row holds {hi} cached tokens{f' + {extra} new' if extra else ''} > the "
                         f"cache capacity S = {capacity} (k_cache.shape[2])")
    if lo + extra < q_len:
        raise ValueError(f"cache_seqlens: a row has {lo + extra} keys, fewer than the Lq = {q_len} queries; without k/v "
                         "the new keys must already be in the cache and counted")


def append_to_cache(cache: Tensor, new: Tensor, cache_seqlens: Tensor) -> None:
    """cache[b, :, cache_seqlens[b] + j] = new[b, :, j] in place, for every row b and new token j."""
    B, Hkv, Lq, D = new.shape
    pos = cache_seqlens.long()[:, None] + torch.arange(Lq, device=new.device)  # [B, Lq]
    cache.scatter_(2, pos[:, None, :, None].expand(B, Hkv, Lq, D), new)


def lazy_attention_with_kvcache(q: Tensor, k_cache: Tensor, v_cache: Tensor, bias: Tensor, tau: Tensor,
                                cache_seqlens: Tensor, *, k: Optional[Tensor] = None, v: Optional[Tensor] = None,
                                scale: float | None = None, backend: Any = None) -> Tensor:
    """Lazy attention of new queries over a KV cache (decoding, chunked prefill, speculative verification).

    Args:
        q: [B, H, Lq, D] fp16/bf16/fp32 (fp64 for the golden reference): the new queries.
        k_cache, v_cache: [B, Hkv, S, D], q's dtype; S is the capacity; H % Hkv == 0.
        bias: [H, W] fp32; tau: [H] fp32 (as for :func:`kernel_dispatch.lazy_attention`).
        cache_seqlens: [B] int32 on q's device, the valid tokens already cached in each row.
        k, v: optional [B, Hkv, Lq, D]: written into the caches in place at positions
            cache_seqlens[b] .. cache_seqlens[b] + Lq - 1 (the caller advances cache_seqlens afterwards);
            row b then attends over n_b = cache_seqlens[b] + Lq keys, else over n_b = cache_seqlens[b].
        scale: score scale, default 1 / sqrt(D).
        backend: a backend name; overrides every other choice.

    Query j of row b sits at position p = n_b - Lq + j (bottom-right alignment): it sees keys 0 .. p with
    i = p + 1 and distances p - n, so it equals row p of :func:`kernel_dispatch.lazy_attention` over the row's
    first n_b tokens. Forward only: with grad mode on, an input that requires grad is an error (run it under
    ``torch.no_grad()``); n_b > S or Lq > n_b is an error.

    Returns:
        O [B, H, Lq, D] in q's dtype, contiguous.

    Non-finite tensor values propagate as in :func:`kernel_dispatch.lazy_attention`: a NaN or +inf visible score
    poisons its query row; cache entries past a row's n_b keys reach nothing, whatever they hold.
    """
    validate(q, k_cache, v_cache, bias, tau, cache_seqlens, k, v, scale)
    check_cache_seqlens(cache_seqlens, q.shape[2], k_cache.shape[2], appended=k is not None)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    fwd, _ = backend_pair(OP, kvcache_meta(q, k_cache, bias), backend)
    seqlens_k = cache_seqlens
    if k is not None:
        append_to_cache(k_cache, k, cache_seqlens)
        append_to_cache(v_cache, v, cache_seqlens)
        seqlens_k = cache_seqlens + q.shape[2]
    return call_op(lazy_attention_with_kvcache_fwd, _fwd, q, k_cache, v_cache, bias, tau, seqlens_k, scale, fwd)


def _declaration() -> Operator:
    from . import lazy_attention_with_kvcache_cases as cases

    facts = tuple(f for f in INFO_FACTS if f.key not in ("lengths", "causal"))
    return Operator(
        name=OP, function=lazy_attention_with_kvcache, capabilities=KVCacheCaps, selection_facts=kvcache_meta,
        validate=validate, outputs=("o",), mutated=("k_cache", "v_cache"),
        env_var="LAZYATTN_BACKEND", group="lazy_attention",
        info_facts=facts + (Fact("q_len", "--q-len", 1, "lazy attention with a KV cache: new queries Lq"),),
        per_head={"o": 1}, tolerances={"o": TOLERANCES["o"]},
        cases=cases.CASES, make_inputs=cases.make_inputs, bad_values=cases.BAD_VALUES,
        bench="kernel_dispatch.ops.lazy_attention_with_kvcache_bench")


DECLARATION = declare(_declaration())
