"""Lazy attention in Triton: launchers for the kernels in _lazy_attention_fwd / _lazy_attention_bwd.

Same functions, signatures, outputs and residuals as kernel_dispatch/golden/lazy_attention.py:
q [B, H, L, D]; k, v [B, Hkv, L, D] (fp16, bf16 or fp32, any strides); bias [H, W]; tau [H];
lengths [B] int or None. Head dims 16, 32, 64, 128. All scores, probabilities, thresholds
and accumulators are fp32; fp32 inputs use IEEE fp32 dots (no TF32).

Every kernel runs through the backend's autotune path (_autotune): on CUDA tuned per (head dim, causal, dtypes,
the power-of-two class of L) over the configs of its class, winners cached on disk. Under the interpreter
(TRITON_INTERPRET=1) one small config runs, and tiles are upcast to fp32 after every load (the interpreter's
numpy has no bf16).
"""
from __future__ import annotations

import torch
import triton

from ._autotune import CONFIG_ENV, candidates, launch, size_class  # noqa: F401 (CONFIG_ENV: for the GPU checks)
from ._interpret import INTERPRET
from ._lazy_attention_bwd import DKDV_CONFIGS, DQ_CONFIGS, lazy_attention_bwd_dkdv_kernel, lazy_attention_bwd_dq_kernel
from ._lazy_attention_fwd import FWD_CONFIGS, LOG2E, bias_table, config_class, lazy_attention_fwd_kernel

HEAD_DIMS = (16, 32, 64, 128)
DTYPES = (torch.float16, torch.bfloat16, torch.float32)
KERNELS = {"fwd": lazy_attention_fwd_kernel, "dq": lazy_attention_bwd_dq_kernel,
           "dkdv": lazy_attention_bwd_dkdv_kernel}
CONFIGS = {"fwd": FWD_CONFIGS, "dq": DQ_CONFIGS, "dkdv": DKDV_CONFIGS}


def shipped_configs(kernel: str, head_dim: int, dtype: torch.dtype) -> list[triton.Config]:
    """The CUDA launch configs of ``kernel`` ("fwd", "dq" or "dkdv") for a head dim and input dtype."""
    if kernel not in CONFIGS:
        raise ValueError(f"kernel: expected one of {sorted(CONFIGS)}, got {kernel!r}")
    return CONFIGS[kernel][config_class(dtype, head_dim)]


def dq_block(q: torch.Tensor) -> int:
    """BLOCK of the dq kernel's launches for ``q`` [B, H, L, D] (it sizes the dbias partial sums)."""
    return candidates(lazy_attention_bwd_dq_kernel, {"Q": q, "HEAD_DIM": q.shape[-1]})[0].kwargs["BLOCK"]


def best_configs() -> dict:
    """The autotuner's winners so far: {kernel: {key: config string}} (empty under the interpreter)."""
    return {name: {str(k): str(c) for k, c in t.cache.items()} for name, t in KERNELS.items()}


def _empty(*shape, dtype, device) -> torch.Tensor:
    """Every kernel output buffer comes from here (a test fills them with NaN to prove full coverage)."""
    return torch.empty(*shape, dtype=dtype, device=device)


def _check(q, k, v, bias, tau, lengths) -> None:
    if q.dtype not in DTYPES:
        raise TypeError(f"q: triton lazy attention supports fp16, bf16 and fp32, got {q.dtype}")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise TypeError(f"k, v: expected q's dtype {q.dtype}, got {k.dtype} and {v.dtype}")
    if q.shape[-1] not in HEAD_DIMS:
        raise ValueError(f"q: head dim {q.shape[-1]} not in {HEAD_DIMS}")
    if q.device.type != "cuda" and not INTERPRET:
        raise ValueError(f"q: triton kernels need a CUDA tensor (or TRITON_INTERPRET=1), got device {q.device}")
    B, H, L, _ = q.shape
    if k.shape[0] != B or k.shape[2] != L or H % k.shape[1] or v.shape != k.shape:
        raise ValueError(f"k, v: expected [B, Hkv, L, D] with H % Hkv == 0, got {tuple(k.shape)}, {tuple(v.shape)}")
    if bias.dim() != 2 or bias.shape[0] != H:
        raise ValueError(f"bias: expected [H, W] = [{H}, W], got {tuple(bias.shape)}")
    if tau.shape != (H,):
        raise ValueError(f"tau: expected [H] = [{H}], got {tuple(tau.shape)}")
    if lengths is not None and lengths.shape != (B,):
        raise ValueError(f"lengths: expected [B] = [{B}], got {tuple(lengths.shape)}")


SCRATCH_ELEMS = 1 << 26  # at most 256 MB of fp32 dbias partial sums per dq launch


