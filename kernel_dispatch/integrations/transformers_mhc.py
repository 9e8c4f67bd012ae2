"""Kernel mHC for transformers' DeepSeek-V4: the hyper-connections and the layer combine on kd.mhc_pre / mhc_post.

transformers' ``DeepseekV4HyperConnection`` is SPEC section 2 with ``fn`` = phi [M, n*D], ``scale`` =
alpha [3], ``base`` = bias [M], no RMSNorm weight (gamma None), ``hc_sinkhorn_iters`` iterations,
post_mult 2, ``rms_norm_eps`` = norm_eps and ``hc_eps`` = pre_eps = sinkhorn_eps; its ``comb`` [in, out]
is h_res. The decoder layer's combine ``post * f + comb^T @ x`` is SPEC section 3.

``DeepseekV4HyperHead`` (the final collapse) is the "pre" part alone with n rows of weights: it maps onto
mhc_pre with phi, alpha and bias padded by zeros for the post and res rows (whose outputs are discarded,
so their gradients are zero) and one Sinkhorn iteration.

:func:`use_kernel_mhc` swaps the class of each decoder layer and of the head for a subclass whose forward
calls kernel-dispatch: parameters, state-dict keys and checkpoints stay transformers' own.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn
from transformers.models.deepseek_v4.modeling_deepseek_v4 import (DeepseekV4DecoderLayer, DeepseekV4HyperConnection,
                                                                  DeepseekV4HyperHead)

from .. import ops


def hyper_connection_pre(hc: DeepseekV4HyperConnection, x: Tensor, backend: Any = None) -> tuple[Tensor, ...]:
    """``kd.mhc_pre`` with the parameters of one hyper-connection.

    Args:
        hc: transformers' hyper-connection module (fn [M, n*D], base [M], scale [3]).
        x: [B, S, n, D] streams in the model's dtype.

    Returns:
        collapsed [B, S, D] (x's dtype), post [B, S, n] fp32, comb [B, S, n, n] fp32 ([in, out]), and x
        itself for :func:`kd.mhc_post` (its two gradients summed inside the pre backward).
    """
    return ops.mhc_pre(x, hc.fn.float(), hc.scale.float(), hc.base.float(), None,
                       sinkhorn_iters=hc.hc_sinkhorn_iters, post_mult=2.0, norm_eps=hc.input_norm.eps,
                       pre_eps=hc.hc_eps, sinkhorn_eps=hc.hc_eps, backend=backend, return_residual=True)


class KernelMHCDecoderLayer(DeepseekV4DecoderLayer):
    """DeepSeek-V4 decoder layer whose mHC (both hyper-connections and both combines) runs on kernel-dispatch."""

    kd_backend: Any = None

    def forward(self, hidden_states: Tensor, input_ids: Tensor | None = None, **kwargs: Any) -> Tensor:
        dtype = hidden_states.dtype
        collapsed, post, comb, residual = hyper_connection_pre(self.attn_hc, hidden_states, self.kd_backend)
        attn_output, _ = self.self_attn(self.input_layernorm(collapsed), **kwargs)
        hidden_states = ops.mhc_post(attn_output.to(dtype), residual, post, comb, backend=self.kd_backend)
        collapsed, post, comb, residual = hyper_connection_pre(self.ffn_hc, hidden_states, self.kd_backend)
        mlp_output = self.mlp(self.post_attention_layernorm(collapsed), input_ids=input_ids)
        return ops.mhc_post(mlp_output.to(dtype), residual, post, comb, backend=self.kd_backend)


class KernelMHCHyperHead(DeepseekV4HyperHead):
    """DeepSeek-V4's final stream collapse on ``kd.mhc_pre`` (post and res rows zero-padded and unused)."""

    kd_backend: Any = None

    def forward(self, x: Tensor) -> Tensor:
        n, width = self.hc_fn.shape
        extra = n * n + n
        phi = torch.cat([self.hc_fn.float(), self.hc_fn.new_zeros(extra, width, dtype=torch.float32)])
        alpha = torch.cat([self.hc_scale.float(), self.hc_scale.new_zeros(2, dtype=torch.float32)])
        bias = torch.cat([self.hc_base.float(), self.hc_base.new_zeros(extra, dtype=torch.float32)])
        collapsed, _, _ = ops.mhc_pre(x, phi, alpha, bias, None, sinkhorn_iters=1, post_mult=2.0,
                                      norm_eps=self.input_norm.eps, pre_eps=self.eps, sinkhorn_eps=self.eps,
                                      backend=self.kd_backend)
        return collapsed


def use_kernel_mhc(model: nn.Module, *, backend: Any = None, head: bool = True) -> nn.Module:
    """Run every DeepSeek-V4 hyper-connection of ``model`` through kernel-dispatch's mHC operators.

    Args:
        model: a transformers DeepSeek-V4 model (``DeepseekV4ForCausalLM`` or ``DeepseekV4Model``).
        backend: None (the usual selection: ``kd.use_backend``, ``MHC_BACKEND``, YAML, auto), a backend name
            or a (forward, backward) pair, for both mhc_pre and mhc_post.
        head: also serve the final ``DeepseekV4HyperHead``.

    Returns:
        the same model, modified in place (state-dict keys unchanged). Calling it again sets the backend.
    """
    if backend is not None and not isinstance(backend, (str, tuple, list)):
        raise TypeError(f"backend: expected None, a backend name or a (forward, backward) pair, "
                        f"got {type(backend).__name__}")
    layers = [m for m in model.modules() if isinstance(m, DeepseekV4DecoderLayer)]
    if not layers:
        raise ValueError(f"model: {type(model).__name__} has no DeepseekV4DecoderLayer (kernel mHC serves "
                         "transformers' DeepSeek-V4)")
    swaps = [(m, KernelMHCDecoderLayer) for m in layers]
    if head:
        swaps += [(m, KernelMHCHyperHead) for m in model.modules() if isinstance(m, DeepseekV4HyperHead)]
    for module, kernel_class in swaps:
        module.__class__ = kernel_class
        module.kd_backend = backend
    return model
