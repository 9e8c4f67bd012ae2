"""TileLang lazy attention over a KV cache (SPEC section 5), forward only: the launcher of three kernels.

Same ``forward`` as kernel_dispatch/golden/lazy_attention_with_kvcache.py: q [B, H, Lq, D]; k_cache, v_cache
[B, Hkv, S, D]; bias [H, W] fp32; tau [H] fp32; seqlens_k [B] int32 on q's device (n_b, the new keys included).
fp16 and bf16, head dims 64 and 128, Hopper (sm_90a) kernels. q is viewed as [B, Hkv, R, D] (R = (H / Hkv) * Lq
rows per kv head, one tile's M dimension); the caches must be contiguous or they are copied (a whole-cache copy
per call: keep them contiguous). The launcher never reads seqlens_k on the host: the grid and every buffer depend
on the shapes only, so a decode step can be captured in a CUDA graph.

Kernels: ``_lazy_attention_kvcache_lse_kernel`` (pass 1: K once, partial LSEs, the scores kept when
``keep_scores`` says so), ``_lazy_attention_kvcache_out_kernel`` (pass 2: the final LSE, then V once, and K again
only when the scores were not kept), ``_lazy_attention_kvcache_reduce_kernel`` (the sum of the splits' fp32
partials, when there is more than one split). Compiled once per (kernel, head dim, dtype, flags, tiles, target);
batch, heads, Lq, the cache capacity, W and the split count are symbolic.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from .._checks import check_query
from ..kvcache_splits import SplitPolicy, keep_scores, num_splits, sm_count
from . import _build
from . import _lazy_attention_kvcache_lse_kernel as _lse_k
from . import _lazy_attention_kvcache_out_kernel as _out_k
from . import _lazy_attention_kvcache_reduce_kernel as _reduce_k

DTYPES = {torch.float16: "float16", torch.bfloat16: "bfloat16"}
HEAD_DIMS = (64, 128)


@dataclass(frozen=True)
class KVCacheTiles:
    """The two passes' tiles: at most ``block_m`` rows (fewer, down to 16, when R is smaller), ``block_n`` keys
    per step, ``threads`` per CTA (plus TileLang's TMA producer warpgroup), ``num_stages`` tiles in flight."""
    block_m: int
    block_n: int
    threads: int
    num_stages: int


@dataclass(frozen=True)
class ReduceTiles:
    block_m: int
    threads: int


# Memory-bound: each CTA keeps num_stages key tiles of 16 KB (K or V, plus the kept scores) in flight through TMA;
# the warp-specialised kernels hold 240 registers per consumer thread, so one CTA runs per SM.
TILES = {64: KVCacheTiles(block_m=64, block_n=128, threads=128, num_stages=4),
         128: KVCacheTiles(block_m=64, block_n=64, threads=128, num_stages=4)}
REDUCE = ReduceTiles(block_m=16, threads=128)
POLICY = SplitPolicy(ctas_per_sm=1, min_keys=256)


def tiles_for(head_dim: int, rows: int) -> KVCacheTiles:
    """The tiles for R = ``rows`` (block_m cut down to the power of two >= R, 16 at least)."""
    base = TILES[head_dim]
    bm = 16
    while bm < min(rows, base.block_m):
        bm *= 2
    return KVCacheTiles(bm, base.block_n, base.threads, base.num_stages)


@functools.lru_cache(maxsize=None)
def kernel(name: str, head_dim: int, dtype: str, flags: tuple, tiles, target: tuple):
    """The compiled kernel ``name`` ("lse", "out" or "reduce") for these static parameters (``flags``: (keep,)
    for lse, (keep, direct) for out, () for reduce; ``target`` as sorted dict items)."""
    return _build.compile_kernel(prim_func(name, head_dim, dtype, flags, tiles), dict(target))


def prim_func(name: str, head_dim: int, dtype: str, flags: tuple, tiles):
    """The ``T.prim_func`` of kernel ``name`` (arguments as :func:`kernel`)."""
    if name == "lse":
        return _lse_k.build(head_dim, dtype, *flags, tiles.block_m, tiles.block_n, tiles.threads, tiles.num_stages)
    if name == "out":
        return _out_k.build(head_dim, dtype, *flags, tiles.block_m, tiles.block_n, tiles.threads, tiles.num_stages)
    if name == "reduce":
        return _reduce_k.build(head_dim, dtype, tiles.block_n, REDUCE.block_m, REDUCE.threads)
    raise ValueError(f"name: expected 'lse', 'out' or 'reduce', got {name!r}")


def _check(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
    check_query(q, "TileLang", DTYPES, HEAD_DIMS)
    if k_cache.dtype != q.dtype or v_cache.dtype != q.dtype:
        raise TypeError(f"k_cache, v_cache: expected q's dtype {q.dtype}, got {k_cache.dtype} and {v_cache.dtype}")


def forward(q, k_cache, v_cache, bias, tau, seqlens_k, scale: float, *, splits: int | None = None,
            keep: bool | None = None):
    """O [B, H, Lq, D] in q's dtype, contiguous (SPEC section 5; layout in the module docstring).

    ``splits`` and ``keep`` override ``kvcache_splits.num_splits`` and ``keep_scores`` (tests cover every path).
    """
    _check(q, k_cache, v_cache)
    B, H, Lq, D = q.shape
    Hkv, S = k_cache.shape[1], k_cache.shape[2]
    R = (H // Hkv) * Lq
    dev = q.device
    dt = DTYPES[q.dtype]
    tiles = tiles_for(D, R)
    m_blocks = -(-R // tiles.block_m)
    ns = splits if splits is not None else num_splits(B * Hkv * m_blocks, S, sm_count(dev, 132), POLICY)
    keep = keep_scores(R, D, q.element_size()) if keep is None else keep
    q4 = q.contiguous().view(B, Hkv, R, D)
    kc, vc = k_cache.contiguous(), v_cache.contiguous()
    bias32 = bias.to(torch.float32).contiguous()
    tau32 = tau.to(torch.float32).contiguous()
    seqlens = seqlens_k.to(torch.int32).contiguous()
    sp = -(-S // tiles.block_n) * tiles.block_n  # whole tiles: pass 1 stores a split's last tile whole
    f32 = dict(dtype=torch.float32, device=dev)
    scores = torch.empty(B * Hkv, R, sp, **f32) if keep else torch.empty(1, 1, 1, **f32)
    lse_part = torch.empty(ns, B * Hkv, m_blocks * tiles.block_m, **f32)
    o = torch.empty(B, H, Lq, D, dtype=q.dtype, device=dev)
    o4 = o.view(B, Hkv, R, D)
    o_part = (torch.empty(ns, B * Hkv, m_blocks * tiles.block_m, D, **f32) if ns > 1
              else torch.empty(1, 1, 1, D, **f32))
    target = tuple(sorted(_build.device_target(dev).items()))
    s = float(scale)
    with torch.cuda.device(dev):
        kernel("lse", D, dt, (keep,), tiles, target)(q4, kc, bias32, seqlens, scores, lse_part, Lq, s)
        kernel("out", D, dt, (keep, ns == 1), tiles, target)(q4, kc, vc, bias32, tau32, seqlens, scores, lse_part,
                                                             o4, o_part, Lq, s)
        if ns > 1:
            kernel("reduce", D, dt, (), tiles, target)(o_part, seqlens, o4)
    return o
