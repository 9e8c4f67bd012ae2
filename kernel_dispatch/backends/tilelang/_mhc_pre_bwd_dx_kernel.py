"""TileLang kernel factory: the mHC pre backward GEMMs, dx and the dphi partials.

dx[t, i, d] = (G @ pg)[t, i*D + d] - coef[t] (inv_rms[t] x[t, i, d]) + h_pre[t, i] dh_in[t, d] (+ DXA[t, i, d])
grad_pg partial: sum over a split's tokens of G[t, m] x[t, i, d]

CTA (feature chunk of DC = tiles.chunk, token split s) handles the n streams of its chunk as one tile of
n*DC columns: their slices of W (bf16 pieces of phi * gamma, ``_mhc_pre_weights_kernel`` layout
"bwd") stay in shared memory, and token blocks of x (the n streams side by side), dh_in, Gp and
Aux stream through a TMA pipeline. Per token block, three bf16 wgmma batches with Gp = [G_hi, 0,
G_lo, 0]: dx = Gp @ [hi; 0; hi; 0] + G_hi @ [lo; 0] (G_hi hi + G_lo hi + G_hi lo, error ~2^-17),
and acc [GP_COLS, n*DC] += Gp^T @ x (rows m and G_BLOCK + m: the G_hi and G_lo products), kept in
registers over the whole token range and written raw per split; the param kernel adds the two
halves and the splits in a fixed order, so dphi and dgamma are deterministic.

x may come in P bf16 pieces (P = 2 for fp16 x, x = hi + lo exactly): XP [T, P, n, D]. With ``acc`` the
kernel adds DXA [T, n, D] (``dtype``: the residual path's gradient of x) to dx before rounding once;
without it DXA is never read (any [1, n, D] tensor will do).
Layout: XP [T, P, n, D] bf16; GIn [T, D] and DX [T, n, D] in ``dtype``; Gp [T, GP_COLS] bf16;
Aux [T, AUX_COLS] fp32 (coef, h_pre[0..n-1], inv_rms); W [W_ROWS, n, D] bf16; Part [S, GP_COLS, NCH, n*DC] fp32 with
NCH = ceil(D / DC) (column i*DC + d of chunk c is feature c*DC + d of stream i). T symbolic, D
static (the last chunk is masked when DC does not divide D).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

from ._build import import_tilelang
from ._mhc_common import N_STREAMS, SMEM_LIMIT
from ._mhc_pre_bwd_mix_kernel import AUX_COEF, AUX_COLS, AUX_INV, G_BLOCK, GP_COLS
from ._mhc_pre_weights_kernel import ROWS

W_ROWS = ROWS["bwd"]


@dataclass(frozen=True)
class DxTiles:
    """The dx kernel's tiles: ``chunk`` (DC) features of every stream per CTA, ``tokens`` (BT) per pipeline stage,
    ``stages`` of the pipeline, ``threads`` per CTA."""

    chunk: int = 32
    tokens: int = 64
    stages: int = 4
    threads: int = 128


def smem_bytes(dtype: str, P: int, tiles: DxTiles, acc: bool = False) -> int:
    """An upper bound of the kernel's shared memory (the sum of its buffers)."""
    DC, BT = tiles.chunk, tiles.tokens
    es, NC = (4 if dtype == "float32" else 2), N_STREAMS * DC
    stage = (P * BT * NC * 2 + BT * DC * es + BT * GP_COLS * 2 + BT * G_BLOCK * 2 + BT * AUX_COLS * 4
             + (BT * NC * es if acc else 0))
    return W_ROWS * NC * 2 + tiles.stages * stage + BT * NC * es


