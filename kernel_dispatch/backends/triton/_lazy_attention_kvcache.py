"""Triton kernels of lazy attention over a KV cache (SPEC section 5), forward only, keys split across programs.

Rows: the G = H / Hkv query heads that share kv head hk, times the Lq queries, r = g * Lq + j (R = G * Lq rows),
are the M dimension of one tile, so each K and V tile read serves all of them. Query j of batch row b sits at
position pos = n_b - Lq + j. The keys [0, n_b) of a batch row are cut into NS splits of ``chunk`` keys, a
multiple of BLOCK_N computed on the device from n_b (:func:`_split_range`): the grid depends on shapes only, and
splits that start at or past n_b have no keys and write nothing.

With NS > 1, three kernels, the first two on the grid (NS, B * Hkv, cdiv(R, BLOCK_M)):

- ``kvcache_lse_kernel`` reads K once: the log2-domain scores of its keys (scaled, biased, masked), their partial
  log-sum-exp per row -> LSE_PART [NS, B * Hkv, R]; with KEEP also the scores -> SCORES [B * Hkv, R, SP] fp32.
- ``kvcache_out_kernel`` combines the partial LSEs of the row's non-empty splits into the final LSE, then
  accumulates relu(exp2(S - LSE) + tau / i) @ V over its keys, the scores read back (KEEP) or recomputed from K.
  It writes O itself when NS == 1 (DIRECT), else its fp32 partial -> O_PART [NS, B * Hkv, R, D].
- ``kvcache_reduce_kernel`` (NS > 1): O = the sum of O_PART over the non-empty splits, blocks of splits loaded
  at once. The output is a plain sum over keys (no renormalisation), so the partials need no rescaling.

With NS == 1 the launcher runs ``kvcache_fused_kernel`` instead (grid (B * Hkv, cdiv(R, BLOCK_M))): pass 1, a CTA
barrier, pass 2 in one program, through the same helpers (``_split_lse``, ``_split_out``), and it writes O; no
launch between the sweeps. EVICT: K and V loads evict-first, the kept scores evict-last in the L2.

A split's leading key blocks that every row of the tile sees at distance >= W (``_free_end``) skip the bias and
the masks; the rest gather the bias of each score from Bias [H, W] fp32 (contiguous rows) at a clamped distance.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ._lazy_attention_fwd import _gather

LOG2E = tl.constexpr(1.4426950408889634)


@triton.jit
def _split_range(n_b, split, NS, BLOCK_N: tl.constexpr):
    """(lo, hi, chunk): the keys [lo, hi) of split ``split`` when keys [0, n_b) are cut into NS splits."""
    chunk = tl.cdiv(tl.cdiv(n_b, NS), BLOCK_N) * BLOCK_N
    lo = split * chunk
    hi = tl.minimum(lo + chunk, n_b)
    return lo, hi, chunk


@triton.jit
def _row_block(r0, R, LQ, G, hk, n_b, BLOCK_M: tl.constexpr):
    """(offs_r, rr, h, j, pos) of tile rows r0 .. r0 + BLOCK_M: row index, the row it reads (rows past R repeat
    row R - 1, so every value stays finite; they are never stored), query head, query index, absolute position."""
    offs_r = r0 + tl.arange(0, BLOCK_M)
    rr = tl.minimum(offs_r, R - 1)
    g = rr // LQ
    j = rr - g * LQ
    return offs_r, rr, hk * G + g, j, n_b - LQ + j


@triton.jit
def _free_end(lo, hi, n_b, LQ, W, BLOCK_N: tl.constexpr):
    """The end of the split's leading whole key blocks that need no bias and no mask: keys before
    n_b - Lq - W + 1 are visible to every query of the batch row and at distance >= W from all of them."""
    band = n_b - LQ - W + 1
    return lo + tl.maximum(tl.minimum(band, hi) - lo, 0) // BLOCK_N * BLOCK_N


@triton.jit
def _load_q(Q, b, h, j, stride_qb, stride_qh, stride_qm, stride_qd, HEAD_DIM: tl.constexpr, UPCAST: tl.constexpr):
    offs_d = tl.arange(0, HEAD_DIM)
    q = tl.load(Q + b.to(tl.int64) * stride_qb + h[:, None].to(tl.int64) * stride_qh + j[:, None] * stride_qm
                + offs_d[None, :] * stride_qd)
    if UPCAST:
        q = q.to(tl.float32)
    return q


@triton.jit
def _score_tile(q, k_base, stride_kn, stride_kd, offs_n, hi, pos, brow, W, qk_scale, BAND: tl.constexpr,
                HEAD_DIM: tl.constexpr, UPCAST: tl.constexpr, PREC: tl.constexpr, EVICT: tl.constexpr):
    """Log2-domain scores [BLOCK_M, BLOCK_N] of keys ``offs_n``; BAND: with the bias of distance pos - n < W
    (``brow``: the rows' bias pointers) and -inf where n > pos or n >= hi."""
    offs_d = tl.arange(0, HEAD_DIM)
    kt_ptr = k_base + offs_n[None, :] * stride_kn + offs_d[:, None] * stride_kd
    if BAND:
        kt = tl.load(kt_ptr, mask=offs_n[None, :] < hi, other=0.0, eviction_policy="evict_first" if EVICT else "")
    else:
        kt = tl.load(kt_ptr, eviction_policy="evict_first" if EVICT else "")
    if UPCAST:
        kt = kt.to(tl.float32)
    s = tl.dot(q, kt, input_precision=PREC) * qk_scale
    if BAND:
        d = pos[:, None] - offs_n[None, :]
        b = _gather(brow[:, None] + tl.minimum(tl.maximum(d, 0), W - 1))
        s = s + tl.where(d < W, b * LOG2E, 0.0)
        s = tl.where((d >= 0) & (offs_n[None, :] < hi), s, float("-inf"))
    return s


@triton.jit
def _online(m_i, l_i, s):
    """Running row max and sum of exp2(s - max); rows with every score -inf so far keep (-inf, 0)."""
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    l_i = l_i * tl.math.exp2(m_i - m_use) + tl.sum(tl.math.exp2(s - m_use[:, None]), 1)
    return m_new, l_i


@triton.jit
def _split_lse(q, k_base, brow, sc_rows, row_ok, stride_kn, stride_kd, lo, hi, n_b, pos, LQ, W, qk_scale,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, KEEP: tl.constexpr, HEAD_DIM: tl.constexpr,
               UPCAST: tl.constexpr, PREC: tl.constexpr, EVICT: tl.constexpr):
    """The log2-domain LSE [BLOCK_M] of each row over keys [lo, hi), their scores stored (KEEP) on the way."""
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    free_end = _free_end(lo, hi, n_b, LQ, W, BLOCK_N)
    for start in range(lo, free_end, BLOCK_N):
        offs_n = tl.multiple_of(start, BLOCK_N) + tl.arange(0, BLOCK_N)
        s = _score_tile(q, k_base, stride_kn, stride_kd, offs_n, hi, pos, brow, W, qk_scale, False, HEAD_DIM,
                        UPCAST, PREC, EVICT)
        if KEEP:
            tl.store(sc_rows + offs_n[None, :], s, mask=row_ok[:, None], eviction_policy="evict_last" if EVICT else "")
        m_i, l_i = _online(m_i, l_i, s)
    for start in range(free_end, hi, BLOCK_N):
        offs_n = tl.multiple_of(start, BLOCK_N) + tl.arange(0, BLOCK_N)
        s = _score_tile(q, k_base, stride_kn, stride_kd, offs_n, hi, pos, brow, W, qk_scale, True, HEAD_DIM,
                        UPCAST, PREC, EVICT)
        if KEEP:  # a tile past hi ends past n_b (split boundaries are whole tiles): no other split's keys
            tl.store(sc_rows + offs_n[None, :], s, mask=row_ok[:, None], eviction_policy="evict_last" if EVICT else "")
        m_i, l_i = _online(m_i, l_i, s)
    return m_i + tl.math.log2(l_i)


@triton.jit
def kvcache_lse_kernel(
        Q, K, Bias, Seqlens, SCORES, LSE_PART,
        stride_qb, stride_qh, stride_qm, stride_qd,
        stride_kb, stride_kh, stride_kn, stride_kd,
        stride_bh, stride_sc_bk, stride_sc_r, stride_lp_s, stride_lp_bk,
        Hkv, G, LQ, R, W, NS, qk_scale,
        HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, KEEP: tl.constexpr,
        UPCAST: tl.constexpr, PREC: tl.constexpr, EVICT: tl.constexpr):
    """Pass 1, grid (NS, B * Hkv, cdiv(R, BLOCK_M)): the split's partial LSE (log2) per row, and its scores (KEEP)."""
    split = tl.program_id(0)
    bk = tl.program_id(1)
    b = bk // Hkv
    hk = bk - b * Hkv
    n_b = tl.load(Seqlens + b)
    lo, hi, _ = _split_range(n_b, split, NS, BLOCK_N)
    offs_r, rr, h, j, pos = _row_block(tl.program_id(2) * BLOCK_M, R, LQ, G, hk, n_b, BLOCK_M)
    row_ok = offs_r < R
    q = _load_q(Q, b, h, j, stride_qb, stride_qh, stride_qm, stride_qd, HEAD_DIM, UPCAST)
    k_base = K + b.to(tl.int64) * stride_kb + hk.to(tl.int64) * stride_kh
    brow = Bias + h * stride_bh
    sc_rows = SCORES + bk.to(tl.int64) * stride_sc_bk + rr[:, None].to(tl.int64) * stride_sc_r
    lse2 = _split_lse(q, k_base, brow, sc_rows, row_ok, stride_kn, stride_kd, lo, hi, n_b, pos, LQ, W, qk_scale,
                      BLOCK_M, BLOCK_N, KEEP, HEAD_DIM, UPCAST, PREC, EVICT)
    tl.store(LSE_PART + split * stride_lp_s + bk * stride_lp_bk + offs_r, lse2, mask=row_ok & (offs_r * 0 + lo < hi))


@triton.jit
def _final_lse(LSE_PART, bk, rr, n_used, stride_lp_s, stride_lp_bk, NS_POW2: tl.constexpr):
    """The rows' log2-domain LSE from the partial LSEs of the first ``n_used`` splits."""
    offs_s = tl.arange(0, NS_POW2)
    part = tl.load(LSE_PART + offs_s[:, None] * stride_lp_s + bk * stride_lp_bk + rr[None, :],
                   mask=offs_s[:, None] < n_used, other=float("-inf"))
    mx = tl.max(part, 0)
    return mx + tl.math.log2(tl.sum(tl.math.exp2(part - mx[None, :]), 0))


@triton.jit
def _out_tiles(acc, q, k_base, v_base, sc_rows, row_ok, stride_kn, stride_kd, stride_vn, stride_vd, lo, hi, pos, brow,
               W, qk_scale, lse2, taui, BAND: tl.constexpr, KEEP: tl.constexpr, HEAD_DIM: tl.constexpr,
               BLOCK_N: tl.constexpr, UPCAST: tl.constexpr, PREC: tl.constexpr, EVICT: tl.constexpr):
    """acc += relu(exp2(S - LSE2) + tau / i) @ V over key blocks [lo, hi) (BAND: re-masked, see the module doc)."""
    offs_d = tl.arange(0, HEAD_DIM)
    for start in range(lo, hi, BLOCK_N):
        offs_n = tl.multiple_of(start, BLOCK_N) + tl.arange(0, BLOCK_N)
        if KEEP:  # pass 1 stored whole tiles of the valid rows
            s = tl.load(sc_rows + offs_n[None, :], mask=row_ok[:, None], other=float("-inf"),
                        eviction_policy="evict_last" if EVICT else "")
        else:
            s = _score_tile(q, k_base, stride_kn, stride_kd, offs_n, hi, pos, brow, W, qk_scale, BAND, HEAD_DIM,
                            UPCAST, PREC, EVICT)
        v_ptr = v_base + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd
        if BAND:
            # a row at position 0 has one visible key: P = exp2(S - S) = 1 exactly, whatever the LSE's rounding
            p = tl.math.exp2(s - tl.where(pos[:, None] == 0, s, lse2[:, None]))
            v = tl.load(v_ptr, mask=offs_n[:, None] < hi, other=0.0, eviction_policy="evict_first" if EVICT else "")
        else:
            p = tl.math.exp2(s - lse2[:, None])
            v = tl.load(v_ptr, eviction_policy="evict_first" if EVICT else "")
        if UPCAST:
            v = v.to(tl.float32)
        x = p + taui[:, None]
        a = tl.where(x < 0.0, 0.0, x)  # relu that keeps a NaN
        if BAND:  # tau > 0 must not reach keys after the query (nor past the split)
            a = tl.where((offs_n[None, :] <= pos[:, None]) & (offs_n[None, :] < hi), a, 0.0)
        acc = tl.dot(a.to(v.dtype), v, acc, input_precision=PREC)
    return acc


@triton.jit
def _split_out(q, k_base, v_base, sc_rows, row_ok, stride_kn, stride_kd, stride_vn, stride_vd, lo, hi, n_b, pos, brow,
               LQ, W, qk_scale, lse2, taui, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, KEEP: tl.constexpr,
               HEAD_DIM: tl.constexpr, UPCAST: tl.constexpr, PREC: tl.constexpr, EVICT: tl.constexpr):
    """The fp32 share [BLOCK_M, HEAD_DIM] of O of keys [lo, hi): the bias-free leading blocks, then the band."""
    free_end = _free_end(lo, hi, n_b, LQ, W, BLOCK_N)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    acc = _out_tiles(acc, q, k_base, v_base, sc_rows, row_ok, stride_kn, stride_kd, stride_vn, stride_vd, lo, free_end,
                     pos, brow, W, qk_scale, lse2, taui, False, KEEP, HEAD_DIM, BLOCK_N, UPCAST, PREC, EVICT)
    acc = _out_tiles(acc, q, k_base, v_base, sc_rows, row_ok, stride_kn, stride_kd, stride_vn, stride_vd, free_end, hi,
                     pos, brow, W, qk_scale, lse2, taui, True, KEEP, HEAD_DIM, BLOCK_N, UPCAST, PREC, EVICT)
    return acc


@triton.jit
def _store_o(O, acc, b, h, j, row_ok, stride_ob, stride_oh, stride_om, stride_od, HEAD_DIM: tl.constexpr):
    offs_d = tl.arange(0, HEAD_DIM)
    o_ptr = (O + b.to(tl.int64) * stride_ob + h[:, None].to(tl.int64) * stride_oh + j[:, None] * stride_om
             + offs_d[None, :] * stride_od)
    tl.store(o_ptr, acc.to(O.dtype.element_ty), mask=row_ok[:, None])


@triton.jit
def kvcache_out_kernel(
        Q, K, V, Bias, Tau, Seqlens, SCORES, LSE_PART, O, O_PART,
        stride_qb, stride_qh, stride_qm, stride_qd,
        stride_kb, stride_kh, stride_kn, stride_kd,
        stride_vb, stride_vh, stride_vn, stride_vd,
        stride_ob, stride_oh, stride_om, stride_od,
        stride_bh, stride_sc_bk, stride_sc_r, stride_lp_s, stride_lp_bk, stride_op_s, stride_op_bk, stride_op_r,
        Hkv, G, LQ, R, W, NS, qk_scale,
        HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, NS_POW2: tl.constexpr,
        KEEP: tl.constexpr, DIRECT: tl.constexpr, UPCAST: tl.constexpr, PREC: tl.constexpr, EVICT: tl.constexpr):
    """Pass 2, grid (NS, B * Hkv, cdiv(R, BLOCK_M)): the split's share of O (all of it when DIRECT)."""
    split = tl.program_id(0)
    bk = tl.program_id(1)
    b = bk // Hkv
    hk = bk - b * Hkv
    n_b = tl.load(Seqlens + b)
    lo, hi, chunk = _split_range(n_b, split, NS, BLOCK_N)
    offs_r, rr, h, j, pos = _row_block(tl.program_id(2) * BLOCK_M, R, LQ, G, hk, n_b, BLOCK_M)
    row_ok = offs_r < R
    lse2 = _final_lse(LSE_PART, bk, rr, tl.cdiv(n_b, chunk), stride_lp_s, stride_lp_bk, NS_POW2)
    taui = tl.load(Tau + h) / (pos + 1).to(tl.float32)
    if KEEP:
        q = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)  # unused: the scores are read back
    else:
        q = _load_q(Q, b, h, j, stride_qb, stride_qh, stride_qm, stride_qd, HEAD_DIM, UPCAST)
    k_base = K + b.to(tl.int64) * stride_kb + hk.to(tl.int64) * stride_kh
    v_base = V + b.to(tl.int64) * stride_vb + hk.to(tl.int64) * stride_vh
    brow = Bias + h * stride_bh
    sc_rows = SCORES + bk.to(tl.int64) * stride_sc_bk + rr[:, None].to(tl.int64) * stride_sc_r
    acc = _split_out(q, k_base, v_base, sc_rows, row_ok, stride_kn, stride_kd, stride_vn, stride_vd, lo, hi, n_b, pos,
                     brow, LQ, W, qk_scale, lse2, taui, BLOCK_M, BLOCK_N, KEEP, HEAD_DIM, UPCAST, PREC, EVICT)
    if DIRECT:
        _store_o(O, acc, b, h, j, row_ok, stride_ob, stride_oh, stride_om, stride_od, HEAD_DIM)
    else:
        offs_d = tl.arange(0, HEAD_DIM)
        op_ptr = O_PART + split * stride_op_s + bk * stride_op_bk + offs_r[:, None] * stride_op_r + offs_d[None, :]
        tl.store(op_ptr, acc, mask=(row_ok & (offs_r * 0 + lo < hi))[:, None])


