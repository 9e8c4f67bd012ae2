"""Lazy attention: the public function, its input contract and its autograd front end.

The forward and backward are the custom ops ``kernel_dispatch::lazy_attention_fwd`` and
``kernel_dispatch::lazy_attention_bwd``, each taking the backend name as a string, so the
forward of one backend composes with the backward of another. Saved for backward: q, k, v,
bias, tau, lengths, O and the fp32 LSE [B, H, L].
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Optional

import torch
from torch import Tensor

from .. import registry
from ..declaration import BadValues, Capabilities, Fact, Operator, RangeCheck, Tolerance, declare
from ._frontend import (PARAM_DTYPES, backend_pair, call_backward, call_op, check_float, check_same_device,
                        check_shape, check_tensor, check_values, fmt_shape)

OP = "lazy_attention"


@dataclass(frozen=True)
class LazyAttentionCaps(Capabilities):
    """Lazy attention limits: head dims (None: any), the longest bias, and the features a kernel may lack."""

    head_dims: tuple[int, ...] | None = None
    max_bias_length: int | None = None
    gqa: bool = True
    lengths: bool = True
    non_causal: bool = True

    def operator_reasons(self, meta: Mapping[str, Any]) -> list[str]:
        r = []
        hd = meta.get("head_dim")
        if hd is not None and self.head_dims is not None and hd not in self.head_dims:
            r.append(f"head_dim {hd} not in {{{', '.join(map(str, self.head_dims))}}}")
        w = meta.get("bias_length")
        if w is not None and self.max_bias_length is not None and w > self.max_bias_length:
            r.append(f"bias length {w} > {self.max_bias_length}")
        if meta.get("gqa") and not self.gqa:
            r.append("grouped-query attention (H != Hkv) not supported")
        if meta.get("lengths") and not self.lengths:
            r.append("lengths (padding) not supported")
        if meta.get("causal") is False and not self.non_causal:
            r.append("causal=False not supported")
        return r

    def features(self) -> str:
        feats = [f"head_dim {'any' if self.head_dims is None else '/'.join(map(str, self.head_dims))}"]
        feats += [f for f, ok in (("GQA", self.gqa), ("lengths", self.lengths), ("causal=False", self.non_causal))
                  if ok]
        return ", ".join(feats)


def _lse_dtype(q: Tensor) -> torch.dtype:
    return torch.float64 if q.dtype == torch.float64 else torch.float32


def _fwd(q: Tensor, k: Tensor, v: Tensor, bias: Tensor, tau: Tensor, scale: float, lengths: Optional[Tensor],
         causal: bool, backend: str) -> tuple[Tensor, Tensor]:
    """O [B, H, L, D] (q's dtype, contiguous) and LSE [B, H, L] (fp32) from ``backend``."""
    return registry.kernels(OP, backend).forward(q, k, v, bias, tau, scale, lengths, causal)


lazy_attention_fwd = torch.library.custom_op("kernel_dispatch::lazy_attention_fwd", _fwd, mutates_args=())


@lazy_attention_fwd.register_fake
def _(q, k, v, bias, tau, scale, lengths, causal, backend):
    return q.new_empty(q.shape), q.new_empty(q.shape[:3], dtype=_lse_dtype(q))


def _bwd(do: Tensor, q: Tensor, k: Tensor, v: Tensor, bias: Tensor, tau: Tensor, o: Tensor, lse: Tensor, scale: float,
         lengths: Optional[Tensor], causal: bool, backend: str) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(dq, dk, dv, dbias, dtau), contiguous, in the dtypes of (q, k, v, bias, tau)."""
    return tuple(registry.kernels(OP, backend).backward(do, q, k, v, bias, tau, o, lse, scale, lengths, causal))


lazy_attention_bwd = torch.library.custom_op("kernel_dispatch::lazy_attention_bwd", _bwd, mutates_args=())


@lazy_attention_bwd.register_fake
def _(do, q, k, v, bias, tau, o, lse, scale, lengths, causal, backend):
    return (q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), bias.new_empty(bias.shape),
            tau.new_empty(tau.shape))


class LazyAttentionFunction(torch.autograd.Function):
    """Autograd node: forward through one backend, backward through another (names as strings)."""

    @staticmethod
    def forward(ctx, q, k, v, bias, tau, scale, lengths, causal, fwd_backend, bwd_backend):
        o, lse = call_op(lazy_attention_fwd, _fwd, q, k, v, bias, tau, scale, lengths, causal, fwd_backend)
        ctx.save_for_backward(q, k, v, bias, tau, o, lse, lengths)
        ctx.scale, ctx.causal, ctx.bwd_backend = scale, causal, bwd_backend
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, bias, tau, o, lse, lengths = ctx.saved_tensors
        dq, dk, dv, dbias, dtau = call_backward(OP, ctx.bwd_backend, lazy_attention_bwd, _bwd, do, q, k, v, bias,
                                                tau, o, lse, ctx.scale, lengths, ctx.causal, ctx.bwd_backend)
        return dq, dk, dv, dbias, dtau, None, None, None, None, None


def lazy_attention_meta(q: Tensor, k: Tensor, bias: Tensor, lengths: Optional[Tensor] = None,
                        causal: bool = True) -> dict:
    """What the registry needs to know about a call to choose a backend."""
    return {"device": q.device.type, "dtype": q.dtype, "head_dim": q.shape[-1], "gqa": q.shape[1] != k.shape[1],
            "lengths": lengths is not None, "causal": bool(causal), "bias_length": bias.shape[1]}


def check_parameters(bias, tau, scale, H: int) -> None:
    """The checks every lazy attention operator makes of bias [H, W], tau [H] and scale."""
    check_tensor("bias", bias, dtypes=PARAM_DTYPES, ndim=2)
    if bias.shape[0] != H or bias.shape[1] < 1:
        raise ValueError(f"bias: expected shape [H, W] = [{H}, W] with W >= 1, got {fmt_shape(bias)}")
    check_tensor("tau", tau, dtypes=PARAM_DTYPES, ndim=1)
    check_shape("tau", tau, (H,), "[H]")
    if scale is not None:
        check_float("scale", scale)


def validate(q, k, v, bias, tau, scale, lengths, causal) -> None:
    """Raise TypeError/ValueError naming the argument for anything outside the contract."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_tensor(name, t, ndim=4)
    for name, t in (("k", k), ("v", v)):
        if t.dtype != q.dtype:
            raise TypeError(f"{name}: expected the dtype of q ({q.dtype}), got {t.dtype}")
    B, H, L, D = q.shape
    if L == 0:
        raise ValueError(f"q: empty sequence (L = 0) in shape {fmt_shape(q)}; expected L >= 1")
    if B == 0 or H == 0 or D == 0:
        raise ValueError(f"q: expected B, H, D >= 1, got shape {fmt_shape(q)}")
    Hkv = k.shape[1]
    if Hkv == 0 or H % Hkv:
        raise ValueError(f"k: its head count Hkv = {Hkv} must divide the {H} heads of q (H % Hkv == 0)")
    check_shape("k", k, (B, Hkv, L, D), "[B, Hkv, L, D]")
    check_shape("v", v, (B, Hkv, L, D), "[B, Hkv, L, D]")
    check_parameters(bias, tau, scale, H)
    if not isinstance(causal, bool):
        raise TypeError(f"causal: expected a bool, got {type(causal).__name__}")
    if lengths is not None:
        check_tensor("lengths", lengths, dtypes=(torch.int32, torch.int64), ndim=1)
        check_shape("lengths", lengths, (B,), "[B]")
    check_same_device(q=q, k=k, v=v, bias=bias, tau=tau, lengths=lengths)
    check_values(value_checks(q, lengths))


def value_checks(q: Tensor, lengths: Optional[Tensor]) -> tuple[RangeCheck, ...]:
    """lengths [B] in [1, L], checked on every call (no cache: an in-place write, ``.data`` included, is always
    seen): read on the host for CPU tensors, asserted on the device otherwise (see ``_frontend.check_values``)."""
    if lengths is None:
        return ()
    L = q.shape[2]
    known = f" = [1, {L}]" if type(L) is int else ""  # a symbolic L (dynamic shapes) is not formatted
    return (RangeCheck("lengths", lengths, 1, L, f"every value in [1, L]{known}"),)


def lazy_attention(q: Tensor, k: Tensor, v: Tensor, bias: Tensor, tau: Tensor, *, scale: float | None = None,
                   lengths: Tensor | None = None, causal: bool = True, backend: Any = None) -> Tensor:
    """Lazy attention: distance-biased scores and Elastic-Softmax relu(softmax + tau / i).

    Args:
        q: [B, H, L, D] fp16/bf16/fp32 (fp64 for the golden reference), any strides.
        k, v: [B, Hkv, L, D], q's dtype; H % Hkv == 0 (query head h reads kv head h // (H // Hkv)).
        bias: [H, W] fp32, added at causal distance t = m - n < W (|m - n| when causal=False).
        tau: [H] fp32, the Elastic-Softmax offset (usually initialised to -1).
        scale: score scale, default 1 / sqrt(D).
        lengths: optional [B] int32/int64 in [1, L]; keys and output rows past lengths[b] are
            masked and zero. Checked on every call without a device-to-host read: on CUDA, and under
            torch.compile or CUDA-graph capture, by torch._assert_async (a device-side assert that prints
            the message); eager CPU tensors are read (a ValueError naming lengths).
        causal: True for causal attention (i = m + 1), False for full (i = valid key count).
        backend: a backend name or (forward, backward) pair; overrides every other choice.

    Returns:
        O [B, H, L, D] in q's dtype, contiguous.

    Non-finite tensor values are not checked (that would read the device); they propagate as in the golden
    backend. A NaN or +inf score S[m, n] at a visible position (from q[m], k[n] or bias) makes output row m
    non-finite and no other row; a -inf score acts as a masked key. NaN or +inf tau[h] makes every row of head h
    non-finite. A non-finite v[n] reaches every row that sees key n. Padded positions (past lengths[b]) reach
    nothing, whatever they hold: padded output rows and their gradients stay exactly zero. The Triton and TileLang
    kernels keep scores in log2 units: a finite score or bias beyond 2.36e38 (FLT_MAX / log2 e) in magnitude makes
    the rows that see it NaN there (golden keeps it finite), never a wrong finite value.
    """
    validate(q, k, v, bias, tau, scale, lengths, causal)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    fwd, bwd = backend_pair(OP, lazy_attention_meta(q, k, bias, lengths, causal), backend)
    # torch.compile cannot trace an autograd.Function given one tensor twice (self-attention on q = k).
    k = k.view_as(k) if k is q else k
    v = v.view_as(v) if v is q or v is k else v
    return LazyAttentionFunction.apply(q, k, v, bias, tau, scale, lengths, causal, fwd, bwd)


# Rounding counts (c_round, c_acc) of each tensor: see kernel_dispatch.testing.matrix.tolerance.
TOLERANCES = {"o": Tolerance(4, 256), **{g: Tolerance(8, 1024) for g in ("dq", "dk", "dv", "dbias", "dtau")}}

INFO_FACTS = (
    Fact("head_dim", "--head-dim", 128, "lazy attention head dim"),
    Fact("bias_length", "--bias-length", 512, "lazy attention bias length W"),
    Fact("gqa", "--gqa", False, "grouped-query attention (H != Hkv)"),
    Fact("lengths", "--lengths", False, "right padding (lengths given)"),
    Fact("causal", "--non-causal", False, "causal=False", invert=True),
)


def _declaration() -> Operator:
    from . import lazy_attention_cases as cases

    return Operator(
        name=OP, function=lazy_attention, capabilities=LazyAttentionCaps, selection_facts=lazy_attention_meta,
        validate=validate, outputs=("o",),
        gradients={"q": "dq", "k": "dk", "v": "dv", "bias": "dbias", "tau": "dtau"},
        env_var="LAZYATTN_BACKEND", group="lazy_attention", info_facts=INFO_FACTS,
        per_head={"o": 1, "dq": 1, "dk": 1, "dv": 1}, tolerances=TOLERANCES,
        cases=cases.CASES, make_inputs=cases.make_inputs, bench="kernel_dispatch.ops.lazy_attention_bench",
        value_checks=value_checks, bad_values=cases.BAD_VALUES, layouts=cases.LAYOUTS,
        layout_case="gqa")  # several key blocks, keys beyond the bias band (the dq kernel's far sweep reads O)


DECLARATION = declare(_declaration())
