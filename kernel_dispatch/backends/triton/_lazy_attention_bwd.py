"""Triton lazy attention backward kernels (deterministic: no atomics anywhere).

Two kernels, run in this order:

- ``lazy_attention_bwd_dq_kernel``: one program per (b, h, BLOCK query rows). Per row it sums
  R = sum_n Mk dA and Delta = sum_n P Mk dA (stored for the next kernel) and the block's dtau partial
  sum_m R / i. Key blocks within W (and the masked ones) are swept twice: once for R and Delta, once,
  after Delta is final, for their exact dS, which gives their part of dQ and the diagonal sums of dS
  for dbias, written to a per-program scratch row (no float atomics: the launcher reduces the partials
  with torch.sum). The far key blocks, which need no dbias, are swept once in between: for any row
  constant D0, their dQ is sum P (Mk dA - D0) k - (Delta - D0) sum P k, so the sweep accumulates both
  sums with D0 = dO . O (the forward's output) next to R and Delta.
- ``lazy_attention_bwd_dkdv_kernel``: one program per (b, kv head, BLOCK_N keys), looping over
  the query heads of its group and their query blocks, so dK/dV of a kv head sum in registers.

Diagonal sums: for a tile of BLOCK query rows at ``start_m`` and BLOCK keys at ``start_n``
(``start_m - start_n = kk * BLOCK``), distances d = m - n fall in two segments of BLOCK:
segment kk (d = kk*BLOCK + j) holds ds[r, r - j] for j <= r, segment kk - 1 holds ds[r, r - j + BLOCK]
for j > r. One ``tl.gather`` with column index (r - j) mod BLOCK gives both. Consecutive tiles
of a program share a segment; the shared half is carried in registers so each program writes each
segment once.

Packed documents (``VARLEN``, SPEC section 4) as in the forward kernel (``b`` is a document's first token, ``L``
is T, programs past their document's end exit). The dq programs of a document d write their dtau and dbias
partials to rows d + cu[d] // BLOCK + pid_m, one row per (document, query block) and fewer than
N + cdiv(T, BLOCK) in all (zero rows where no program writes), so the launcher sums them in a fixed order.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ._autotune import INTERPRETED, autotune
from ._lazy_attention_fwd import (_bias_mask, _document, _launch_class, _one_key_rows, _query_regions, _relu, _valid,
                                  lse2_of, p_of)

_C = triton.Config
# dq: BLOCK query rows = keys per tile. BLOCK fixes the layout of the dbias partial sums, which the launcher
# allocates before the autotuner picks: one BLOCK per config class.
DQ_CONFIGS = {
    ("half", 64): [_C({"BLOCK": 64}, num_warps=8, num_stages=2), _C({"BLOCK": 64}, num_warps=4, num_stages=2),
                   _C({"BLOCK": 64}, num_warps=4, num_stages=3)],
    ("half", 128): [_C({"BLOCK": 64}, num_warps=8, num_stages=2), _C({"BLOCK": 64}, num_warps=8, num_stages=3),
                    _C({"BLOCK": 64}, num_warps=4, num_stages=2), _C({"BLOCK": 64}, num_warps=4, num_stages=3)],
    ("fp32", 64): [_C({"BLOCK": 32}, num_warps=4, num_stages=2)],
    ("fp32", 128): [_C({"BLOCK": 32}, num_warps=4, num_stages=2)],
}
DQ_INTERPRET_CONFIG = _C({"BLOCK": 16}, num_warps=1, num_stages=1)
assert all(len({c.kwargs["BLOCK"] for c in cs}) == 1 for cs in DQ_CONFIGS.values()), "one dq BLOCK per class"
# dK/dV: BLOCK_M queries x BLOCK_N keys per tile.
DKDV_CONFIGS = {
    ("half", 64): [_C({"BLOCK_M": 32, "BLOCK_N": 128}, num_warps=8, num_stages=2),
                   _C({"BLOCK_M": 32, "BLOCK_N": 64}, num_warps=4, num_stages=2),
                   _C({"BLOCK_M": 64, "BLOCK_N": 64}, num_warps=8, num_stages=2),
                   _C({"BLOCK_M": 32, "BLOCK_N": 64}, num_warps=4, num_stages=3),
                   _C({"BLOCK_M": 32, "BLOCK_N": 128}, num_warps=4, num_stages=2)],
    ("half", 128): [_C({"BLOCK_M": 32, "BLOCK_N": 128}, num_warps=8, num_stages=2),
                    _C({"BLOCK_M": 16, "BLOCK_N": 128}, num_warps=8, num_stages=2),
                    _C({"BLOCK_M": 32, "BLOCK_N": 64}, num_warps=8, num_stages=2),
                    _C({"BLOCK_M": 32, "BLOCK_N": 128}, num_warps=4, num_stages=2),
                    _C({"BLOCK_M": 32, "BLOCK_N": 64}, num_warps=4, num_stages=2)],
    ("fp32", 64): [_C({"BLOCK_M": 32, "BLOCK_N": 64}, num_warps=8, num_stages=2),
                   _C({"BLOCK_M": 32, "BLOCK_N": 32}, num_warps=4, num_stages=2)],
    ("fp32", 128): [_C({"BLOCK_M": 32, "BLOCK_N": 64}, num_warps=8, num_stages=2),
                    _C({"BLOCK_M": 32, "BLOCK_N": 32}, num_warps=4, num_stages=2)],
}
DKDV_INTERPRET_CONFIG = _C({"BLOCK_M": 16, "BLOCK_N": 32}, num_warps=1, num_stages=1)


@triton.jit
def _bwd_row_sums(r_acc, d_acc, q, do, lse2, taui, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd,
                  bias_row, stride_bw, offs_m, lo, hi, W, kv_len, L, qk_scale, CAUSAL: tl.constexpr,
                  BIAS: tl.constexpr, MASK: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK: tl.constexpr,
                  PREC: tl.constexpr):
    """R += sum_n Mk dA and Delta += sum_n P Mk dA over key blocks [lo, hi)."""
    offs_d = tl.arange(0, HEAD_DIM)
    for start_n in range(lo, hi, BLOCK):
        offs_n = start_n + tl.arange(0, BLOCK)
        kt_ptr = k_base + offs_n[None, :] * stride_kn + offs_d[:, None] * stride_kd
        vt_ptr = v_base + offs_n[None, :] * stride_vn + offs_d[:, None] * stride_vd
        if MASK:
            kt = tl.load(kt_ptr, mask=offs_n[None, :] < kv_len, other=0.0)
            vt = tl.load(vt_ptr, mask=offs_n[None, :] < kv_len, other=0.0)
        else:
            kt = tl.load(kt_ptr)
            vt = tl.load(vt_ptr)
        if INTERPRETED:
            kt = kt.to(tl.float32)
            vt = vt.to(tl.float32)
        s = tl.dot(q, kt, input_precision=PREC) * qk_scale
        s = _bias_mask(s, offs_m[:, None], offs_n[None, :], bias_row, stride_bw, W, kv_len, CAUSAL, BIAS, MASK)
        p = p_of(s - lse2[:, None])
        if MASK:
            p = _one_key_rows(p, offs_m[:, None], offs_n[None, :], kv_len, CAUSAL)
        keep = (p + taui[:, None]) > 0
        if MASK:
            keep = keep & _valid(offs_m[:, None], offs_n[None, :], kv_len, CAUSAL)
        dpm = tl.dot(do, vt, input_precision=PREC) * keep.to(tl.float32)
        r_acc += tl.sum(dpm, 1)
        d_acc += tl.sum(p * dpm, 1)
    return r_acc, d_acc


@triton.jit
def _bwd_far(x, y, r_acc, d_acc, q, do, d0, lse2, taui, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd,
             lo, hi, qk_scale, HEAD_DIM: tl.constexpr, BLOCK: tl.constexpr, PREC: tl.constexpr):
    """Far key blocks [lo, hi) (no bias, no mask) in one sweep: R and Delta as :func:`_bwd_row_sums`, and
    x += P (Mk dA - D0) K, y += P K, so that their dQ is x - (Delta - D0) y once Delta is final."""
    offs_d = tl.arange(0, HEAD_DIM)
    for start_n in range(lo, hi, BLOCK):
        offs_n = start_n + tl.arange(0, BLOCK)
        k = tl.load(k_base + offs_n[:, None] * stride_kn + offs_d[None, :] * stride_kd)
        vt = tl.load(v_base + offs_n[None, :] * stride_vn + offs_d[:, None] * stride_vd)
        if INTERPRETED:
            k = k.to(tl.float32)
            vt = vt.to(tl.float32)
        p = p_of(tl.dot(q, tl.trans(k), input_precision=PREC) * qk_scale - lse2[:, None])
        dpm = tl.dot(do, vt, input_precision=PREC) * (p + taui[:, None] > 0).to(tl.float32)
        pdp = p * dpm
        r_acc += tl.sum(dpm, 1)
        d_acc += tl.sum(pdp, 1)
        x = tl.dot((pdp - p * d0[:, None]).to(k.dtype), k, x, input_precision=PREC)
        y = tl.dot(p.to(k.dtype), k, y, input_precision=PREC)
    return x, y, r_acc, d_acc


@triton.jit
def _bwd_dq(dq, carry, carry_seg, q, do, lse2, taui, delta, k_base, v_base, stride_kn, stride_kd, stride_vn,
            stride_vd, bias_row, stride_bw, db_row, start_m, offs_m, lo, hi, W, kv_len, L, qk_scale, NSEG, SEG_OFF,
            CAUSAL: tl.constexpr, BIAS: tl.constexpr, MASK: tl.constexpr, HEAD_DIM: tl.constexpr,
            BLOCK: tl.constexpr, PREC: tl.constexpr):
    """dq += dS @ K over key blocks [lo, hi); with BIAS also the dS diagonal sums (see module doc)."""
    offs_d = tl.arange(0, HEAD_DIM)
    offs_j = tl.arange(0, BLOCK)
    for start_n in range(lo, hi, BLOCK):
        offs_n = start_n + tl.arange(0, BLOCK)
        k_ptr = k_base + offs_n[:, None] * stride_kn + offs_d[None, :] * stride_kd
        vt_ptr = v_base + offs_n[None, :] * stride_vn + offs_d[:, None] * stride_vd
        if MASK:
            k = tl.load(k_ptr, mask=offs_n[:, None] < kv_len, other=0.0)
            vt = tl.load(vt_ptr, mask=offs_n[None, :] < kv_len, other=0.0)
        else:
            k = tl.load(k_ptr)
            vt = tl.load(vt_ptr)
        if INTERPRETED:
            k = k.to(tl.float32)
            vt = vt.to(tl.float32)
        s = tl.dot(q, tl.trans(k), input_precision=PREC) * qk_scale
        s = _bias_mask(s, offs_m[:, None], offs_n[None, :], bias_row, stride_bw, W, kv_len, CAUSAL, BIAS, MASK)
        p = p_of(s - lse2[:, None])
        if MASK:
            p = _one_key_rows(p, offs_m[:, None], offs_n[None, :], kv_len, CAUSAL)
        keep = (p + taui[:, None]) > 0
        if MASK:
            keep = keep & _valid(offs_m[:, None], offs_n[None, :], kv_len, CAUSAL)
        dp = tl.dot(do, vt, input_precision=PREC) * keep.to(tl.float32)
        ds = p * (dp - delta[:, None])
        dq = tl.dot(ds.to(k.dtype), k, dq, input_precision=PREC)
        if BIAS:
            seg = (start_m - start_n) // BLOCK + SEG_OFF
            rows = offs_j[:, None]
            cols = offs_j[None, :]
            g = tl.gather(ds, (rows - cols + BLOCK) % BLOCK, 1)
            upper = cols <= rows
            this_seg = carry + tl.sum(tl.where(upper, g, 0.0), 0)
            seg_j = offs_j * 0 + seg
            tl.store(db_row + seg * BLOCK + offs_j, this_seg, mask=(seg_j >= 0) & (seg_j < NSEG))
            carry = tl.sum(tl.where(upper, 0.0, g), 0)
            carry_seg = seg - 1
    return dq, carry, carry_seg


@autotune(DQ_CONFIGS, DQ_INTERPRET_CONFIG, key=["HEAD_DIM", "CAUSAL", "L_CLASS", "VARLEN"], class_of=_launch_class)
@triton.jit
def lazy_attention_bwd_dq_kernel(
        Q, K, V, Bias, Tau, Lens, DO, O, LSE, DQ, DELTA, DTAU_PART, DB_PART,
        stride_qb, stride_qh, stride_qm, stride_qd,
        stride_kb, stride_kh, stride_kn, stride_kd,
        stride_vb, stride_vh, stride_vn, stride_vd,
        stride_dob, stride_doh, stride_dom, stride_dod,
        stride_ob, stride_oh, stride_om, stride_od,
        stride_bh, stride_bw, stride_tau,
        H, L, W, GROUPS, qk_scale, sm_scale, NSEG, SEG_OFF, BH_OFF,
        CAUSAL: tl.constexpr, HAS_LENS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK: tl.constexpr,
        PREC: tl.constexpr, L_CLASS, VARLEN: tl.constexpr = False):
    """Grid (cdiv(L, BLOCK), n_bh) over (b, h) pairs BH_OFF ... BH_OFF + n_bh - 1 (b * H + h).

    Writes DQ [B, H, L, D] (contiguous), DELTA [B*H, L], DTAU_PART [B*H, n_blocks] and
    DB_PART [n_bh, n_blocks, NSEG, BLOCK] (diagonal sums of dS, segment s holding
    d = (s - SEG_OFF) * BLOCK + j; slots not written must be zero).

    VARLEN: grid (N, cdiv(max_seqlen, BLOCK), n_h) over heads BH_OFF ... BH_OFF + n_h - 1; writes DQ [T, H, D]
    (contiguous), DELTA [H, T], DTAU_PART [H, R] and DB_PART [n_h, R, NSEG, BLOCK], R = N + cdiv(T, BLOCK) rows
    (see the module doc).
    """
    if VARLEN:
        pid_m = tl.num_programs(1) - 1 - tl.program_id(1)
        start_m = pid_m * BLOCK
        h = tl.program_id(2) + BH_OFF
        b, seq_len = _document(Lens, tl.program_id(0))
        if start_m >= seq_len:
            return
        hk = h // GROUPS
        row = tl.program_id(0) + b // BLOCK + pid_m
        n_rows = tl.num_programs(0) + tl.cdiv(L, BLOCK)
        h64 = h.to(tl.int64)
        lse_row = LSE + h64 * L + b
        delta_row = DELTA + h64 * L + b
        dtau_slot = DTAU_PART + h64 * n_rows + row
        db_row = DB_PART + (tl.program_id(2).to(tl.int64) * n_rows + row) * NSEG * BLOCK
        dq_base = DQ + b.to(tl.int64) * H * HEAD_DIM + h * HEAD_DIM
        L = seq_len
    else:
        pid_m = tl.num_programs(0) - 1 - tl.program_id(0)
        start_m = pid_m * BLOCK
        bh = tl.program_id(1) + BH_OFF
        b = bh // H
        h = bh % H
        hk = h // GROUPS
        if HAS_LENS:
            seq_len = tl.load(Lens + b).to(tl.int32)
        else:
            seq_len = L
    offs_m = start_m + tl.arange(0, BLOCK)
    offs_d = tl.arange(0, HEAD_DIM)
    b64 = b.to(tl.int64)
    if not VARLEN:
        bh64 = bh.to(tl.int64)
    q_ptr = Q + b64 * stride_qb + h.to(tl.int64) * stride_qh + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd
    q = tl.load(q_ptr, mask=offs_m[:, None] < seq_len, other=0.0)  # padding is never read
    do_ptr = DO + b64 * stride_dob + h.to(tl.int64) * stride_doh + offs_m[:, None] * stride_dom + offs_d[None, :] * stride_dod
    do = tl.load(do_ptr, mask=offs_m[:, None] < seq_len, other=0.0)  # padded rows get no gradient
    if INTERPRETED:
        q = q.to(tl.float32)
        do = do.to(tl.float32)
    # rows past lengths[b] get LSE = inf, so exp2(S - LSE) = 0 there: with a large bias S alone overflows
    if VARLEN:
        lse2 = lse2_of(tl.load(lse_row + offs_m, mask=offs_m < seq_len, other=float("inf")))
    else:
        lse2 = lse2_of(tl.load(LSE + bh64 * L + offs_m, mask=offs_m < seq_len, other=float("inf")))
    k_base = K + b64 * stride_kb + hk.to(tl.int64) * stride_kh
    v_base = V + b64 * stride_vb + hk.to(tl.int64) * stride_vh
    bias_row = Bias + h * stride_bh
    tau = tl.load(Tau + h * stride_tau)
    if CAUSAL:
        inv_i = 1.0 / (offs_m + 1).to(tl.float32)
    else:
        inv_i = 1.0 / (tl.zeros([BLOCK], dtype=tl.float32) + seq_len)
    taui = tau * inv_i

    band, mask, end = _query_regions(start_m, seq_len, W, BLOCK, BLOCK, CAUSAL)
    end = tl.where(start_m < seq_len, end, 0)
    mask = tl.minimum(mask, end)
    band = tl.minimum(band, end)

    # bias band and masked blocks first (their dS must be exact for dbias, so they wait for the final Delta);
    # then the far blocks in one fused sweep, with D0 = dO . O as the provisional Delta
    r_acc = tl.zeros([BLOCK], dtype=tl.float32)
    d_acc = tl.zeros([BLOCK], dtype=tl.float32)
    r_acc, d_acc = _bwd_row_sums(r_acc, d_acc, q, do, lse2, taui, k_base, v_base, stride_kn, stride_kd, stride_vn,
                                 stride_vd, bias_row, stride_bw, offs_m, band, mask, W, seq_len, L, qk_scale,
                                 CAUSAL, True, False, HEAD_DIM, BLOCK, PREC)
    r_acc, d_acc = _bwd_row_sums(r_acc, d_acc, q, do, lse2, taui, k_base, v_base, stride_kn, stride_kd, stride_vn,
                                 stride_vd, bias_row, stride_bw, offs_m, mask, end, W, seq_len, L, qk_scale,
                                 CAUSAL, True, True, HEAD_DIM, BLOCK, PREC)
    o_ptr = O + b64 * stride_ob + h.to(tl.int64) * stride_oh + offs_m[:, None] * stride_om + offs_d[None, :] * stride_od
    o = tl.load(o_ptr, mask=offs_m[:, None] < seq_len, other=0.0)
    d0 = tl.sum(do.to(tl.float32) * o.to(tl.float32), 1)
    d0 = tl.where(tl.abs(d0) < float("inf"), d0, 0.0)  # any row constant will do: not a NaN O row's
    x = tl.zeros([BLOCK, HEAD_DIM], dtype=tl.float32)
    y = tl.zeros([BLOCK, HEAD_DIM], dtype=tl.float32)
    x, y, r_acc, d_acc = _bwd_far(x, y, r_acc, d_acc, q, do, d0, lse2, taui, k_base, v_base, stride_kn, stride_kd,
                                  stride_vn, stride_vd, 0, band, qk_scale, HEAD_DIM, BLOCK, PREC)
    if VARLEN:
        tl.store(delta_row + offs_m, d_acc, mask=offs_m < L)
        tl.store(dtau_slot, tl.sum(r_acc * inv_i, 0))
    else:
        tl.store(DELTA + bh64 * L + offs_m, d_acc, mask=offs_m < L)
        tl.store(DTAU_PART + bh64 * tl.num_programs(0) + pid_m, tl.sum(r_acc * inv_i, 0))

        db_row = DB_PART + (tl.program_id(1).to(tl.int64) * tl.num_programs(0) + pid_m) * NSEG * BLOCK
    dq = x - (d_acc - d0)[:, None] * y
    carry = tl.zeros([BLOCK], dtype=tl.float32)
    carry_seg = start_m * 0 - 1
    dq, carry, carry_seg = _bwd_dq(dq, carry, carry_seg, q, do, lse2, taui, d_acc, k_base, v_base, stride_kn,
                                   stride_kd, stride_vn, stride_vd, bias_row, stride_bw, db_row, start_m, offs_m,
                                   band, mask, W, seq_len, L, qk_scale, NSEG, SEG_OFF, CAUSAL, True, False,
                                   HEAD_DIM, BLOCK, PREC)
    dq, carry, carry_seg = _bwd_dq(dq, carry, carry_seg, q, do, lse2, taui, d_acc, k_base, v_base, stride_kn,
                                   stride_kd, stride_vn, stride_vd, bias_row, stride_bw, db_row, start_m, offs_m,
                                   mask, end, W, seq_len, L, qk_scale, NSEG, SEG_OFF, CAUSAL, True, True, HEAD_DIM,
                                   BLOCK, PREC)
    offs_j = tl.arange(0, BLOCK)
    seg_j = offs_j * 0 + carry_seg
    tl.store(db_row + carry_seg * BLOCK + offs_j, carry, mask=(seg_j >= 0) & (seg_j < NSEG))
    if VARLEN:
        dq_ptr = dq_base + offs_m[:, None] * H * HEAD_DIM + offs_d[None, :]
    else:
        dq_ptr = DQ + bh64 * L * HEAD_DIM + offs_m[:, None] * HEAD_DIM + offs_d[None, :]
    tl.store(dq_ptr, (dq * sm_scale).to(DQ.dtype.element_ty), mask=offs_m[:, None] < L)


@triton.jit
def _bwd_dkdv(dk, dv, k, v, q_base, do_base, lse_base, delta_base, stride_qm, stride_qd, stride_dom, stride_dod,
              bias_row, stride_bw, tau, offs_n, lo, hi, W, kv_len, L, qk_scale, CAUSAL: tl.constexpr,
              BIAS: tl.constexpr, MASK: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
              PREC: tl.constexpr):
    """dv += A^T dO and dk += dS^T Q over query blocks [lo, hi) (tiles held transposed: [keys, queries])."""
    offs_d = tl.arange(0, HEAD_DIM)
    for start_m in range(lo, hi, BLOCK_M):
        offs_m = start_m + tl.arange(0, BLOCK_M)
        q = tl.load(q_base + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd, mask=offs_m[:, None] < kv_len,
                    other=0.0)
        do = tl.load(do_base + offs_m[:, None] * stride_dom + offs_d[None, :] * stride_dod,
                     mask=offs_m[:, None] < kv_len, other=0.0)
        if INTERPRETED:
            q = q.to(tl.float32)
            do = do.to(tl.float32)
        lse2 = lse2_of(tl.load(lse_base + offs_m, mask=offs_m < kv_len, other=float("inf")))  # as in dq
        delta = tl.load(delta_base + offs_m, mask=offs_m < kv_len, other=0.0)
        if CAUSAL:
            taui = tau / (offs_m + 1).to(tl.float32)
        else:
            taui = tau / (tl.zeros([BLOCK_M], dtype=tl.float32) + kv_len)
        st = tl.dot(k, tl.trans(q), input_precision=PREC) * qk_scale
        st = _bias_mask(st, offs_m[None, :], offs_n[:, None], bias_row, stride_bw, W, kv_len, CAUSAL, BIAS, MASK)
        pt = p_of(st - lse2[None, :])
        if MASK:
            pt = _one_key_rows(pt, offs_m[None, :], offs_n[:, None], kv_len, CAUSAL)
        shifted = pt + taui[None, :]
        keep = shifted > 0
        at = _relu(shifted)
        if MASK:
            valid = _valid(offs_m[None, :], offs_n[:, None], kv_len, CAUSAL)
            keep = keep & valid
            at = tl.where(valid, at, 0.0)
        dv = tl.dot(at.to(do.dtype), do, dv, input_precision=PREC)
        dpt = tl.dot(v, tl.trans(do), input_precision=PREC) * keep.to(tl.float32)
        dst = pt * (dpt - delta[None, :])
        dk = tl.dot(dst.to(q.dtype), q, dk, input_precision=PREC)
    return dk, dv


@autotune(DKDV_CONFIGS, DKDV_INTERPRET_CONFIG, key=["HEAD_DIM", "CAUSAL", "L_CLASS", "VARLEN"], class_of=_launch_class)
@triton.jit
def lazy_attention_bwd_dkdv_kernel(
        Q, K, V, Bias, Tau, Lens, DO, LSE, DELTA, DK, DV,
        stride_qb, stride_qh, stride_qm, stride_qd,
        stride_kb, stride_kh, stride_kn, stride_kd,
        stride_vb, stride_vh, stride_vn, stride_vd,
        stride_dob, stride_doh, stride_dom, stride_dod,
        stride_bh, stride_bw, stride_tau,
        H, HKV, L, W, GROUPS, qk_scale, sm_scale,
        CAUSAL: tl.constexpr, HAS_LENS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr, PREC: tl.constexpr, L_CLASS, VARLEN: tl.constexpr = False):
    """Grid (cdiv(L, BLOCK_N), B * Hkv). Writes DK, DV [B, Hkv, L, D] (contiguous), zero for padded keys.

    VARLEN: grid (N, cdiv(max_seqlen, BLOCK_N), Hkv); reads LSE, DELTA [H, T]; writes DK, DV [T, Hkv, D].
    """
    if VARLEN:
        start_n = tl.program_id(1) * BLOCK_N
        hk = tl.program_id(2)
        b, seq_len = _document(Lens, tl.program_id(0))
        if start_n >= seq_len:
            return
        T = L
        L = seq_len
    else:
        start_n = tl.program_id(0) * BLOCK_N
        bhk = tl.program_id(1)
        b = bhk // HKV
        hk = bhk % HKV
        if HAS_LENS:
            seq_len = tl.load(Lens + b).to(tl.int32)
        else:
            seq_len = L
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    b64 = b.to(tl.int64)
    k = tl.load(K + b64 * stride_kb + hk.to(tl.int64) * stride_kh + offs_n[:, None] * stride_kn + offs_d[None, :] * stride_kd,
                mask=offs_n[:, None] < seq_len, other=0.0)
    v = tl.load(V + b64 * stride_vb + hk.to(tl.int64) * stride_vh + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd,
                mask=offs_n[:, None] < seq_len, other=0.0)
    if INTERPRETED:
        k = k.to(tl.float32)
        v = v.to(tl.float32)

    # query block starts: [begin, lo) far, [lo, mid) bias + mask, [mid, hi) bias, [hi, end) far
    reach = start_n + BLOCK_N - 1 + W  # queries at or past this are farther than W from every key here
    hi = ((reach + BLOCK_M - 1) // BLOCK_M) * BLOCK_M
    if CAUSAL:
        begin = (start_n // BLOCK_M) * BLOCK_M
        lo = begin
        mid = ((start_n + BLOCK_N - 1 + BLOCK_M - 1) // BLOCK_M) * BLOCK_M
    else:
        begin = start_n * 0
        x = start_n - W - BLOCK_M + 1
        lo = tl.where(x < 0, 0, (x // BLOCK_M + 1) * BLOCK_M)
        mid = lo
    end = tl.where(start_n < seq_len, seq_len, begin)
    if start_n + BLOCK_N > seq_len:  # padded keys in this block: mask every tile
        lo = begin
        mid = end
        hi = end
    lo = tl.minimum(tl.maximum(lo, begin), end)
    mid = tl.minimum(tl.maximum(mid, lo), end)
    hi = tl.minimum(tl.maximum(hi, mid), end)

    dk = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    for g in range(0, GROUPS):
        h = hk * GROUPS + g
        if not VARLEN:
            bh64 = b64 * H + h
        q_base = Q + b64 * stride_qb + h.to(tl.int64) * stride_qh
        do_base = DO + b64 * stride_dob + h.to(tl.int64) * stride_doh
        if VARLEN:
            lse_base = LSE + h.to(tl.int64) * T + b64
            delta_base = DELTA + h.to(tl.int64) * T + b64
        else:
            lse_base = LSE + bh64 * L
            delta_base = DELTA + bh64 * L
        bias_row = Bias + h * stride_bh
        tau = tl.load(Tau + h * stride_tau)
        dk, dv = _bwd_dkdv(dk, dv, k, v, q_base, do_base, lse_base, delta_base, stride_qm, stride_qd, stride_dom,
                           stride_dod, bias_row, stride_bw, tau, offs_n, begin, lo, W, seq_len, L, qk_scale, CAUSAL,
                           False, False, HEAD_DIM, BLOCK_M, PREC)
        dk, dv = _bwd_dkdv(dk, dv, k, v, q_base, do_base, lse_base, delta_base, stride_qm, stride_qd, stride_dom,
                           stride_dod, bias_row, stride_bw, tau, offs_n, lo, mid, W, seq_len, L, qk_scale, CAUSAL,
                           True, True, HEAD_DIM, BLOCK_M, PREC)
        dk, dv = _bwd_dkdv(dk, dv, k, v, q_base, do_base, lse_base, delta_base, stride_qm, stride_qd, stride_dom,
                           stride_dod, bias_row, stride_bw, tau, offs_n, mid, hi, W, seq_len, L, qk_scale, CAUSAL,
                           True, False, HEAD_DIM, BLOCK_M, PREC)
        dk, dv = _bwd_dkdv(dk, dv, k, v, q_base, do_base, lse_base, delta_base, stride_qm, stride_qd, stride_dom,
                           stride_dod, bias_row, stride_bw, tau, offs_n, hi, end, W, seq_len, L, qk_scale, CAUSAL,
                           False, False, HEAD_DIM, BLOCK_M, PREC)
    if VARLEN:
        out = (b64 * HKV + hk) * HEAD_DIM + offs_n[:, None] * HKV * HEAD_DIM + offs_d[None, :]
    else:
        out = bhk.to(tl.int64) * L * HEAD_DIM + offs_n[:, None] * HEAD_DIM + offs_d[None, :]
    tl.store(DK + out, (dk * sm_scale).to(DK.dtype.element_ty), mask=offs_n[:, None] < L)
    tl.store(DV + out, dv.to(DV.dtype.element_ty), mask=offs_n[:, None] < L)