@triton.jit
def kvcache_fused_kernel(
        Q, K, V, Bias, Tau, Seqlens, SCORES, O,
        stride_qb, stride_qh, stride_qm, stride_qd,
        stride_kb, stride_kh, stride_kn, stride_kd,
        stride_vb, stride_vh, stride_vn, stride_vd,
        stride_ob, stride_oh, stride_om, stride_od,
        stride_bh, stride_sc_bk, stride_sc_r,
        Hkv, G, LQ, R, W, qk_scale,
        HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, KEEP: tl.constexpr,
        UPCAST: tl.constexpr, PREC: tl.constexpr, EVICT: tl.constexpr):
    """Both passes of one split in one program, grid (B * Hkv, cdiv(R, BLOCK_M)): every key of the batch row, so
    the program's own LSE is final; the same operations in the same order as pass 1 then pass 2 with NS = 1."""
    bk = tl.program_id(0)
    b = bk // Hkv
    hk = bk - b * Hkv
    n_b = tl.load(Seqlens + b)
    offs_r, rr, h, j, pos = _row_block(tl.program_id(1) * BLOCK_M, R, LQ, G, hk, n_b, BLOCK_M)
    row_ok = offs_r < R
    q = _load_q(Q, b, h, j, stride_qb, stride_qh, stride_qm, stride_qd, HEAD_DIM, UPCAST)
    k_base = K + b.to(tl.int64) * stride_kb + hk.to(tl.int64) * stride_kh
    v_base = V + b.to(tl.int64) * stride_vb + hk.to(tl.int64) * stride_vh
    brow = Bias + h * stride_bh
    sc_rows = SCORES + bk.to(tl.int64) * stride_sc_bk + rr[:, None].to(tl.int64) * stride_sc_r
    lse2 = _split_lse(q, k_base, brow, sc_rows, row_ok, stride_kn, stride_kd, 0, n_b, n_b, pos, LQ, W, qk_scale,
                      BLOCK_M, BLOCK_N, KEEP, HEAD_DIM, UPCAST, PREC, EVICT)
    if KEEP:
        tl.debug_barrier()  # the scores one thread stored are read back by another
    taui = tl.load(Tau + h) / (pos + 1).to(tl.float32)
    acc = _split_out(q, k_base, v_base, sc_rows, row_ok, stride_kn, stride_kd, stride_vn, stride_vd, 0, n_b, n_b, pos,
                     brow, LQ, W, qk_scale, lse2, taui, BLOCK_M, BLOCK_N, KEEP, HEAD_DIM, UPCAST, PREC, EVICT)
    _store_o(O, acc, b, h, j, row_ok, stride_ob, stride_oh, stride_om, stride_od, HEAD_DIM)


