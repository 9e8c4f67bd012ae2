"""Lazy attention over packed documents in Triton (SPEC section 4): launchers of the lazy attention kernels with
their ``VARLEN`` switch on.

Same functions, signatures, outputs and residuals as kernel_dispatch/golden/lazy_attention_varlen.py:
q [T, H, D]; k, v [T, Hkv, D] (fp16, bf16 or fp32, any strides); bias [H, W]; tau [H]; cu_seqlens [N + 1] int32.
Nothing is padded: a program owns (document, query or key block, head), reads the document's first token and length
from cu_seqlens and exits when its block starts past the document's end; documents run on the first grid axis and
blocks on the second, reversed for queries, so the longest causal rows of every document start first.
dtau and dbias are fixed-order sums of per-(document, query block) partials: bitwise reproducible.
"""
from __future__ import annotations

import torch
import triton

from ._autotune import launch, size_class
from ._interpret import INTERPRET
from ._lazy_attention_bwd import lazy_attention_bwd_dkdv_kernel, lazy_attention_bwd_dq_kernel
from ._lazy_attention_fwd import LOG2E, bias_table, lazy_attention_fwd_kernel
from .lazy_attention import DTYPES, HEAD_DIMS, SCRATCH_ELEMS, dq_block

INT32_MAX = 2**31 - 1


def _empty(*shape, dtype, device) -> torch.Tensor:
    """Every kernel output buffer comes from here (a test fills them with NaN to prove full coverage)."""
    return torch.empty(*shape, dtype=dtype, device=device)


def _check(q, k, v, bias, tau, cu_seqlens, max_seqlen) -> None:
    if q.dtype not in DTYPES:
        raise TypeError(f"q: triton lazy attention supports fp16, bf16 and fp32, got {q.dtype}")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise TypeError(f"k, v: expected q's dtype {q.dtype}, got {k.dtype} and {v.dtype}")
    if q.dim() != 3 or q.shape[-1] not in HEAD_DIMS:
        raise ValueError(f"q: expected [T, H, D] with D in {HEAD_DIMS}, got {tuple(q.shape)}")
    if q.device.type != "cuda" and not INTERPRET:
        raise ValueError(f"q: triton kernels need a CUDA tensor (or TRITON_INTERPRET=1), got device {q.device}")
    T, H, D = q.shape
    if k.dim() != 3 or k.shape[0] != T or k.shape[2] != D or H % k.shape[1] or v.shape != k.shape:
        raise ValueError(f"k, v: expected [T, Hkv, D] with H % Hkv == 0, got {tuple(k.shape)}, {tuple(v.shape)}")
    if bias.dim() != 2 or bias.shape[0] != H:
        raise ValueError(f"bias: expected [H, W] = [{H}, W], got {tuple(bias.shape)}")
    if tau.shape != (H,):
        raise ValueError(f"tau: expected [H] = [{H}], got {tuple(tau.shape)}")
    if cu_seqlens.dtype != torch.int32 or cu_seqlens.dim() != 1 or cu_seqlens.shape[0] < 2:
        raise ValueError(f"cu_seqlens: expected [N + 1] int32 with N >= 1, got {cu_seqlens.dtype} "
                         f"{tuple(cu_seqlens.shape)}")
    if max_seqlen < 1:
        raise ValueError(f"max_seqlen: expected >= 1, got {max_seqlen}")


def _check_offsets(max_seqlen: int, **tensors) -> None:
    """Offsets within a document are int32 (a token index times the token stride; a document's base is int64)."""
    for name, t in tensors.items():
        stride = max(abs(t.stride(0)), t.shape[1] * t.shape[2])  # outputs are contiguous [T, heads, D]
        if max_seqlen * stride > INT32_MAX:
            raise ValueError(f"{name}: a document of {max_seqlen} tokens at a token stride of {stride} elements "
                             f"overflows the kernels' int32 offsets")


def _tokens(t: torch.Tensor) -> tuple[int, int, int, int]:
    """The four strides of [T, heads, D] as the kernels' (batch, head, row, dim): a document's base is its first
    token, so the batch stride is the token stride."""
    return t.stride(0), t.stride(1), t.stride(0), t.stride(2)


def _flags(q, causal, max_seqlen) -> dict:
    return dict(CAUSAL=bool(causal), HAS_LENS=False, VARLEN=True, HEAD_DIM=q.shape[-1],
                PREC="ieee" if q.dtype == torch.float32 else "tf32", L_CLASS=size_class(max_seqlen))


