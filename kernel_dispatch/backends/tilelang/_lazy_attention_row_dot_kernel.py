"""TileLang kernel factory: D0[b, h, m] = dO[b, h, m] . O[b, h, m] in fp32, the dq_delta sweep's row constant.

One CTA per (block of query rows, head, batch) reads its rows of dO and O as 16-byte vectors, multiplies in
fp32 and reduces each row in a fixed order; it reads 2 * L * D values per (b, h).

Layout: dO, O [B, H, L, D] contiguous fp16/bf16. Out: D0 [B, H, LP] fp32, LP >= L; columns >= L untouched.
B, H, L, LP are symbolic. ``varlen`` (packed documents): dO, O [T, H, D], D0 [H, TP] (TP >= T); the rows are
per token, so the grid runs over tokens (blocks of T, H) and never reads cu_seqlens.
"""
import functools
from dataclasses import dataclass

from ._build import import_tilelang


@dataclass(frozen=True)
class RowTiles:
    """``block_rows`` rows of dO and O per CTA of ``threads`` threads."""

    block_rows: int
    threads: int


CONFIGS = {64: RowTiles(block_rows=32, threads=128), 128: RowTiles(block_rows=32, threads=128)}


@functools.lru_cache(maxsize=None)
def build(head_dim: int, dtype: str, causal: bool, tiles: RowTiles, varlen: bool = False):
    """The row-dot ``T.prim_func``; parameters: dO, O, D0. ``causal`` does not change it (the factories'
    common signature)."""
    import_tilelang()
    import tilelang.language as T

    D, BR, threads, f32 = head_dim, tiles.block_rows, tiles.threads, "float32"
    B, H, L, LP = T.dynamic("B, H, L, LP")

    @T.macro
    def row_dots(a, b, prod, dots):
        for i, j in T.Parallel(BR, D):
            prod[i, j] = T.Cast(f32, a[i, j]) * T.Cast(f32, b[i, j])
        T.reduce_sum(prod, dots, dim=1)

    if varlen:
        @T.prim_func
        def lazy_attention_row_dot_varlen(dO: T.Tensor([L, H, D], dtype), O: T.Tensor([L, H, D], dtype),
                                          D0: T.Tensor([H, LP], f32)):
            with T.Kernel(T.ceildiv(L, BR), H, threads=threads) as (bx, by):
                a = T.alloc_fragment([BR, D], dtype)
                b = T.alloc_fragment([BR, D], dtype)
                prod = T.alloc_fragment([BR, D], f32)
                dots = T.alloc_fragment([BR], f32)
                T.copy(dO[bx * BR:(bx + 1) * BR, by, :], a)
                T.copy(O[bx * BR:(bx + 1) * BR, by, :], b)
                row_dots(a, b, prod, dots)
                for i in T.Parallel(BR):
                    if bx * BR + i < L:
                        D0[by, bx * BR + i] = dots[i]

        return lazy_attention_row_dot_varlen

    @T.prim_func
    def lazy_attention_row_dot(dO: T.Tensor([B, H, L, D], dtype), O: T.Tensor([B, H, L, D], dtype),
                               D0: T.Tensor([B, H, LP], f32)):
        with T.Kernel(T.ceildiv(L, BR), H, B, threads=threads) as (bx, by, bz):
            a = T.alloc_fragment([BR, D], dtype)
            b = T.alloc_fragment([BR, D], dtype)
            prod = T.alloc_fragment([BR, D], f32)
            dots = T.alloc_fragment([BR], f32)
            T.copy(dO[bz, by, bx * BR:(bx + 1) * BR, :], a)
            T.copy(O[bz, by, bx * BR:(bx + 1) * BR, :], b)
            row_dots(a, b, prod, dots)
            for i in T.Parallel(BR):
                if bx * BR + i < L:
                    D0[bz, by, bx * BR + i] = dots[i]

    return lazy_attention_row_dot
