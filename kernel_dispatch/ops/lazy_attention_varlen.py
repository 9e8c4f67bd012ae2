"""Lazy attention over packed documents (SPEC section 4): the public function, its contract, its autograd node.

The layout of FlashAttention's varlen functions and torch's ``varlen_attn``: q [T, H, D], k, v [T, Hkv, D],
documents packed one after another, ``cu_seqlens`` [N + 1] int32 their boundaries. Each document is lazy
attention on its own. Custom ops ``kernel_dispatch::lazy_attention_varlen_fwd`` / ``_bwd`` take the backend
name as a string; saved for backward: q, k, v, bias, tau, cu_seqlens, O and the fp32 LSE [H, T].
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch import Tensor

from .. import registry
from ..declaration import Operator, declare
from ._frontend import (backend_pair, call_backward, call_op, check_same_device, check_shape, check_tensor,
                        fmt_shape)
from . import _device_assert
from .lazy_attention import INFO_FACTS, TOLERANCES, LazyAttentionCaps, check_parameters

OP = "lazy_attention_varlen"


@dataclass(frozen=True)
class VarlenCaps(LazyAttentionCaps):
    """Lazy attention limits, for packed documents (no padding to declare)."""

    lengths: bool = False

    def features(self) -> str:
        feats = [f"head_dim {'any' if self.head_dims is None else '/'.join(map(str, self.head_dims))}"]
        return ", ".join(feats + [f for f, ok in (("GQA", self.gqa), ("causal=False", self.non_causal)) if ok])


def _lse_dtype(q: Tensor) -> torch.dtype:
    return torch.float64 if q.dtype == torch.float64 else torch.float32


def _fwd(q: Tensor, k: Tensor, v: Tensor, bias: Tensor, tau: Tensor, cu_seqlens: Tensor, max_seqlen: int,
         scale: float, causal: bool, backend: str) -> tuple[Tensor, Tensor]:
    """O [T, H, D] (q's dtype, contiguous) and LSE [H, T] (fp32) from ``backend``."""
    return registry.kernels(OP, backend).forward(q, k, v, bias, tau, cu_seqlens, max_seqlen, scale, causal)


lazy_attention_varlen_fwd = torch.library.custom_op("kernel_dispatch::lazy_attention_varlen_fwd", _fwd,
                                                    mutates_args=())


@lazy_attention_varlen_fwd.register_fake
def _(q, k, v, bias, tau, cu_seqlens, max_seqlen, scale, causal, backend):
    return q.new_empty(q.shape), q.new_empty((q.shape[1], q.shape[0]), dtype=_lse_dtype(q))


def _bwd(do: Tensor, q: Tensor, k: Tensor, v: Tensor, bias: Tensor, tau: Tensor, o: Tensor, lse: Tensor,
         cu_seqlens: Tensor, max_seqlen: int, scale: float, causal: bool,
         backend: str) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(dq, dk, dv, dbias, dtau), contiguous, in the dtypes of (q, k, v, bias, tau)."""
    return tuple(registry.kernels(OP, backend).backward(do, q, k, v, bias, tau, o, lse, cu_seqlens, max_seqlen,
                                                        scale, causal))


lazy_attention_varlen_bwd = torch.library.custom_op("kernel_dispatch::lazy_attention_varlen_bwd", _bwd,
                                                    mutates_args=())


@lazy_attention_varlen_bwd.register_fake
def _(do, q, k, v, bias, tau, o, lse, cu_seqlens, max_seqlen, scale, causal, backend):
    return (q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), bias.new_empty(bias.shape),
            tau.new_empty(tau.shape))


class LazyAttentionVarlenFunction(torch.autograd.Function):
    """Autograd node: forward through one backend, backward through another (names as strings)."""

    @staticmethod
    def forward(ctx, q, k, v, bias, tau, cu_seqlens, max_seqlen, scale, causal, fwd_backend, bwd_backend):
        o, lse = call_op(lazy_attention_varlen_fwd, _fwd, q, k, v, bias, tau, cu_seqlens, max_seqlen, scale, causal,
                         fwd_backend)
        ctx.save_for_backward(q, k, v, bias, tau, o, lse, cu_seqlens)
        ctx.max_seqlen, ctx.scale, ctx.causal, ctx.bwd_backend = max_seqlen, scale, causal, bwd_backend
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, bias, tau, o, lse, cu_seqlens = ctx.saved_tensors
        grads = call_backward(OP, ctx.bwd_backend, lazy_attention_varlen_bwd, _bwd, do, q, k, v, bias, tau, o, lse,
                              cu_seqlens, ctx.max_seqlen, ctx.scale, ctx.causal, ctx.bwd_backend)
        return (*grads, None, None, None, None, None, None)


def varlen_meta(q: Tensor, k: Tensor, bias: Tensor, causal: bool = True, **_: Any) -> dict:
    """What the registry needs to know about a call to choose a backend."""
    return {"device": q.device.type, "dtype": q.dtype, "head_dim": q.shape[-1], "gqa": q.shape[1] != k.shape[1],
            "causal": bool(causal), "bias_length": bias.shape[1]}


def validate(q, k, v, bias, tau, cu_seqlens, max_seqlen, scale, causal) -> None:
    """Raise TypeError/ValueError naming the argument for anything outside the contract (shapes, dtypes and
    devices; the values of cu_seqlens are checked by :func:`check_cu_seqlens`)."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_tensor(name, t, ndim=3)
    for name, t in (("k", k), ("v", v)):
        if t.dtype != q.dtype:
            raise TypeError(f"{name}: expected the dtype of q ({q.dtype}), got {t.dtype}")
    T, H, D = q.shape
    if T == 0 or H == 0 or D == 0:
        raise ValueError(f"q: expected [T, H, D] with T, H, D >= 1, got shape {fmt_shape(q)}")
    Hkv = k.shape[1]
    if Hkv == 0 or H % Hkv:
        raise ValueError(f"k: its head count Hkv = {Hkv} must divide the {H} heads of q (H % Hkv == 0)")
    check_shape("k", k, (T, Hkv, D), "[T, Hkv, D]")
    check_shape("v", v, (T, Hkv, D), "[T, Hkv, D]")
    check_parameters(bias, tau, scale, H)
    if not isinstance(causal, bool):
        raise TypeError(f"causal: expected a bool, got {type(causal).__name__}")
    check_tensor("cu_seqlens", cu_seqlens, dtypes=(torch.int32,), ndim=1)
    if cu_seqlens.shape[0] < 2:
        raise ValueError(f"cu_seqlens: expected [N + 1] with N >= 1 documents, got shape {fmt_shape(cu_seqlens)}")
    if max_seqlen is not None and (isinstance(max_seqlen, bool) or not isinstance(max_seqlen, int)
                                   or max_seqlen < 1):
        raise ValueError(f"max_seqlen: expected an int >= 1 (the longest document) or None, got {max_seqlen!r}")
    check_same_device(q=q, k=k, v=v, bias=bias, tau=tau, cu_seqlens=cu_seqlens)


def check_cu_seqlens(cu_seqlens: Tensor, T: int, max_seqlen: Optional[int]) -> int:
    """Check the boundaries' values and return the longest document (``max_seqlen`` if given).

    Eagerly on the CPU, or on a GPU without ``max_seqlen``: one read of the values, ValueError naming the
    argument. On a GPU with ``max_seqlen`` given, or while compiling or capturing a CUDA graph, nothing reads the
    device: the same checks run on the device (an error naming the argument when the values arrive, at the next
    synchronisation on a GPU), and without ``max_seqlen`` the kernels are sized for T.
    """
    if (torch.compiler.is_compiling() or (cu_seqlens.is_cuda and max_seqlen is not None)
            or (cu_seqlens.is_cuda and torch.cuda.is_current_stream_capturing())):
        if max_seqlen is not None and _device_assert.available(cu_seqlens):
            _device_assert.assert_cu_seqlens(cu_seqlens, T, max_seqlen)  # one kernel: the torch checks are ten
            return max_seqlen
        msg = _device_assert.CU_MESSAGES
        lens = cu_seqlens[1:] - cu_seqlens[:-1]
        torch._assert_async(cu_seqlens[0] == 0, msg["start"])
        torch._assert_async((lens >= 0).all(), msg["order"])
        torch._assert_async(cu_seqlens[-1] == T, msg["end"])
        if max_seqlen is not None:
            torch._assert_async((lens <= max_seqlen).all(), msg["longest"])
        return T if max_seqlen is None else max_seqlen
    cu = cu_seqlens.tolist()
    if cu[0] != 0:
        raise ValueError(f"cu_seqlens: expected cu_seqlens[0] == 0, got {cu[0]}")
    lens = [b - a for a, b in zip(cu, cu[1:])]
    if min(lens) < 0:
        d = next(i for i, n in enumerate(lens) if n < 0)
        raise ValueError(f"cu_seqlens: expected non-decreasing values, got cu_seqlens[{d}] = {cu[d]} > "
                         f"cu_seqlens[{d + 1}] = {cu[d + 1]}")
    if cu[-1] != T:
        raise ValueError(f"cu_seqlens: expected the last value to be T = q.shape[0] = {T}, got {cu[-1]}")
    longest = max(lens)
    if max_seqlen is not None and max_seqlen < longest:
        raise ValueError(f"max_seqlen: {max_seqlen} is smaller than the longest document ({longest} tokens)")
    return max(1, longest) if max_seqlen is None else max_seqlen


def lazy_attention_varlen(q: Tensor, k: Tensor, v: Tensor, bias: Tensor, tau: Tensor, cu_seqlens: Tensor, *,
                          max_seqlen: int | None = None, scale: float | None = None, causal: bool = True,
                          backend: Any = None) -> Tensor:
    """Lazy attention over documents packed without padding; no token attends across a document boundary.

    Args:
        q: [T, H, D] fp16/bf16/fp32 (fp64 for the golden reference), any strides.
        k, v: [T, Hkv, D], q's dtype; H % Hkv == 0.
        bias: [H, W] fp32, added at distance t = m - n < W within a document (|m - n| when causal=False).
        tau: [H] fp32, the Elastic-Softmax offset.
        cu_seqlens: [N + 1] int32 on q's device: 0 = cu[0] <= cu[1] <= ... <= cu[N] = T; document d holds
            tokens cu[d] .. cu[d+1] - 1 (empty documents allowed).
        max_seqlen: the longest document, if known (spares a device-to-host read).
        scale: score scale, default 1 / sqrt(D).
        causal: True for causal attention within each document (i = m + 1), False for full (i = its length).
        backend: a backend name or (forward, backward) pair; overrides every other choice.

    Returns:
        O [T, H, D] in q's dtype, contiguous. Positions, i and distances count from each document's start.

    Non-finite tensor values propagate as in :func:`kernel_dispatch.lazy_attention`, within each document: a NaN or
    +inf visible score poisons its row, NaN or +inf tau[h] head h; nothing crosses a document boundary.
    """
    validate(q, k, v, bias, tau, cu_seqlens, max_seqlen, scale, causal)
    max_seqlen = check_cu_seqlens(cu_seqlens, q.shape[0], max_seqlen)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    fwd, bwd = backend_pair(OP, varlen_meta(q, k, bias, causal), backend)
    k = k.view_as(k) if k is q else k
    v = v.view_as(v) if v is q or v is k else v
    return LazyAttentionVarlenFunction.apply(q, k, v, bias, tau, cu_seqlens, max_seqlen, scale, causal, fwd, bwd)


def _declaration() -> Operator:
    from . import lazy_attention_varlen_cases as cases

    return Operator(
        name=OP, function=lazy_attention_varlen, capabilities=VarlenCaps, selection_facts=varlen_meta,
        validate=validate, outputs=("o",),
        gradients={"q": "dq", "k": "dk", "v": "dv", "bias": "dbias", "tau": "dtau"},
        env_var="LAZYATTN_BACKEND", group="lazy_attention",
        info_facts=tuple(f for f in INFO_FACTS if f.key != "lengths"),
        per_head={"o": 1, "dq": 1, "dk": 1, "dv": 1}, tolerances=TOLERANCES,
        cases=cases.CASES, make_inputs=cases.make_inputs, bad_values=cases.BAD_VALUES, layouts=cases.LAYOUTS,
        bench="kernel_dispatch.ops.lazy_attention_varlen_bench")


DECLARATION = declare(_declaration())
