"""CuTe DSL lazy attention (SPEC section 1): the launchers with the golden signatures.

The forward (``lazy_attention_fwd``) and backward (``lazy_attention_bwd``) launchers receive ``kernel(short_name)``,
the loaded kernel for this call's head dim, dtype and mask (``_store.function``: from the kernel store, compiled
into it first where the DSL is installed). Residuals as every backend: O and the natural-log LSE [B, H, L] fp32,
so forward and backward mix across backends.
"""
import torch

from .._checks import check_query
from . import _store
from ._kernel_key import HEAD_DIMS, KernelKey
from .lazy_attention_bwd import backward as _backward
from .lazy_attention_fwd import forward as _forward

DTYPES = {torch.float16: "float16", torch.bfloat16: "bfloat16"}


def _check(q: torch.Tensor) -> None:
    check_query(q, "cute", DTYPES, HEAD_DIMS)


def _kernels(q: torch.Tensor, causal: bool):
    D, dtype = q.shape[-1], DTYPES[q.dtype]
    return lambda name: _store.function(KernelKey(name, D, dtype, bool(causal)))


def forward(q, k, v, bias, tau, scale: float, lengths, causal: bool):
    """O [B, H, L, D] (q's dtype, contiguous) and LSE [B, H, L] fp32 (natural log).

    q [B, H, L, D], k/v [B, Hkv, L, D] fp16/bf16 CUDA, any strides; bias [H, W], tau [H]; lengths [B] int or None.
    """
    _check(q)
    with torch.cuda.device(q.device):
        return _forward(_kernels(q, causal), q, k, v, bias, tau, scale, lengths, causal)


def backward(do, q, k, v, bias, tau, o, lse, scale: float, lengths, causal: bool):
    """(dq, dk, dv, dbias, dtau) in the dtypes of (q, k, v, bias, tau); do [B, H, L, D], the forward's inputs and
    its residuals o [B, H, L, D] and lse [B, H, L] fp32 (from any backend)."""
    _check(q)
    with torch.cuda.device(q.device):
        return _backward(_kernels(q, causal), do, q, k, v, bias, tau, o, lse, scale, lengths, causal)
