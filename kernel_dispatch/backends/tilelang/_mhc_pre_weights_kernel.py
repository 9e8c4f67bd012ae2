"""TileLang kernel factory: the pre GEMM weight pg = phi * gamma split into two bf16 pieces.

pg = hi + lo with hi = bf16(pg) and lo = bf16(pg - hi) (relative error 2^-17, against 2^-9 for one
bf16 piece), so the h_mix GEMMs run on bf16 tensor cores at near-fp32 accuracy. Two layouts:

- ``"fwd"``: W [2M, K] = [hi; lo] (rows 0..M-1 hi, M..2M-1 lo), the B operand of h_mix = x @ W^T.
- ``"bwd"``: W [3 * G_BLOCK, K] = [hi; 0; hi; 0; lo; 0] in row blocks of G_BLOCK (M rows each, then zero
  rows): the dx kernel multiplies Gp = [G_hi, 0, G_lo, 0] by the first 2 * G_BLOCK rows and [G_hi, 0] by the
  last G_BLOCK.

Layout: Phi [M, K] fp32, Gamma [K] fp32 (ones when the RMSNorm weight is None); K = n*D static.
"""
from __future__ import annotations

import functools

from ._build import import_tilelang
from ._mhc_pre_bwd_mix_kernel import G_BLOCK

ROWS = {"fwd": 48, "bwd": 3 * G_BLOCK}  # fwd: 2 M, M = 24 mixing rows


@functools.lru_cache(maxsize=None)
def build(M: int, K: int, layout: str, block: int = 256, threads: int = 128):
    """The ``T.prim_func`` writing W for ``M`` mixing rows and ``K`` = n*D columns.

    Parameters, in order: Phi, Gamma, W (bf16, ``ROWS[layout]`` rows).
    """
    import_tilelang()
    import tilelang.language as T

    if layout not in ROWS:
        raise ValueError(f"layout: expected 'fwd' or 'bwd', got {layout!r}")
    R, f32, bf = ROWS[layout], "float32", "bfloat16"

    @T.prim_func
    def mhc_pre_weights(Phi: T.Tensor((M, K), f32), Gamma: T.Tensor((K,), f32), W: T.Tensor((R, K), bf)):
        with T.Kernel(T.ceildiv(K, block), threads=threads) as kb:
            for r, j in T.Parallel(R, block):
                k = kb * block + j
                if k < K:
                    if layout == "fwd":
                        m = r % M
                        piece = r // M
                        valid = True
                    else:
                        m = r % G_BLOCK
                        piece = T.if_then_else(r >= 2 * G_BLOCK, 1, 0)
                        valid = m < M
                    pg = T.if_then_else(valid, Phi[T.min(m, M - 1), k] * Gamma[k], 0.0)
                    hi = T.cast(pg, bf)
                    W[r, k] = T.if_then_else(piece == 0, hi, T.cast(pg - T.cast(hi, f32), bf))

    return mhc_pre_weights
