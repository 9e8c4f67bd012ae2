"""Tile pieces shared by the lazy attention kernel factories (not a kernel itself).

Every kernel turns a raw tile of q.k products into log2-domain scores
``s2 = (scale * q.k + bias[dist]) * log2(e)`` with masked entries at -inf. A tile is
"free" when no entry needs a mask or a bias (every distance >= W, every key and row valid);
free tiles skip the per-element index work. ``transposed`` tiles are [keys, queries].
"""
from __future__ import annotations

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453


def is_free_tile(m0, n0, rows_q: int, cols_k: int, lb, w, mask_rows: bool):
    """Whether the tile of queries [m0, m0 + rows_q) x keys [n0, n0 + cols_k) needs no mask/bias."""
    import tilelang.language as T

    free = T.And(n0 + cols_k - 1 <= m0 - w, n0 + cols_k <= lb)
    return T.And(free, m0 + rows_q <= lb) if mask_rows else free


def score_macro(R: int, C: int, causal: bool, transposed: bool, mask_rows: bool):
    """A macro ``scores(s, m0, n0, lb, sc2, Bias, h, free)`` rewriting fragment ``s`` [R, C] in place.

    Not transposed: s[i, j] is query m0 + i, key n0 + j. Transposed: s[i, j] is key n0 + i,
    query m0 + j. Masked entries (future keys when causal, keys >= lb, and rows >= lb when
    ``mask_rows``) become -inf; the bias applies at distance m - n (|m - n| when not causal) < W.
    """
    import tilelang.language as T

    NEG_INF = -T.infinity("float32")

    if transposed:  # only the backward uses [keys, queries] tiles, always with padded rows masked
        assert mask_rows

        @T.macro
        def scores(s, m0, n0, lb, sc2, Bias, h, free):
            if free:
                for i, j in T.Parallel(R, C):
                    s[i, j] = s[i, j] * sc2
            else:
                for i, j in T.Parallel(R, C):
                    W = Bias.shape[1]
                    m = m0 + j
                    n = n0 + i
                    dist = (m - n) if causal else T.abs(m - n)
                    ok = T.And(T.And(n < lb, n <= m), m < lb) if causal else T.And(n < lb, m < lb)
                    b = T.if_then_else(dist < W, Bias[h, T.max(T.min(dist, W - 1), 0)], T.float32(0))
                    s[i, j] = T.if_then_else(ok, s[i, j] * sc2 + b * LOG2E, NEG_INF)
        return scores

    @T.macro
    def scores(s, m0, n0, lb, sc2, Bias, h, free):
        if free:
            for i, j in T.Parallel(R, C):
                s[i, j] = s[i, j] * sc2
        else:
            for i, j in T.Parallel(R, C):
                W = Bias.shape[1]
                m = m0 + i
                n = n0 + j
                dist = (m - n) if causal else T.abs(m - n)
                if mask_rows:
                    ok = T.And(T.And(n < lb, n <= m), m < lb) if causal else T.And(n < lb, m < lb)
                else:
                    ok = T.And(n < lb, n <= m) if causal else (n < lb)
                b = T.if_then_else(dist < W, Bias[h, T.max(T.min(dist, W - 1), 0)], T.float32(0))
                s[i, j] = T.if_then_else(ok, s[i, j] * sc2 + b * LOG2E, NEG_INF)
    return scores
