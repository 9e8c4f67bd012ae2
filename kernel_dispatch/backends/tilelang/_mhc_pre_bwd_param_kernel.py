"""TileLang kernel factory: dphi and dgamma from the per-split partials of the dx kernel.

grad_pg[m, k] = sum over splits s = 0, 1, ... of (Part[s, m, .] + Part[s, G_BLOCK + m, .]) (the G_hi and
G_lo products) at column k = i*D + d, then dphi = grad_pg * gamma and
dgamma[k] = sum_m grad_pg[m, k] * phi[m, k] (fixed-order sums: deterministic).

Layout: Part [S, GP_COLS, NCH, n*DC] fp32 (the dx kernel's: feature d = c*DC + e of stream i sits in
chunk c, column i*DC + e); Phi [M, K], Gamma [K] fp32 (ones when the RMSNorm weight is None);
DPhi [M, K], DGamma [K] fp32. K = n*D static.
"""
from __future__ import annotations

import functools

from ._build import import_tilelang
from ._mhc_common import N_STREAMS
from ._mhc_pre_bwd_mix_kernel import G_BLOCK, GP_COLS


@functools.lru_cache(maxsize=None)
def build(M: int, D: int, S: int, DC: int, block: int = 128, threads: int = 128):
    """The ``T.prim_func`` for ``M`` rows, feature size ``D``, ``S`` splits and dx chunk ``DC``.

    Parameters, in order: Part, Phi, Gamma, DPhi, DGamma.
    """
    import_tilelang()
    import tilelang.language as T

    f32 = "float32"
    K, NCH, NC = N_STREAMS * D, -(-D // DC), N_STREAMS * DC
    MP = G_BLOCK  # M padded to a power of two for the reduction layout

    @T.prim_func
    def mhc_pre_bwd_param(Part: T.Tensor((S, GP_COLS, NCH, NC), f32), Phi: T.Tensor((M, K), f32),
                          Gamma: T.Tensor((K,), f32), DPhi: T.Tensor((M, K), f32), DGamma: T.Tensor((K,), f32)):
        with T.Kernel(T.ceildiv(K, block), threads=threads) as kb:
            k0 = kb * block
            acc = T.alloc_fragment((MP, block), f32)
            prod = T.alloc_fragment((MP, block), f32)
            dg = T.alloc_fragment((block,), f32)
            for m, j in T.Parallel(MP, block):
                k = k0 + j
                i = k // D
                c = T.min((k % D) // DC, NCH - 1)
                col = T.min(i * DC + (k % D) % DC, NC - 1)
                acc[m, j] = 0.0
                if m < M and k < K:
                    for s in T.serial(S):
                        acc[m, j] += Part[s, m, c, col] + Part[s, G_BLOCK + m, c, col]
                    DPhi[m, k] = acc[m, j] * Gamma[k]
                    prod[m, j] = acc[m, j] * Phi[m, k]
                else:
                    prod[m, j] = 0.0
            T.reduce_sum(prod, dg, dim=0)
            for j in T.Parallel(block):
                if k0 + j < K:
                    DGamma[k0 + j] = dg[j]

    return mhc_pre_bwd_param
