"""Triton lazy attention forward kernel and the score-tile helpers the backward shares.

Layout: q [B, H, L, D]; k, v [B, Hkv, L, D] (any strides); the bias as its :func:`bias_table` [H, W + 2]
fp32; tau [H] fp32; lengths [B] int or absent. Scores live in the log2 domain (S * log2(e)): the launcher passes
``qk_scale = scale * log2(e)``, and the table holds log2(e) * bias.

Packed documents (``VARLEN``, SPEC section 4): q [T, H, D], k, v [T, Hkv, D], ``Lens`` holds cu_seqlens [N + 1] and
``L`` is T. A document is a batch row whose length is its own and whose base is its first token: ``b`` becomes
that token and the launcher passes the token stride as the batch stride. Programs past their document's end exit.

One program owns BLOCK_M query rows of one (b, h). Key blocks fall in three regions:
``[0, band)`` far keys (no bias, no mask), ``[band, mask)`` keys within W (bias only),
``[mask, end)`` keys that need the causal or the padding mask (bias and mask). Keys past the
causal diagonal or past lengths[b] are never visited.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._autotune import INTERPRETED, autotune

LOG2E = 1.4426950408889634
_LOG2E = tl.constexpr(LOG2E)
_LN2 = tl.constexpr(0.6931471805599453)


def config_class(dtype: torch.dtype, head_dim: int) -> tuple[str, int]:
    """The config class of a launch: the input dtype's ("half" for fp16/bf16, or "fp32") and the head dim's (64:
    up to 64, or 128). fp32 tiles take twice the shared memory of 16-bit ones, so fp32 gets smaller tiles."""
    return "fp32" if dtype == torch.float32 else "half", 64 if head_dim <= 64 else 128


def _launch_class(args: dict) -> tuple[str, int]:
    return config_class(args["Q"].dtype, args["HEAD_DIM"])


_C = triton.Config
# BLOCK_M queries x BLOCK_N keys per tile, per config class (config i runs when KERNEL_DISPATCH_TRITON_CONFIG=i).
FWD_CONFIGS = {
    ("half", 64): [_C({"BLOCK_M": 128, "BLOCK_N": 64}, num_warps=8, num_stages=2),
                   _C({"BLOCK_M": 128, "BLOCK_N": 128}, num_warps=8, num_stages=2),
                   _C({"BLOCK_M": 64, "BLOCK_N": 64}, num_warps=4, num_stages=3)],
    ("half", 128): [_C({"BLOCK_M": 128, "BLOCK_N": 64}, num_warps=8, num_stages=2),
                    _C({"BLOCK_M": 128, "BLOCK_N": 64}, num_warps=8, num_stages=3),
                    _C({"BLOCK_M": 64, "BLOCK_N": 64}, num_warps=4, num_stages=3)],
    ("fp32", 64): [_C({"BLOCK_M": 64, "BLOCK_N": 32}, num_warps=4, num_stages=2),
                   _C({"BLOCK_M": 32, "BLOCK_N": 32}, num_warps=4, num_stages=2)],
    ("fp32", 128): [_C({"BLOCK_M": 64, "BLOCK_N": 32}, num_warps=4, num_stages=2),
                    _C({"BLOCK_M": 32, "BLOCK_N": 32}, num_warps=4, num_stages=2)],
}
FWD_INTERPRET_CONFIG = _C({"BLOCK_M": 32, "BLOCK_N": 16}, num_warps=1, num_stages=1)


def bias_table(bias: torch.Tensor) -> torch.Tensor:
    """The kernels' form of bias [H, W]: [H, W + 2] fp32 contiguous, 0 | log2(e) * bias | 0.

    A score at distance d reads index min(d, W) + 1 (the 0 past the band) and, causal, max(d, -1) + 1 (a masked
    entry), so the lookup needs no test and no scaling.
    """
    H, W = bias.shape
    table = torch.zeros(H, W + 2, dtype=torch.float32, device=bias.device)
    table[:, 1:W + 1] = bias.to(torch.float32) * LOG2E
    return table


@triton.jit
def _gather(ptrs):
    """The fp32 values at ``ptrs`` (a tensor of pointers), loaded where the code stands.

    In a pipelined loop triton would stage a ``tl.load`` through shared memory by 4-byte cp.async copies and read
    it back with a layout conversion, which for a gather of one value per score is slow; an inline-assembly load
    is left out of the pipeline. The interpreter, which has no inline assembly, takes ``tl.load``.
    """
    if INTERPRETED:
        return tl.load(ptrs)
    else:
        return tl.inline_asm_elementwise("ld.global.nc.f32 $0, [$1];", "=r,l", [ptrs], dtype=tl.float32,
                                         is_pure=True, pack=1)


@triton.jit
def _bias_mask(s, m_idx, n_idx, bias_row, stride_bw, W, kv_len, CAUSAL: tl.constexpr, BIAS: tl.constexpr,
               MASK: tl.constexpr):
    """Add log2(e) * bias[h, m - n] (|m - n| when not causal) within W; set masked scores to -inf.

    ``m_idx``/``n_idx`` are query/key positions broadcastable to the shape of ``s``; ``bias_row`` is row h of
    the :func:`bias_table` of the bias (distance d at index min(d, W) + 1, negative distances at 0).
    """
    if BIAS:
        d = m_idx - n_idx
        if CAUSAL:
            d = tl.maximum(d, -1)
        else:
            d = tl.abs(d)
        s = s + _gather(bias_row + (tl.minimum(d, W) + 1) * stride_bw)
    if MASK:
        s = tl.where(_valid(m_idx, n_idx, kv_len, CAUSAL), s, float("-inf"))
    return s


@triton.jit
def _relu(x):
    """max(x, 0) keeping NaN (a NaN score, bias or tau poisons its row, as golden's torch.relu does)."""
    return tl.maximum(x, 0.0, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def lse_to_store(lse2):
    """(LSE to store, LSE2 every pass uses) for rows whose log2 log-sum-exp is ``lse2`` [BLOCK_M] fp32.

    The stored LSE is natural log; every pass that forms P from it recovers LSE2 with :func:`lse2_of`. That
    round trip can land one ulp above ``lse2``: with scores beyond 2^24 (one ulp >= 1) a dominant key's
    P = exp2(S - LSE2) would then be 1/2 or 0 instead of 1. So the stored value steps one ulp down where its
    round trip exceeds ``lse2``: the recovered LSE2 is then at most one ulp below it, and :func:`p_of` caps the
    exponent at 0. The forward's own second sweep uses the recovered LSE2 too, so it forms the backward's P.
    """
    lse = lse2 * _LN2
    down = (lse.to(tl.int32, bitcast=True) + tl.where(lse > 0, -1, 1)).to(tl.float32, bitcast=True)
    lse = tl.where(lse2_of(lse) > lse2, down, lse)
    return lse, lse2_of(lse)


@triton.jit
def lse2_of(lse):
    """round(LSE * log2 e), as one rounded product: an fma with a zero addend, which the compiler cannot fuse
    into the subtraction S - LSE2 that follows (ptxas turns a plain product there into an FFMA whose exact
    product differs from the rounded one: with scores near 1e30, by 1e21, and exp2 of that is inf)."""
    return tl.fma(lse, _LOG2E, 0.0)


@triton.jit
def p_of(x):
    """P = exp2(min(x, 0)) for x = S - LSE2, keeping NaN: P <= 1 exactly, whatever the rounding of S and LSE2."""
    return tl.math.exp2(tl.minimum(x, 0.0, propagate_nan=tl.PropagateNan.ALL))


@triton.jit
def _valid(m_idx, n_idx, kv_len, CAUSAL: tl.constexpr):
    """Key n is visible to query m: n < kv_len (and n <= m when causal)."""
    ok = n_idx < kv_len
    if CAUSAL:
        ok = ok & (n_idx <= m_idx)
    return ok


@triton.jit
def _one_key_rows(p, m_idx, n_idx, kv_len, CAUSAL: tl.constexpr):
    """P = 1 exactly on rows with a single visible key (causal row 0, or lengths[b] == 1).

    P is recomputed from a rounded LSE (the forward's second sweep and the backward, which reads
    the stored natural-log LSE); at tau = -1 (the usual initial value) such a row sits exactly on
    the relu kink P + tau/i = 0, and a P one ulp above 1 would wrongly pass the strict > test:
    a nonzero first row in O and a spurious dtau term.
    """
    if CAUSAL:
        one = (m_idx == 0) | (kv_len == 1)
    else:
        one = (m_idx * 0 + kv_len) == 1
    return tl.where(one & _valid(m_idx, n_idx, kv_len, CAUSAL), 1.0, p)


@triton.jit
def _document(Cu, doc):
    """(first token, length) of document ``doc`` of the cu_seqlens ``Cu``."""
    start = tl.load(Cu + doc).to(tl.int32)
    return start, tl.load(Cu + doc + 1).to(tl.int32) - start


@triton.jit
def _query_regions(start_m, seq_len, W, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    """(band, mask, end): key block starts splitting [0, end) into far / within-W / masked regions."""
    if CAUSAL:
        end = tl.minimum(start_m + BLOCK_M, seq_len)
        mask = tl.minimum((start_m // BLOCK_N) * BLOCK_N, (seq_len // BLOCK_N) * BLOCK_N)
    else:
        end = seq_len
        mask = (seq_len // BLOCK_N) * BLOCK_N
    # first key block whose nearest (query, key) pair is closer than W
    x = tl.maximum(start_m - W - BLOCK_N + 2, 0)
    band = tl.minimum(((x + BLOCK_N - 1) // BLOCK_N) * BLOCK_N, mask)
    return band, mask, end


@triton.jit
def _fwd_stats(q, m_i, l_i, k_base, stride_kn, stride_kd, bias_row, stride_bw, offs_m, lo, hi, W, kv_len, L,
               qk_scale, CAUSAL: tl.constexpr, BIAS: tl.constexpr, MASK: tl.constexpr, HEAD_DIM: tl.constexpr,
               BLOCK_N: tl.constexpr, PREC: tl.constexpr):
    """Online row max ``m_i`` and sum ``l_i`` of exp2(S) over key blocks [lo, hi) (sweep 1)."""
    offs_d = tl.arange(0, HEAD_DIM)
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        kt_ptr = k_base + offs_n[None, :] * stride_kn + offs_d[:, None] * stride_kd
        if MASK:
            kt = tl.load(kt_ptr, mask=offs_n[None, :] < kv_len, other=0.0)
        else:
            kt = tl.load(kt_ptr)
        if INTERPRETED:
            kt = kt.to(tl.float32)
        s = tl.dot(q, kt, input_precision=PREC) * qk_scale
        s = _bias_mask(s, offs_m[:, None], offs_n[None, :], bias_row, stride_bw, W, kv_len, CAUSAL, BIAS, MASK)
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.math.exp2(s - m_new[:, None])
        l_i = l_i * tl.math.exp2(m_i - m_new) + tl.sum(p, 1)
        m_i = m_new
    return m_i, l_i


@triton.jit
def _fwd_out(acc, q, lse2, taui, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd, bias_row, stride_bw,
             offs_m, lo, hi, W, kv_len, L, qk_scale, CAUSAL: tl.constexpr, BIAS: tl.constexpr,
             MASK: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, PREC: tl.constexpr):
    """acc += relu(P + tau/i) @ V over key blocks [lo, hi), P = exp2(S - LSE2) (sweep 2)."""
    offs_d = tl.arange(0, HEAD_DIM)
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        kt_ptr = k_base + offs_n[None, :] * stride_kn + offs_d[:, None] * stride_kd
        v_ptr = v_base + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd
        if MASK:
            kt = tl.load(kt_ptr, mask=offs_n[None, :] < kv_len, other=0.0)
            v = tl.load(v_ptr, mask=offs_n[:, None] < kv_len, other=0.0)
        else:
            kt = tl.load(kt_ptr)
            v = tl.load(v_ptr)
        if INTERPRETED:
            kt = kt.to(tl.float32)
            v = v.to(tl.float32)
        s = tl.dot(q, kt, input_precision=PREC) * qk_scale
        s = _bias_mask(s, offs_m[:, None], offs_n[None, :], bias_row, stride_bw, W, kv_len, CAUSAL, BIAS, MASK)
        p = p_of(s - lse2[:, None])
        if MASK:
            p = _one_key_rows(p, offs_m[:, None], offs_n[None, :], kv_len, CAUSAL)
        a = _relu(p + taui[:, None])
        if MASK:  # tau > 0 would otherwise leak onto masked keys
            a = tl.where(_valid(offs_m[:, None], offs_n[None, :], kv_len, CAUSAL), a, 0.0)
        acc = tl.dot(a.to(v.dtype), v, acc, input_precision=PREC)
    return acc


# L is never specialized to the constant 1: triton 3.6's ptxas crashes (SIGSEGV) on the non-causal 128 x 64 config at
# head dim 32 compiled for L = 1. Speed does not depend on it: the sm_90 SASS of the bf16 head-dim-128 128 x 64 configs
# is the same with and without L's divisibility by 16.
@autotune(FWD_CONFIGS, FWD_INTERPRET_CONFIG, key=["HEAD_DIM", "CAUSAL", "L_CLASS", "VARLEN"], class_of=_launch_class)
@triton.jit(do_not_specialize=["L"])
def lazy_attention_fwd_kernel(
        Q, K, V, Bias, Tau, Lens, O, LSE,
        stride_qb, stride_qh, stride_qm, stride_qd,
        stride_kb, stride_kh, stride_kn, stride_kd,
        stride_vb, stride_vh, stride_vn, stride_vd,
        stride_ob, stride_oh, stride_om, stride_od,
        stride_bh, stride_bw, stride_tau,
        H, L, W, GROUPS, qk_scale,
        CAUSAL: tl.constexpr, HAS_LENS: tl.constexpr, HEAD_DIM: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PREC: tl.constexpr, L_CLASS, VARLEN: tl.constexpr = False):
    """Grid (cdiv(L, BLOCK_M), B * H). Writes O [B, H, L, D] (every row) and LSE [B, H, L] (natural log).

    VARLEN: grid (N, cdiv(max_seqlen, BLOCK_M), H); writes O [T, H, D] and LSE [H, T].
    """
    if VARLEN:
        start_m = (tl.num_programs(1) - 1 - tl.program_id(1)) * BLOCK_M  # longest causal rows first
        h = tl.program_id(2)
        b, seq_len = _document(Lens, tl.program_id(0))
        if start_m >= seq_len:
            return
        hk = h // GROUPS
        lse_row = LSE + h.to(tl.int64) * L + b
        L = seq_len
    else:
        start_m = (tl.num_programs(0) - 1 - tl.program_id(0)) * BLOCK_M  # longest causal rows first
        bh = tl.program_id(1)
        b = bh // H
        h = bh % H
        hk = h // GROUPS
        if HAS_LENS:
            seq_len = tl.load(Lens + b).to(tl.int32)
        else:
            seq_len = L
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    b64 = b.to(tl.int64)
    q_ptr = Q + b64 * stride_qb + h.to(tl.int64) * stride_qh + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd
    q = tl.load(q_ptr, mask=offs_m[:, None] < seq_len, other=0.0)  # padding is never read
    if INTERPRETED:
        q = q.to(tl.float32)
    k_base = K + b64 * stride_kb + hk.to(tl.int64) * stride_kh
    v_base = V + b64 * stride_vb + hk.to(tl.int64) * stride_vh
    bias_row = Bias + h * stride_bh
    tau = tl.load(Tau + h * stride_tau)
    if CAUSAL:
        taui = tau / (offs_m + 1).to(tl.float32)
    else:
        taui = tau / (tl.zeros([BLOCK_M], dtype=tl.float32) + seq_len)

    band, mask, end = _query_regions(start_m, seq_len, W, BLOCK_M, BLOCK_N, CAUSAL)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    m_i, l_i = _fwd_stats(q, m_i, l_i, k_base, stride_kn, stride_kd, bias_row, stride_bw, offs_m, 0, band, W,
                          seq_len, L, qk_scale, CAUSAL, False, False, HEAD_DIM, BLOCK_N, PREC)
    m_i, l_i = _fwd_stats(q, m_i, l_i, k_base, stride_kn, stride_kd, bias_row, stride_bw, offs_m, band, mask, W,
                          seq_len, L, qk_scale, CAUSAL, True, False, HEAD_DIM, BLOCK_N, PREC)
    m_i, l_i = _fwd_stats(q, m_i, l_i, k_base, stride_kn, stride_kd, bias_row, stride_bw, offs_m, mask, end, W,
                          seq_len, L, qk_scale, CAUSAL, True, True, HEAD_DIM, BLOCK_N, PREC)
    lse, lse2 = lse_to_store(m_i + tl.math.log2(l_i))
    if VARLEN:
        tl.store(lse_row + offs_m, lse, mask=offs_m < L)
    else:
        tl.store(LSE + bh.to(tl.int64) * L + offs_m, lse, mask=offs_m < L)

    # rows at or past lengths[b] are zero: a block of padded rows skips the second sweep
    end = tl.where(start_m < seq_len, end, 0)
    mask = tl.minimum(mask, end)
    band = tl.minimum(band, end)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    acc = _fwd_out(acc, q, lse2, taui, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd, bias_row,
                   stride_bw, offs_m, 0, band, W, seq_len, L, qk_scale, CAUSAL, False, False, HEAD_DIM, BLOCK_N,
                   PREC)
    acc = _fwd_out(acc, q, lse2, taui, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd, bias_row,
                   stride_bw, offs_m, band, mask, W, seq_len, L, qk_scale, CAUSAL, True, False, HEAD_DIM, BLOCK_N,
                   PREC)
    acc = _fwd_out(acc, q, lse2, taui, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd, bias_row,
                   stride_bw, offs_m, mask, end, W, seq_len, L, qk_scale, CAUSAL, True, True, HEAD_DIM, BLOCK_N,
                   PREC)
    acc = tl.where(offs_m[:, None] < seq_len, acc, 0.0)
    o_ptr = O + b64 * stride_ob + h.to(tl.int64) * stride_oh + offs_m[:, None] * stride_om + offs_d[None, :] * stride_od
    tl.store(o_ptr, acc.to(O.dtype.element_ty), mask=offs_m[:, None] < L)
