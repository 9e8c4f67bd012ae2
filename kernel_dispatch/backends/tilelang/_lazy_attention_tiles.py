"""Tile pieces shared by the lazy attention kernel factories (not a kernel itself).

Every kernel turns a raw tile of q.k products into log2-domain scores
``s2 = (scale * q.k + bias[dist]) * log2(e)`` with masked entries at -inf. A tile is
"free" when no entry needs a mask or a bias (every distance >= W, every key and row valid);
free tiles skip the per-element index work and fold the scale into their exponentials.
``transposed`` tiles are [keys, queries].
"""
from __future__ import annotations

from dataclasses import dataclass

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453


@dataclass(frozen=True)
class Tiles:
    """The tile configuration of a lazy attention kernel: ``block_m`` queries x ``block_n`` keys per tile,
    ``threads`` per CTA, ``num_stages`` of its software pipeline."""

    block_m: int
    block_n: int
    threads: int
    num_stages: int


def relu(x):
    """max(x, 0) keeping NaN, as golden's torch.relu does (``T.max`` becomes CUDA's fmaxf, which returns 0 for a
    NaN): a NaN score, bias or tau poisons its row instead of vanishing."""
    import tilelang.language as T

    return T.Select(x < 0, T.float32(0), x)


def lse2_of(lse):
    """round(LSE * log2 e) for a stored natural-log LSE, as one rounded product (``__fmul_rn``): nvcc never fuses
    it into the subtraction S - LSE2 that follows, where an FFMA's exact product differs from the rounded one (with
    scores near 1e30 by 1e21, and exp2 of that is inf)."""
    import tilelang.language as T

    return T.call_extern("float32", "__fmul_rn", lse, T.float32(LOG2E))


def lse_to_store(lse2):
    """The natural-log LSE to store for a row whose log2 log-sum-exp is ``lse2``: rounded, then one ulp lower where
    :func:`lse2_of` of it would exceed ``lse2``, so every pass that recovers LSE2 from it is at most one ulp below
    the true one (with scores beyond 2^24 a recovered LSE2 one ulp above would make a dominant key's P 1/2 or 0;
    :func:`p_of` caps the other side)."""
    import tilelang.language as T

    lse = T.call_extern("float32", "__fmul_rn", lse2, T.float32(LN2))
    down = T.reinterpret(T.reinterpret(lse, "int32") + T.Select(lse > 0, -1, 1), "float32")
    return T.Select(lse2_of(lse) > lse2, down, lse)


def p_of(x):
    """P = exp2(min(x, 0)) for x = S - LSE2, keeping NaN (``T.min`` is fminf, which drops it): P <= 1 exactly,
    whatever the rounding of S and of the recovered LSE2."""
    import tilelang.language as T

    return T.exp2(T.Select(x > 0, T.float32(0), x))


def mask_of(cond):
    """1.0 where ``cond`` holds, else 0.0: dP = dA * Mk as a product, so a NaN dA stays NaN where Mk is 0 (golden's
    dense product), which a select would drop."""
    import tilelang.language as T

    return T.if_then_else(cond, T.float32(1), T.float32(0))


def is_free_tile(m0, n0, rows_q: int, cols_k: int, lb, w, mask_rows: bool):
    """Whether the tile of queries [m0, m0 + rows_q) x keys [n0, n0 + cols_k) needs no mask/bias."""
    import tilelang.language as T

    free = T.And(n0 + cols_k - 1 <= m0 - w, n0 + cols_k <= lb)
    return T.And(free, m0 + rows_q <= lb) if mask_rows else free


def first_query(bx, L, BM: int, causal: bool):
    """The first query of a query-major CTA's block; query blocks run slowest in the grid and, causal,
    reversed, so the longest rows of every head start first."""
    import tilelang.language as T

    return ((T.ceildiv(L, BM) - 1 - bx) if causal else bx) * BM


def row_block(bx, by, bz, L, H, Hkv, Lens, BM: int, causal: bool):
    """(m0, hk, lb) of a query-major CTA at grid (by = head, bz = batch, bx = query block): its first query
    (:func:`first_query`), the kv head its query head reads (GQA) and its sequence's length lengths[b]."""
    return first_query(bx, L, BM, causal), by // (H // Hkv), Lens[bz]


def key_end(m0, lb, BM: int, causal: bool):
    """The end of the keys visible to queries [m0, m0 + BM) of a sequence of length lb."""
    import tilelang.language as T

    return T.min(m0 + BM, lb) if causal else lb