@triton.jit
def kvcache_reduce_kernel(
        O_PART, O, Seqlens,
        stride_op_s, stride_op_bk, stride_op_r, stride_ob, stride_oh, stride_om, stride_od,
        Hkv, G, LQ, R, NS,
        HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
        SPLIT_BLOCK: tl.constexpr):
    """Grid (B * Hkv, cdiv(R, BLOCK_M), HEAD_DIM / BLOCK_D): O = the sum of O_PART over the non-empty splits
    (BLOCK_N: the passes' tile). SPLIT_BLOCK partials are loaded at once and summed as a tree, the blocks in split
    order: the loads of a block are in flight together (a decode step is latency-bound here), and the order of
    the additions is fixed by the shapes, so reruns are bitwise equal."""
    bk = tl.program_id(0)
    b = bk // Hkv
    hk = bk - b * Hkv
    n_b = tl.load(Seqlens + b)
    _, _, chunk = _split_range(n_b, 0, NS, BLOCK_N)
    n_used = tl.cdiv(n_b, chunk)
    offs_r, rr, h, j, _ = _row_block(tl.program_id(1) * BLOCK_M, R, LQ, G, hk, n_b, BLOCK_M)
    offs_d = tl.program_id(2) * BLOCK_D + tl.arange(0, BLOCK_D)
    offs_s = tl.arange(0, SPLIT_BLOCK)
    part = O_PART + bk * stride_op_bk + rr[None, :, None] * stride_op_r + offs_d[None, None, :]
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    for s0 in range(0, n_used, SPLIT_BLOCK):
        split = s0 + offs_s
        acc += tl.sum(tl.load(part + split[:, None, None] * stride_op_s, mask=(split < n_used)[:, None, None],
                              other=0.0), 0)
    o_ptr = (O + b.to(tl.int64) * stride_ob + h[:, None].to(tl.int64) * stride_oh + j[:, None] * stride_om
             + offs_d[None, :] * stride_od)
    tl.store(o_ptr, acc.to(O.dtype.element_ty), mask=(offs_r < R)[:, None])
