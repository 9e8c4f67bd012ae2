"""TileLang lazy attention (SPEC section 1): launchers with the golden signatures.

Forward, two kernels: the row log-sum-exp (``_lazy_attention_lse_kernel``), then
O = relu(P + tau/i) @ V (``_lazy_attention_fwd_kernel``). Backward, three kernels: the row dots dO . O
(``_lazy_attention_row_dot_kernel``), a query-major sweep giving dQ together with the row sums
Delta = sum_n P Mk dA and (1/i) sum_n Mk dA (``_lazy_attention_dq_delta_kernel``, no atomics), then dK, dV
plus per-key-block dbias partials (``_lazy_attention_dkdv_kernel``, key-major, GQA heads summed in the CTA).
dbias and dtau are fixed-order sums of those partials, so they are bitwise reproducible.

Inputs may have any strides: q, k, v and dO are made contiguous here (a copy when they are not);
fp16 and bf16 only (TileLang's fp32 GEMM runs in TF32, below the fp32 contract), head dims 64
and 128, Hopper (sm_90a) kernels. Kernels are compiled once per (kernel, head dim, dtype, causal,
tile config, target) (``_build.kernel``); sequence length, batch, heads and W are symbolic.
"""
from __future__ import annotations

import functools

import torch

from .._checks import check_query

from . import _build
from . import _lazy_attention_dkdv_kernel as _dkdv_k
from . import _lazy_attention_dq_delta_kernel as _dq_delta_k
from . import _lazy_attention_fwd_kernel as _fwd_k
from . import _lazy_attention_lse_kernel as _lse_k
from . import _lazy_attention_row_dot_kernel as _row_dot_k
from ._lazy_attention_layout import ROW_ALIGN

DTYPES = {torch.float16: "float16", torch.bfloat16: "bfloat16"}
HEAD_DIMS = (64, 128)
_MODULES = {"lse": _lse_k, "fwd": _fwd_k, "row_dot": _row_dot_k, "dq_delta": _dq_delta_k, "dkdv": _dkdv_k}
FACTORIES = {name: m.build for name, m in _MODULES.items()}
CONFIGS = {D: {name: m.CONFIGS[D] for name, m in _MODULES.items()} for D in HEAD_DIMS}  # {head dim: {kernel: tiles}}


VARLEN_KERNELS = tuple(_MODULES)  # every kernel has a packed-documents form (``varlen``; _lazy_attention_layout)


def kernel(name: str, head_dim: int, dtype: str, causal: bool, tiles, device=None, varlen: bool = False):
    """The compiled kernel ``name`` for these static parameters and ``tiles`` on CUDA ``device`` (sm_90a if None);
    ``varlen``: its packed-documents form (``VARLEN_KERNELS`` only)."""
    args = (head_dim, dtype, bool(causal), tiles) + ((True,) if varlen else ())
    return _build.kernel(FACTORIES[name], args, device)


def _kernel(name: str, q: torch.Tensor, causal: bool, varlen: bool = False):
    D = q.shape[-1]
    return kernel(name, D, DTYPES[q.dtype], causal, CONFIGS[D][name], q.device, varlen)


def _check(q: torch.Tensor) -> None:
    check_query(q, "TileLang", DTYPES, HEAD_DIMS)


def _lens(lengths, B: int, L: int, device) -> torch.Tensor:
    if lengths is None:
        return torch.full((B,), L, dtype=torch.int32, device=device)
    return lengths.to(device=device, dtype=torch.int32).contiguous()


def forward(q, k, v, bias, tau, scale: float, lengths, causal: bool):
    """O [B, H, L, D] (q's dtype, contiguous) and LSE [B, H, L] fp32 (natural log).

    q [B, H, L, D], k/v [B, Hkv, L, D] fp16/bf16, any strides; bias [H, W], tau [H] fp32;
    lengths [B] int or None; see SPEC section 1.
    """
    _check(q)
    B, H, L, D = q.shape
    qc, kc, vc = q.contiguous(), k.contiguous(), v.contiguous()
    bias32 = bias.to(torch.float32).contiguous()
    tau32 = tau.to(torch.float32).contiguous()
    lens = _lens(lengths, B, L, q.device)
    lse = torch.empty(B, H, L, dtype=torch.float32, device=q.device)
    o = torch.empty_like(qc)
    with torch.cuda.device(q.device):
        _kernel("lse", q, causal)(qc, kc, bias32, lens, lse, float(scale), L)
        _kernel("fwd", q, causal)(qc, kc, vc, bias32, tau32, lens, lse, o, float(scale), L)
    return o, lse


def backward(do, q, k, v, bias, tau, o, lse, scale: float, lengths, causal: bool):
    """(dq, dk, dv, dbias, dtau), contiguous, in the dtypes of (q, k, v, bias, tau).

    do [B, H, L, D] (any strides), the forward's inputs and its residuals o [B, H, L, D] (q's dtype;
    dO . O is the dQ sweep's first estimate of Delta) and lse [B, H, L]. See SPEC section 1.
    """
    _check(q)
    B, H, L, D = q.shape
    W = bias.shape[1]
    dev = q.device
    qc, kc, vc, doc = q.contiguous(), k.contiguous(), v.contiguous(), do.to(q.dtype).contiguous()
    bias32 = bias.to(torch.float32).contiguous()
    tau32 = tau.to(torch.float32).contiguous()
    lens = _lens(lengths, B, L, dev)
    LP = -(-L // ROW_ALIGN) * ROW_ALIGN  # padded row length: the dK/dV kernel TMA-loads these rows
    # with LP == L every column of the row vectors is written before it is read: no fills
    rows = functools.partial(torch.empty if LP == L else torch.zeros, B, H, LP, dtype=torch.float32, device=dev)
    if LP == L and lse.dtype == torch.float32 and lse.is_contiguous() and lse.data_ptr() % 16 == 0:
        lse_p = lse  # read only, and TMA-aligned
    else:
        lse_p = rows()
        lse_p[..., :L] = lse
    delta, rdiv = rows(), rows()
    d0 = rows()  # dO . O, the dQ sweep's first estimate of Delta
    inv_i = (torch.empty if LP == L else torch.zeros)(B, LP, dtype=torch.float32, device=dev)  # 1/i, from dq_delta
    dk = torch.empty_like(kc)
    dv = torch.empty_like(vc)
    dq = torch.empty_like(qc)
    partial = torch.zeros(B, H, -(-L // CONFIGS[D]["dkdv"].block_n), min(W, L), dtype=torch.float32, device=dev)
    s = float(scale)
    with torch.cuda.device(dev):
        _kernel("row_dot", q, causal)(doc, o.to(q.dtype).contiguous(), d0)
        _kernel("dq_delta", q, causal)(qc, kc, vc, doc, bias32, tau32, lens, lse_p, d0, delta, rdiv, inv_i, dq, s, L)
        _kernel("dkdv", q, causal)(qc, kc, vc, doc, bias32, tau32, lens, lse_p, delta, inv_i, dk, dv, partial, s, L)
    dbias = partial.sum((0, 2), dtype=torch.float64)  # fixed-order sums of the per-key-block partials
    if dbias.shape[1] < W:  # distances >= L: no pair of positions is that far apart
        dbias = torch.nn.functional.pad(dbias, (0, W - dbias.shape[1]))
    dtau = rdiv.sum((0, 2), dtype=torch.float64)
    return dq, dk, dv, dbias.to(bias.dtype), dtau.to(tau.dtype)