def forward(q, k, v, bias, tau, cu_seqlens, max_seqlen: int, scale: float, causal: bool):
    """O [T, H, D] (q's dtype, contiguous) and LSE [H, T] (fp32, natural log)."""
    _check(q, k, v, bias, tau, cu_seqlens, max_seqlen)
    _check_offsets(max_seqlen, q=q, k=k, v=v)
    T, H, D = q.shape
    N = cu_seqlens.shape[0] - 1
    btab = bias_table(bias)
    tau32 = tau.float()
    o = _empty(T, H, D, dtype=q.dtype, device=q.device)
    lse = _empty(H, T, dtype=torch.float32, device=q.device)
    grid = lambda meta: (N, triton.cdiv(max_seqlen, meta["BLOCK_M"]), H)  # noqa: E731
    launch(lazy_attention_fwd_kernel, grid, q, k, v, btab, tau32, cu_seqlens, o, lse, *_tokens(q), *_tokens(k),
           *_tokens(v), *_tokens(o), *btab.stride(), tau32.stride(0), H, T, bias.shape[1], H // k.shape[1],
           scale * LOG2E, **_flags(q, causal, max_seqlen))
    return o, lse


def backward(do, q, k, v, bias, tau, o, lse, cu_seqlens, max_seqlen: int, scale: float, causal: bool):
    """(dq, dk, dv, dbias, dtau), contiguous, in the dtypes of (q, k, v, bias, tau).

    ``o`` [T, H, D] (any strides) is the forward's output and ``lse`` [H, T] its fp32 LSE (see the fixed-length
    launcher: dO . O stands in for Delta in the dq kernel's fused sweep over far keys).
    """
    _check(q, k, v, bias, tau, cu_seqlens, max_seqlen)
    if do.shape != q.shape:
        raise ValueError(f"do: expected the shape of q {tuple(q.shape)}, got {tuple(do.shape)}")
    T, H, D = q.shape
    if lse.shape != (H, T):
        raise ValueError(f"lse: expected [H, T] = [{H}, {T}], got {tuple(lse.shape)}")
    _check_offsets(max_seqlen, q=q, k=k, v=v, do=do, o=o)
    N = cu_seqlens.shape[0] - 1
    Hkv, W = k.shape[1], bias.shape[1]
    btab = bias_table(bias)
    tau32 = tau.float()
    do = do.to(q.dtype)
    o = o.to(q.dtype)
    lse = lse.float().contiguous()
    qk_scale = scale * LOG2E
    dev = q.device
    flags = _flags(q, causal, max_seqlen)
    blk = dq_block(q)
    n_blocks = triton.cdiv(max_seqlen, blk)
    n_rows = N + triton.cdiv(T, blk)  # partial-sum rows: one per (document, query block), see _lazy_attention_bwd
    w_eff = min(W, max_seqlen)
    seg_half = triton.cdiv(w_eff, blk)
    nseg, seg_off = (seg_half, 0) if causal else (2 * seg_half, seg_half)
    seg_len = nseg * blk
    dq = _empty(T, H, D, dtype=q.dtype, device=dev)
    delta = _empty(H, T, dtype=torch.float32, device=dev)
    dtau_part = torch.zeros(H, n_rows, dtype=torch.float32, device=dev)
    diag = torch.empty(H, seg_len, dtype=torch.float32, device=dev)  # dS diagonal sums, d = index - seg_off * blk
    heads = max(1, SCRATCH_ELEMS // (n_rows * seg_len))  # heads per dq launch
    db_part = torch.empty(min(heads, H), n_rows, seg_len, dtype=torch.float32, device=dev)
    for h0 in range(0, H, heads):
        n = min(heads, H - h0)
        db_part.zero_()
        launch(lazy_attention_bwd_dq_kernel, (N, n_blocks, n), q, k, v, btab, tau32, cu_seqlens, do, o, lse, dq,
               delta, dtau_part, db_part, *_tokens(q), *_tokens(k), *_tokens(v), *_tokens(do), *_tokens(o),
               *btab.stride(), tau32.stride(0), H, T, W, H // Hkv, qk_scale, scale, nseg, seg_off, h0, **flags)
        diag[h0:h0 + n] = db_part[:n].sum(1)
    dk = _empty(T, Hkv, D, dtype=k.dtype, device=dev)
    dv = _empty(T, Hkv, D, dtype=v.dtype, device=dev)
    grid = lambda meta: (N, triton.cdiv(max_seqlen, meta["BLOCK_N"]), Hkv)  # noqa: E731
    launch(lazy_attention_bwd_dkdv_kernel, grid, q, k, v, btab, tau32, cu_seqlens, do, lse, delta, dk, dv,
           *_tokens(q), *_tokens(k), *_tokens(v), *_tokens(do), *btab.stride(), tau32.stride(0), H, Hkv, T, W,
           H // Hkv, qk_scale, scale, **flags)
    dtau = dtau_part.sum(1)
    dbias = torch.zeros(H, W, dtype=torch.float32, device=dev)
    zero = seg_off * blk
    dbias[:, :w_eff] = diag[:, zero:zero + w_eff]
    if not causal and w_eff > 1:
        dbias[:, 1:w_eff] += diag[:, zero - w_eff + 1:zero].flip(-1)
    return dq, dk, dv, dbias.to(bias.dtype), dtau.to(tau.dtype)