def _bh_chunks(B: int, H: int, per_bh: int) -> list[tuple[int, int]]:
    """Ranges of the flat (b, h) index for the dq launches: whole batch elements, or head slices of one."""
    per = max(1, SCRATCH_ELEMS // per_bh)
    if per >= B * H:
        return [(0, B * H)]
    if per >= H:
        nb = per // H
        return [(b * H, min(B, b + nb) * H) for b in range(0, B, nb)]
    return [(b * H + h, b * H + min(H, h + per)) for b in range(B) for h in range(0, H, per)]


def _flags(q, lengths, causal) -> dict:
    return dict(CAUSAL=bool(causal), HAS_LENS=lengths is not None, HEAD_DIM=q.shape[-1],
                PREC="ieee" if q.dtype == torch.float32 else "tf32", L_CLASS=size_class(q.shape[2]))


def _common(q, k, bias, tau, lengths, scale):
    """Shared launch arguments: the bias table, tau in fp32, the lengths pointer and the scalar sizes."""
    B, H, L, D = q.shape
    btab = bias_table(bias)
    tau32 = tau.float()
    lens = lengths if lengths is not None else tau32  # never read when HAS_LENS is False
    return B, H, k.shape[1], L, D, btab, tau32, lens, scale * LOG2E


def forward(q, k, v, bias, tau, scale: float, lengths, causal: bool):
    """O [B, H, L, D] (q's dtype, contiguous) and LSE [B, H, L] (fp32, natural log)."""
    _check(q, k, v, bias, tau, lengths)
    B, H, Hkv, L, D, btab, tau32, lens, qk_scale = _common(q, k, bias, tau, lengths, scale)
    o = _empty(B, H, L, D, dtype=q.dtype, device=q.device)
    lse = _empty(B, H, L, dtype=torch.float32, device=q.device)
    grid = lambda meta: (triton.cdiv(L, meta["BLOCK_M"]), B * H)  # noqa: E731
    args = (q, k, v, btab, tau32, lens, o, lse, *q.stride(), *k.stride(), *v.stride(), *o.stride(),
            *btab.stride(), tau32.stride(0), H, L, bias.shape[1], H // Hkv, qk_scale)
    launch(lazy_attention_fwd_kernel, grid, *args, **_flags(q, lengths, causal))
    return o, lse


def backward(do, q, k, v, bias, tau, o, lse, scale: float, lengths, causal: bool):
    """(dq, dk, dv, dbias, dtau), contiguous, in the dtypes of (q, k, v, bias, tau).

    ``o`` [B, H, L, D] (any strides) is the forward's output: dO . O stands in for Delta in the dq kernel's fused
    sweep over far keys; Delta itself, sum_n P Mk dA, is summed exactly in the same kernel.
    """
    _check(q, k, v, bias, tau, lengths)
    if do.shape != q.shape:
        raise ValueError(f"do: expected the shape of q {tuple(q.shape)}, got {tuple(do.shape)}")
    if lse.shape != q.shape[:3]:
        raise ValueError(f"lse: expected [B, H, L] = {list(q.shape[:3])}, got {tuple(lse.shape)}")
    B, H, Hkv, L, D, btab, tau32, lens, qk_scale = _common(q, k, bias, tau, lengths, scale)
    do = do.to(q.dtype)
    o = o.to(q.dtype)
    lse = lse.float().contiguous()
    W = bias.shape[1]
    blk = dq_block(q)
    n_blocks = triton.cdiv(L, blk)
    seg_half = triton.cdiv(min(W, L), blk)
    nseg, seg_off = (seg_half, 0) if causal else (2 * seg_half, seg_half)
    dev = q.device
    dq = _empty(B, H, L, D, dtype=q.dtype, device=dev)
    delta = _empty(B * H, L, dtype=torch.float32, device=dev)
    dtau_part = _empty(B * H, n_blocks, dtype=torch.float32, device=dev)
    flags = _flags(q, lengths, causal)
    common = (*q.stride(), *k.stride(), *v.stride(), *do.stride(), *btab.stride(), tau32.stride(0))
    seg_len = nseg * blk
    diag = torch.zeros(H, seg_len, dtype=torch.float32, device=dev)  # dS diagonal sums, d = index - seg_off * blk
    db_part = None
    for bh0, bh1 in _bh_chunks(B, H, n_blocks * seg_len):
        n = bh1 - bh0
        if db_part is None or db_part.shape[0] < n:
            db_part = torch.zeros(n, n_blocks, seg_len, dtype=torch.float32, device=dev)
        else:
            db_part.zero_()
        launch(lazy_attention_bwd_dq_kernel, (n_blocks, n), q, k, v, btab, tau32, lens, do, o, lse, dq, delta,
               dtau_part, db_part, *q.stride(), *k.stride(), *v.stride(), *do.stride(), *o.stride(), *btab.stride(),
               tau32.stride(0), H, L, W, H // Hkv, qk_scale, scale, nseg, seg_off, bh0, **flags)
        part = db_part[:n].sum(1)  # [n, seg_len]
        if n % H == 0:
            diag += part.view(n // H, H, seg_len).sum(0)
        else:  # a slice of one batch element's heads
            diag[bh0 % H:bh0 % H + n] += part
    dk = _empty(B, Hkv, L, D, dtype=k.dtype, device=dev)
    dv = _empty(B, Hkv, L, D, dtype=v.dtype, device=dev)
    grid = lambda meta: (triton.cdiv(L, meta["BLOCK_N"]), B * Hkv)  # noqa: E731
    launch(lazy_attention_bwd_dkdv_kernel, grid, q, k, v, btab, tau32, lens, do, lse, delta, dk, dv, *common, H, Hkv,
           L, W, H // Hkv, qk_scale, scale, **flags)
    dtau = dtau_part.view(B, H, n_blocks).sum((0, 2))
    dbias = torch.zeros(H, W, dtype=torch.float32, device=dev)
    w_eff = min(W, L)
    zero = seg_off * blk
    dbias[:, :w_eff] = diag[:, zero:zero + w_eff]
    if not causal and w_eff > 1:
        dbias[:, 1:w_eff] += diag[:, zero - w_eff + 1:zero].flip(-1)
    return dq, dk, dv.to(v.dtype), dbias.to(bias.dtype), dtau.to(tau.dtype)
