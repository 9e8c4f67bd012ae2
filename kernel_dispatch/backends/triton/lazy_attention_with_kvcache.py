"""Lazy attention over a KV cache in Triton (SPEC section 5): the launcher of ``_lazy_attention_kvcache``.

Same ``forward`` as kernel_dispatch/golden/lazy_attention_with_kvcache.py: q [B, H, Lq, D]; k_cache, v_cache
[B, Hkv, S, D] (fp16, bf16 or fp32, any strides); bias [H, W] fp32; tau [H] fp32; seqlens_k [B] int32 on q's
device (n_b, the new keys included); head dims 16, 32, 64, 128. The launcher never reads seqlens_k on the host:
the grid and every buffer depend on the shapes only, so a decode step can be captured in a CUDA graph.

Split count and whether the scores are kept between the passes: ``kernel_dispatch.backends.kvcache_splits``.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

import torch
import triton

from ..kvcache_splits import SplitPolicy, keep_scores, num_splits, sm_count
from ._lazy_attention_fwd import LOG2E
from ._lazy_attention_kvcache import (kvcache_fused_kernel, kvcache_lse_kernel, kvcache_out_kernel,
                                     kvcache_reduce_kernel)

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
HEAD_DIMS = (16, 32, 64, 128)
DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@dataclass(frozen=True)
class KVCacheTiles:
    """The launch configuration of the two key passes: BLOCK_N keys per step, ``block_m`` rows of the
    (query head, query) tile at most (fewer when R, rounded up to a power of two, is smaller; 16 at least);
    ``l2_hints``: K and V loads marked evict-first and the kept scores evict-last in the L2."""
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    l2_hints: bool = False


# Memory-bound: 16-byte loads of K and V tiles, a cp.async pipeline of num_stages tiles, small fp32 score tiles.
# TILES serve the split kernels (pass 1, pass 2, reduce), ONE_SPLIT_TILES the fused kernel (one program per batch
# row and kv head: the larger K and V tiles keep more bytes in flight per SM). fp32: not measured on a GPU.
TILES = {"half": KVCacheTiles(block_m=64, block_n=64, num_warps=8, num_stages=3, l2_hints=True),
         "fp32": KVCacheTiles(block_m=32, block_n=32, num_warps=4, num_stages=2)}
ONE_SPLIT_TILES = {"half": KVCacheTiles(block_m=64, block_n=128, num_warps=8, num_stages=3, l2_hints=True),
                   "fp32": TILES["fp32"]}
INTERPRET_TILES = KVCacheTiles(block_m=16, block_n=16, num_warps=1, num_stages=1)
POLICY = SplitPolicy(ctas_per_sm=2, min_keys=128, one_split_fill=0.7)
INTERPRET_POLICY = SplitPolicy(ctas_per_sm=4, min_keys=16)
INTERPRET_SMS = 8  # the SM count the split policy assumes under the interpreter
REDUCE_BLOCK_M = 16
REDUCE_BLOCK_D = 32  # the reduce's programs also split the head dim: a decode step has few rows
REDUCE_SPLIT_BLOCK = 16  # partials of that many splits loaded at once


def tiles_for(dtype: torch.dtype, rows: int, base: KVCacheTiles | None = None, one_split: bool = False
              ) -> KVCacheTiles:
    """The tiles for ``rows`` = R = (H / Hkv) * Lq tile rows of one kv head (block_m of ``base``, by default the
    shipped tiles of ``dtype`` for the split kernels or, ``one_split``, the fused kernel, cut down to fit R)."""
    if base is None:
        shipped = ONE_SPLIT_TILES if one_split else TILES
        base = INTERPRET_TILES if INTERPRET else shipped["fp32" if dtype == torch.float32 else "half"]
    return dataclasses.replace(base, block_m=max(16, min(base.block_m, triton.next_power_of_2(rows))))


def reduce_block_m(rows: int) -> int:
    """Rows per program of the reduce kernel."""
    return min(REDUCE_BLOCK_M, triton.next_power_of_2(rows))


def _check(q, k_cache, v_cache, bias, tau, seqlens_k) -> None:
    if q.dtype not in DTYPES:
        raise TypeError(f"q: triton lazy attention with a KV cache supports fp16, bf16 and fp32, got {q.dtype}")
    if k_cache.dtype != q.dtype or v_cache.dtype != q.dtype:
        raise TypeError(f"k_cache, v_cache: expected q's dtype {q.dtype}, got {k_cache.dtype} and {v_cache.dtype}")
    if q.shape[-1] not in HEAD_DIMS:
        raise ValueError(f"q: head dim {q.shape[-1]} not in {HEAD_DIMS}")
    if q.device.type != "cuda" and not INTERPRET:
        raise ValueError(f"q: triton kernels need a CUDA tensor (or TRITON_INTERPRET=1), got device {q.device}")
    B, H, _, D = q.shape
    Hkv = k_cache.shape[1]
    if k_cache.dim() != 4 or k_cache.shape[0] != B or k_cache.shape[3] != D or H % Hkv or v_cache.shape != k_cache.shape:
        raise ValueError(f"k_cache, v_cache: expected [B, Hkv, S, D] with H % Hkv == 0, got "
                         f"{tuple(k_cache.shape)}, {tuple(v_cache.shape)}")
    if bias.dim() != 2 or bias.shape[0] != H:
        raise ValueError(f"bias: expected [H, W] = [{H}, W], got {tuple(bias.shape)}")
    if tau.shape != (H,):
        raise ValueError(f"tau: expected [H] = [{H}], got {tuple(tau.shape)}")
    if seqlens_k.shape != (B,) or seqlens_k.dtype != torch.int32:
        raise ValueError(f"seqlens_k: expected int32 [B] = [{B}], got {seqlens_k.dtype} {tuple(seqlens_k.shape)}")


def forward(q, k_cache, v_cache, bias, tau, seqlens_k, scale: float, *, splits: int | None = None,
            keep: bool | None = None, fuse: bool | None = None, tiles: KVCacheTiles | None = None,
            policy: SplitPolicy | None = None):
    """O [B, H, Lq, D] in q's dtype, contiguous (SPEC section 5; layout in the module docstring).

    One split runs both passes in one kernel (``kvcache_fused_kernel``) unless ``fuse`` is False; more run pass 1,
    pass 2 and the reduce. ``splits`` and ``keep`` override :func:`num_splits` and :func:`keep_scores` (tests cover
    every path);
    ``tiles`` (its block_m cut down to R as :func:`tiles_for` does) and ``policy`` override ``TILES`` and ``POLICY``
    (scripts/gpu_sweep_kvcache_decode.py measures the alternatives).
    """
    _check(q, k_cache, v_cache, bias, tau, seqlens_k)
    B, H, Lq, D = q.shape
    Hkv, S = k_cache.shape[1], k_cache.shape[2]
    G = H // Hkv
    R = G * Lq
    dev = q.device
    base = tiles
    tiles = tiles_for(q.dtype, R, base)
    m_blocks = triton.cdiv(R, tiles.block_m)
    policy = policy or (INTERPRET_POLICY if INTERPRET else POLICY)
    ns = splits if splits is not None else num_splits(B * Hkv * m_blocks, S, sm_count(dev, INTERPRET_SMS), policy)
    fuse = ns == 1 and fuse is not False
    if fuse:
        tiles = tiles_for(q.dtype, R, base, one_split=True)
        assert triton.cdiv(R, tiles.block_m) == m_blocks, "the split count assumed the split kernels' block_m"
    keep = keep_scores(R, D, q.element_size()) if keep is None else keep
    bias32 = bias.to(torch.float32).contiguous()
    tau32 = tau.to(torch.float32).contiguous()
    seqlens = seqlens_k.contiguous()
    o = torch.empty(B, H, Lq, D, dtype=q.dtype, device=dev)
    sp = triton.cdiv(S, tiles.block_n) * tiles.block_n  # whole tiles: pass 1 stores a split's last tile whole
    scores = torch.empty(B * Hkv, R, sp if keep else 1, dtype=torch.float32, device=dev)
    lse_part = torch.empty(ns, B * Hkv, R, dtype=torch.float32, device=dev)
    o_part = torch.empty(ns if ns > 1 else 1, B * Hkv, R, D if ns > 1 else 1, dtype=torch.float32, device=dev)
    W = bias.shape[1]
    qk_scale = float(scale) * LOG2E
    flags = dict(HEAD_DIM=D, BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n, KEEP=bool(keep), UPCAST=INTERPRET,
                 PREC="ieee" if q.dtype == torch.float32 else "tf32", EVICT=tiles.l2_hints, num_warps=tiles.num_warps,
                 num_stages=tiles.num_stages)
    shape_args = (Hkv, G, Lq, R, W, ns, qk_scale)
    if fuse:
        kvcache_fused_kernel[(B * Hkv, m_blocks)](
            q, k_cache, v_cache, bias32, tau32, seqlens, scores, o, *q.stride(), *k_cache.stride(), *v_cache.stride(),
            *o.stride(), bias32.stride(0), scores.stride(0), scores.stride(1), Hkv, G, Lq, R, W, qk_scale, **flags)
        return o
    grid = (ns, B * Hkv, m_blocks)
    kvcache_lse_kernel[grid](q, k_cache, bias32, seqlens, scores, lse_part, *q.stride(), *k_cache.stride(),
                             bias32.stride(0), scores.stride(0), scores.stride(1), lse_part.stride(0),
                             lse_part.stride(1), *shape_args, **flags)
    kvcache_out_kernel[grid](q, k_cache, v_cache, bias32, tau32, seqlens, scores, lse_part, o, o_part, *q.stride(),
                             *k_cache.stride(), *v_cache.stride(), *o.stride(), bias32.stride(0), scores.stride(0),
                             scores.stride(1), lse_part.stride(0), lse_part.stride(1), *o_part.stride()[:3],
                             *shape_args, NS_POW2=triton.next_power_of_2(ns), DIRECT=ns == 1, **flags)
    if ns > 1:
        bm, bd = reduce_block_m(R), min(REDUCE_BLOCK_D, D)
        kvcache_reduce_kernel[(B * Hkv, triton.cdiv(R, bm), D // bd)](
            o_part, o, seqlens, *o_part.stride()[:3], *o.stride(), Hkv, G, Lq, R, ns, HEAD_DIM=D, BLOCK_M=bm,
            BLOCK_N=tiles.block_n, BLOCK_D=bd, SPLIT_BLOCK=REDUCE_SPLIT_BLOCK,
            num_warps=4 if not INTERPRET else 1)
    return o


def arg_constants(fn, head_dim: int, dtype: torch.dtype, tiles: KVCacheTiles, rows: int) -> dict:
    """The constexpr arguments the launcher passes to ``fn`` on CUDA for R = ``rows`` (besides KEEP, DIRECT and
    NS_POW2)."""
    if fn is kvcache_reduce_kernel:
        return dict(HEAD_DIM=head_dim, BLOCK_M=reduce_block_m(rows), BLOCK_N=tiles.block_n,
                    BLOCK_D=min(REDUCE_BLOCK_D, head_dim), SPLIT_BLOCK=REDUCE_SPLIT_BLOCK)
    return dict(HEAD_DIM=head_dim, BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n, UPCAST=False,
                PREC="ieee" if dtype == torch.float32 else "tf32", EVICT=tiles.l2_hints)