def key_blocks(m0, lb, BM: int, BN: int, causal: bool):
    """The key blocks the query block at m0 sweeps: 0 for a block of padded rows."""
    import tilelang.language as T

    return T.if_then_else(m0 < lb, T.ceildiv(key_end(m0, lb, BM, causal), BN), 0)


DIST_TABLE = 1024  # bias lengths W up to this use a whole-sweep distance table (row-major kernels)


def table_offset(R: int, C: int) -> int:
    """The most negative causal distance a [R queries, C keys] tile of a row-major sweep holds, negated.

    Query blocks start at multiples of R and key blocks at multiples of C; a causal sweep visits key blocks
    starting before the last query of the block. When C is a multiple of R every such key block starts at
    or before the first query (distances >= -(C - 1)); otherwise it may start up to R - 1 keys later."""
    return C - 1 if C % R == 0 else R + C - 2


def distance_table_size(R: int, C: int) -> int:
    """Entries of the whole-sweep distance table of :func:`distance_table_macro` for [R, C] tiles."""
    return DIST_TABLE + table_offset(R, C) + 1


def distance_table_macro(R: int, C: int, causal: bool):
    """A macro ``fill(table, Bias, h)`` for the row-major kernels with [R queries, C keys] tiles: ``table``
    is a shared fp32 buffer of :func:`distance_table_size` entries, filled once per CTA (before the key
    sweep) with the log2-domain bias of head h at every distance d = x - OFF, OFF = :func:`table_offset`:
    -inf for d < 0 when causal, Bias[h, d] * log2(e) for 0 <= d < W, 0 beyond. A tile reads index
    min(d, W) + OFF."""
    import tilelang.language as T

    off = table_offset(R, C)

    @T.macro
    def fill(table, Bias, h):
        for x in T.Parallel(distance_table_size(R, C)):
            d = x - off
            table[x] = table_entry(d, d, T.And(d >= 0, d < Bias.shape[1]), Bias, h, causal)
    return fill


def table_entry(d, a, in_band, Bias, h, causal: bool):
    """One bias-table entry (both table kinds): the log2-domain bias Bias[h, a] of signed distance d when
    ``in_band`` (a = d, or |d| when not causal), 0 outside the band, -inf for d < 0 when causal."""
    import tilelang.language as T

    b = T.if_then_else(in_band, Bias[h, T.max(T.min(a, Bias.shape[1] - 1), 0)] * LOG2E, T.float32(0))
    return T.if_then_else(d < 0, -T.infinity("float32"), b) if causal else b


def score_macro(R: int, C: int, causal: bool, transposed: bool, mask_rows: bool):
    """A macro ``scores(s, m0, n0, lb, sc2, Bias, h, table)`` rewriting fragment ``s`` [R, C] in place, for
    tiles that are not free (:func:`is_free_tile`; free tiles fold the scale into their exponentials instead).

    Not transposed: s[i, j] is query m0 + i, key n0 + j. Transposed: s[i, j] is key n0 + i,
    query m0 + j. Masked entries (future keys when causal, keys >= lb, and rows >= lb when
    ``mask_rows``) become -inf; the bias applies at distance m - n (|m - n| when not causal) < W.
    Tiles inside the sequence (no key or row past lb) read bias and causal mask from ``table``: not
    transposed, the whole-sweep distance table of :func:`distance_table_macro` (when W <= DIST_TABLE);
    transposed, a shared [R + C - 1] fp32 buffer the macro fills per tile with the bias of each of the tile's
    diagonals (the dK/dV kernel changes query head within its sweep). Other tiles take the per-element path.
    """
    import tilelang.language as T

    NEG_INF = -T.infinity("float32")

    if transposed:  # only the backward uses [keys, queries] tiles, always with padded rows masked
        assert mask_rows

        @T.macro
        def fill(table, d_first, Bias, h):
            """table[t] = log2-domain bias of signed distance d_first + t (-inf for d < 0 when causal)."""
            for t in T.Parallel(R + C - 1):
                d = d_first + t
                a = d if causal else T.abs(d)
                table[t] = table_entry(d, a, a < Bias.shape[1], Bias, h, causal)

        @T.macro
        def scores(s, m0, n0, lb, sc2, Bias, h, table):
            if T.And(n0 + R <= lb, m0 + C <= lb):
                fill(table, m0 - n0 - (R - 1), Bias, h)  # d = m - n = (m0 - n0) + j - i
                for i, j in T.Parallel(R, C):
                    s[i, j] = s[i, j] * sc2 + table[j - i + (R - 1)]
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
    def scores(s, m0, n0, lb, sc2, Bias, h, table):
        if T.And(T.And(n0 + C <= lb, m0 + R <= lb) if mask_rows else (n0 + C <= lb), Bias.shape[1] <= DIST_TABLE):
            for i, j in T.Parallel(R, C):
                d = (m0 - n0) + i - j if causal else T.abs((m0 - n0) + i - j)
                s[i, j] = s[i, j] * sc2 + table[T.min(d, Bias.shape[1]) + table_offset(R, C)]
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