@functools.lru_cache(maxsize=None)
def build(D: int, dtype: str, S: int, P: int, tiles: DxTiles, acc: bool = False):
    """The dx/dphi ``T.prim_func`` for feature size ``D``, ``dtype`` of x, ``S`` token splits, ``P`` x pieces,
    ``acc``: add DXA into dx.

    Parameters, in order: XP, GIn, Gp, Aux, W, DXA, DX, Part.
    """
    need = smem_bytes(dtype, P, tiles, acc)
    if need > SMEM_LIMIT:
        raise ValueError(f"dx kernel: P={P}, {tiles} needs {need} bytes of shared memory > {SMEM_LIMIT}")
    DC, BT, stages, threads = tiles.chunk, tiles.tokens, tiles.stages, tiles.threads
    import_tilelang()
    import tilelang.language as T
    from tilelang.layout import make_half_bank_swizzled_layout

    f32, bf = "float32", "bfloat16"
    NCH, NC = -(-D // DC), N_STREAMS * DC
    pieces, streams = tuple(range(P)), tuple(range(N_STREAMS))
    nt = T.dynamic("num_tokens")
    na = T.dynamic("num_acc_tokens")

    @T.prim_func
    def mhc_pre_bwd_dx(XP: T.Tensor((nt, P, N_STREAMS, D), bf), GIn: T.Tensor((nt, D), dtype),
                       Gp: T.Tensor((nt, GP_COLS), bf), Aux: T.Tensor((nt, AUX_COLS), f32),
                       W: T.Tensor((W_ROWS, N_STREAMS, D), bf),
                       DXA: T.Tensor((na, N_STREAMS, D), dtype), DX: T.Tensor((nt, N_STREAMS, D), dtype),
                       Part: T.Tensor((S, GP_COLS, NCH, NC), f32)):
        with T.Kernel(NCH, S, threads=threads) as (c, s):
            d0 = T.min(c * DC, D + na * 0)  # (= c * DC; D and na named in the body so the annotations see them)
            wa = T.alloc_shared((GP_COLS, NC), bf)
            wb = T.alloc_shared((G_BLOCK, NC), bf)
            xs = [T.alloc_shared((BT, NC), bf) for _ in pieces]
            xa = T.alloc_shared((BT, NC) if acc else (8, 64), dtype)
            # 64-byte swizzle: panels of 32 bf16 columns, so each stream's [rows, DC] block is contiguous
            # (one TMA box) and the n streams side by side form one wgmma operand
            T.annotate_layout({buf: make_half_bank_swizzled_layout(buf) for buf in [wa, wb, xa] + xs})
            for i in streams:
                T.copy(W[0:GP_COLS, i, d0:d0 + DC], wa[:, i * DC:(i + 1) * DC], disable_tma=True)
                T.copy(W[GP_COLS:W_ROWS, i, d0:d0 + DC], wb[:, i * DC:(i + 1) * DC], disable_tma=True)
            acc_phi = T.alloc_fragment((GP_COLS, NC), f32)
            T.clear(acc_phi)
            g_sh = T.alloc_shared((BT, DC), dtype)
            gq = T.alloc_shared((BT, GP_COLS), bf)
            gh = T.alloc_shared((BT, G_BLOCK), bf)
            aux = T.alloc_shared((BT, AUX_COLS), f32)
            acc_dx = T.alloc_fragment((BT, NC), f32)
            out = [T.alloc_shared((BT, DC), dtype) for _ in streams]
            nb = T.ceildiv(nt, BT)
            per = T.ceildiv(nb, S)
            b0 = s * per
            for bb in T.Pipelined(T.max(T.min(per, nb - b0), 0), num_stages=stages):
                t0 = (b0 + bb) * BT
                for p in pieces:
                    for i in streams:
                        T.copy(XP[t0:t0 + BT, p, i, d0:d0 + DC], xs[p][:, i * DC:(i + 1) * DC])
                T.copy(GIn[t0:t0 + BT, d0:d0 + DC], g_sh)
                T.copy(Gp[t0:t0 + BT, :], gq)
                T.copy(Gp[t0:t0 + BT, 0:G_BLOCK], gh)
                T.copy(Aux[t0:t0 + BT, :], aux)
                if acc:
                    for i in streams:
                        T.copy(DXA[t0:t0 + BT, i, d0:d0 + DC], xa[:, i * DC:(i + 1) * DC])
                T.gemm(gq, wa, acc_dx, clear_accum=True)
                T.gemm(gh, wb, acc_dx)
                for p in pieces:
                    T.gemm(gq, xs[p], acc_phi, transpose_A=True)
                for i in streams:
                    for t, j in T.Parallel(BT, DC):
                        xv = T.cast(xs[0][t, i * DC + j], f32)
                        if P == 2:
                            xv = xv + T.cast(xs[1][t, i * DC + j], f32)
                        rms_term = aux[t, AUX_COEF] * (aux[t, AUX_INV] * xv)
                        r = acc_dx[t, i * DC + j] - rms_term + aux[t, 1 + i] * g_sh[t, j]
                        if acc:
                            r = r + T.cast(xa[t, i * DC + j], f32)
                        out[i][t, j] = r
                    T.copy(out[i], DX[t0:t0 + BT, i, d0:d0 + DC])
            T.copy(acc_phi, Part[s, :, c, :])

    return mhc_pre_bwd_dx
