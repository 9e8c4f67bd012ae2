"""Pieces shared by the KV-cache kernel factories (SPEC section 5; not a kernel itself).

Layout seen by the kernels: Q and O [B, Hkv, R, D] (a contiguous [B, H, Lq, D] viewed so that the R = G * Lq
rows of kv head hk, r = g * Lq + j for query head hk * G + g and query j, are one tile's M dimension); K and V
[B, Hkv, S, D] contiguous; Bias [H, W] fp32; Seqlens [B] int32 (n_b). Row r of batch row b sits at position
pos = n_b - Lq + j. The keys [0, n_b) are cut into NS splits of ``chunk`` keys, a multiple of the key tile BN,
computed on the device from n_b: the grid depends on shapes only, and a split starting at or past n_b has no keys.
"""
from __future__ import annotations

LOG2E = 1.4426950408889634


def split_range(n_b, split, NS, BN: int):
    """(lo, hi, chunk): keys [lo, hi) of split ``split`` when keys [0, n_b) are cut into NS splits."""
    import tilelang.language as T

    chunk = T.ceildiv(T.ceildiv(n_b, NS), BN) * BN
    lo = split * chunk
    return lo, T.min(lo + chunk, n_b), chunk


def tile_counts(lo, hi, n_b, lq, W, BN: int):
    """(full, free): the split's whole key tiles in [lo, hi), and how many of the leading ones need no bias and
    no mask (keys before n_b - Lq - W + 1: visible to every query, at distance >= W from all)."""
    import tilelang.language as T

    full = T.max(hi - lo, 0) // BN
    free = T.max(T.min(n_b - lq - W + 1, hi) - lo, 0) // BN
    return full, free


def row_info_macro(BM: int):
    """A macro ``rows(pos, head, r0, R, lq, n_b, hk, G)`` filling int32 fragments [BM]: each tile row's absolute
    position and query head (rows past R repeat row R - 1, so every value is finite; they are never stored)."""
    import tilelang.language as T

    @T.macro
    def rows(pos, head, r0, R, lq, n_b, hk, G):
        for i in T.Parallel(BM):
            rc = T.min(r0 + i, R - 1)
            pos[i] = n_b - lq + rc % lq
            head[i] = hk * G + rc // lq
    return rows


def band_scores_macro(BM: int, BN: int):
    """A macro ``band(s, pos, head, n0, hi, sc2, Bias)`` turning raw q.k products [BM, BN] of keys n0 .. n0 + BN
    into log2-domain scores: scale, the bias at distance pos - n < W, -inf where n > pos or n >= hi (NaN from
    unused cache slots included: the mask is by index)."""
    import tilelang.language as T

    @T.macro
    def band(s, pos, head, n0, hi, sc2, Bias):
        for i, j in T.Parallel(BM, BN):
            W = Bias.shape[1]
            dist = pos[i] - (n0 + j)
            b = T.if_then_else(dist < W, Bias[head[i], T.max(T.min(dist, W - 1), 0)], T.float32(0))
            s[i, j] = T.if_then_else(T.And(dist >= 0, n0 + j < hi), s[i, j] * sc2 + b * LOG2E,
                                     -T.infinity("float32"))
    return band