def one_key_rows_macro(R: int, C: int, causal: bool):
    """A macro ``fix(s, lse2, m0, n0, lb, tmp)``: exact P = 1 on rows with a single visible key.

    Such a row (i = 1: causal row 0, or lengths[b] == 1) has P = 1 exactly, but its recomputed score
    and the LSE reloaded from natural log can differ by an ulp; at tau = -1 (the usual initial value)
    the row sits on the relu kink P + tau/i = 0, where P one ulp above 1 passes the strict > test (a
    nonzero first row of O, a spurious dtau term). On the first key block of a block holding such a
    row, the macro sets that row's log2-domain ``lse2`` to the row's score itself (its tile maximum),
    so exp2(s - lse2) is exactly 1; every other tile runs unchanged. ``s`` is the masked score
    fragment [R queries, C keys]; ``lse2`` and ``tmp`` are [R] fragments; rows without a visible
    key keep their ``lse2``. (:func:`one_key_probs_macro` is the transposed kernels' form.)
    """
    import tilelang.language as T

    @T.macro
    def fix(s, lse2, m0, n0, lb, tmp):
        if T.And(n0 == 0, is_one_key_row(m0, lb, causal)):  # only a block's first row can be one
            T.reduce_max(s, tmp, dim=1)
            for i in T.Parallel(R):
                one = is_one_key_row(m0 + i, lb, causal)
                lse2[i] = T.if_then_else(T.And(one, tmp[i] > -T.infinity("float32")), tmp[i], lse2[i])
    return fix


def one_key_probs_macro(R: int, C: int, causal: bool):
    """A macro ``fix(sT, pT, m0, n0, lb)`` for transposed tiles (sT, pT [R keys, C queries]): after
    pT = exp2(sT - LSE2), set P = 1 exactly for the queries that see a single key (see
    :func:`one_key_rows_macro`; a column maximum does not lower on the wgmma layout, so the one tile
    per (b, h) that can hold such a query gets a second elementwise pass; every other tile skips it)."""
    import tilelang.language as T

    @T.macro
    def fix(sT, pT, m0, n0, lb):
        if T.And(n0 == 0, is_one_key_row(m0, lb, causal)):  # only a block's first row can be one
            for i, j in T.Parallel(R, C):
                one = is_one_key_row(m0 + j, lb, causal)
                pT[i, j] = T.if_then_else(T.And(one, sT[i, j] > -T.infinity("float32")), T.float32(1), pT[i, j])
    return fix


def own_rows_macro(rows: int, D: int, dtype: str, tiles: int = 1):
    """A macro ``copy(r0, lb, dst, src[, dst2, src2])`` for packed documents: each shared tile ``dst`` [rows, D]
    becomes ``src`` with the rows r0 + i >= lb (the next document's) zeroed, for a GEMM that multiplies them by zeros
    (0 * NaN is NaN). The copies are generic-proxy writes that the wgmma reads through the async proxy: the macro ends
    with ``fence.proxy.async``, so each writing thread fences before the barrier TileLang puts before the GEMM (the
    order the PTX memory model describes; TileLang's own fence comes after that barrier). ``tiles``: one or two tiles
    copied in one loop."""
    import tilelang.language as T

    zero = T.Cast(dtype, 0)
    if tiles == 1:
        @T.macro
        def copy(r0, lb, dst, src):
            for i, j in T.Parallel(rows, D):
                dst[i, j] = T.if_then_else(r0 + i < lb, src[i, j], zero)
            T.fence_proxy_async()
    else:
        @T.macro
        def copy(r0, lb, dst, src, dst2, src2):
            for i, j in T.Parallel(rows, D):
                dst[i, j] = T.if_then_else(r0 + i < lb, src[i, j], zero)
                dst2[i, j] = T.if_then_else(r0 + i < lb, src2[i, j], zero)
            T.fence_proxy_async()
    return copy


def is_one_key_row(m, lb, causal: bool):
    """Whether query row m of a sequence of length lb sees exactly one key (i = 1: causal row 0, or lb == 1)."""
    import tilelang.language as T

    return T.Or(m == 0, lb == 1) if causal else (lb == 1)
