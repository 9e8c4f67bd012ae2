"""TileLang kernel factory: the last step of lazy attention over a KV cache with more than one split.

O = the sum of the fp32 partials OPart [NS, B * Hkv, RP, D] of the batch row's non-empty splits, in split order
(Elastic-Softmax's output is a plain sum over keys: the partials need no rescaling). One CTA per (batch row x kv
head, block of BM rows); O [B, Hkv, R, D] in q's dtype. B, Hkv, R, NS, RP and the split tile BN's chunking are
those of the two passes (``_lazy_attention_kvcache_tiles``).
"""

import functools

from ._build import import_tilelang
from ._lazy_attention_kvcache_tiles import split_range


@functools.lru_cache(maxsize=None)
def build(head_dim: int, dtype: str, block_n: int, block_m: int, threads: int):
    """The reduce ``T.prim_func``; parameters in order: OPart, Seqlens, O. ``block_n``: the passes' key tile."""
    import_tilelang()
    import tilelang.language as T

    D, BM = head_dim, block_m
    f32 = "float32"
    B, Hkv, R, NS, BK, RP = T.dynamic("B, Hkv, R, NS, BK, RP")

    @T.prim_func
    def lazy_attention_kvcache_reduce(
        OPart: T.Tensor([NS, BK, RP, D], f32),
        Seqlens: T.Tensor([B], "int32"),
        O: T.Tensor([B, Hkv, R, D], dtype),
    ):
        with T.Kernel(BK, T.ceildiv(R, BM), threads=threads) as (bx, by):
            acc = T.alloc_fragment([BM, D], f32)
            part = T.alloc_fragment([BM, D], f32)
            b = bx // Hkv
            hk = bx % Hkv
            r0 = by * BM
            n_b = Seqlens[b]
            _, _, chunk = split_range(n_b, 0, NS, block_n)
            T.clear(acc)
            for t in T.serial(T.ceildiv(n_b, chunk)):
                T.copy(OPart[t, bx, r0:r0 + BM, :], part)
                for i, d in T.Parallel(BM, D):
                    acc[i, d] += part[i, d]
            T.copy(acc, O[b, hk, r0:r0 + BM, :])

    return lazy_attention_kvcache_reduce
