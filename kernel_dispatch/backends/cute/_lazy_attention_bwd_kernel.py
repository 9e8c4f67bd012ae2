"""CuTe DSL kernels of the lazy attention backward (SPEC section 1), sm_90a, fp16/bf16, head dims 64 and 128.

Two kernels, SM80-style tensor-core code that sm_90 runs (mma.sync m16n8k16 with fp32 accumulators, ldmatrix from
swizzled shared memory, cp.async loads; no TMA, wgmma or warp specialisation yet), 64 x 64 tiles, 128 threads
(4 warps, 16 tile rows each), no atomics:

``dq``   query-major, one CTA per (query block, head, batch). Sweep 1 over the visible key blocks gives the row sums
         Delta = sum_n P Mk dA and R = sum_n Mk dA; sweep 2 recomputes the tiles and accumulates
         dQ = scale * sum_n P (Mk dA - Delta) k_n (dS never rounds before the Delta subtraction). K and V are
         double-buffered (tile n + 1 loads while tile n computes). Writes dQ, Delta and Rdiv = R / i (dtau rows).
``dkdv`` key-major, one CTA per (key block, kv head, batch); one flattened loop over the GQA query heads of its
         group and every query block that sees its keys, in a fixed order, recomputing the tiles transposed
         ([keys, queries]): dV += A^T dO, dK += dS^T Q (times scale at the end); Q and dO double-buffered at D = 64
         (one stage at D = 128 so that two CTAs fit an SM). Band tiles add their diagonal sums of dS (fp32, staged
         in shared memory) into Partial[b, h, key block, dist + WP - 1] (signed distance dist = m - n,
         |dist| < WP = min(W, L)); thread x owns one diagonal per tile and tiles come in a fixed order, so the
         launcher's fixed-order sum is bitwise reproducible.

Both kernels take a mask-free path for tiles with every row and key valid, every key visible and no bias; other
tiles mask per element (causal, lengths, the bias table of the tile's 127 distances in shared memory).

Layout (the launcher pads the row dimension to LP, a multiple of 64, with zeros): Q, dO, dQ [B, H, LP, D];
K, V, dK, dV [B, Hkv, LP, D] (contiguous, fp16 or bf16); LSE, Delta, Rdiv [B, H, LP] fp32; Bias [H, W] fp32;
Tau [H] fp32; Lens [B] int32 (keys and rows >= Lens[b] masked, their gradients 0); Partial [B, H, LP/64, 2WP-1] fp32
zero-initialised. B, H, Hkv, LP, W and Partial's sizes are runtime values. The stream is TVM FFI's environment
stream (torch's current stream).
"""
import cutlass
import cutlass.cute as cute
import cutlass.utils
from cutlass.cute.nvgpu import cpasync, warp

from ._kernel_key import KernelKey
from ._tiles import mn_view, one_key_row, quad_reduce

KERNELS = ("dq", "dkdv")
ARGS = {
    "dq": ["q fp16/bf16 [B,H,LP,D]", "k [B,Hkv,LP,D]", "v [B,Hkv,LP,D]", "do [B,H,LP,D]", "lse fp32 [B,H,LP]",
           "bias fp32 [H,W]", "tau fp32 [H]", "lens int32 [B]", "dq out [B,H,LP,D]", "delta out fp32 [B,H,LP]",
           "rdiv out fp32 [B,H,LP]", "scale float"],
    "dkdv": ["q fp16/bf16 [B,H,LP,D]", "k [B,Hkv,LP,D]", "v [B,Hkv,LP,D]", "do [B,H,LP,D]", "lse fp32 [B,H,LP]",
             "delta fp32 [B,H,LP]", "bias fp32 [H,W]", "tau fp32 [H]", "lens int32 [B]", "dk out [B,Hkv,LP,D]",
             "dv out [B,Hkv,LP,D]", "partial out fp32 [B,H,LP/64,2*min(W,L)-1] (zeroed)", "L int",
             "scale float"],
}


def _add(x, y):
    return x + y


BM = 64  # query rows of a tile
BN = 64  # keys of a tile
THREADS = 128
LOG2E = 1.4426950408889634
NTAB = BM + BN - 1  # distinct signed distances in a tile


def _smem_bytes(kernel, D):
    """Dynamic shared memory of a launch (tiles 1024-aligned, then the fp32 scratch, plus alignment slack)."""
    if kernel == "dq":  # Q, dO, two stages of K and V, the bias table
        return 6 * BM * D * 2 + 4 * (NTAB + 1) + 1024
    stages = 2 if D == 64 else 1  # K, V, stages of Q and dO, dS, bias table, LSE / Delta / tau/i vectors
    return (2 + 2 * stages) * BM * D * 2 + 4 * (BN * BM + NTAB + 1 + 3 * BM) + 1024


def shared_bytes(key: KernelKey) -> int:
    """The dynamic shared memory the launch of ``key`` asks for."""
    return _smem_bytes(key.kernel, key.head_dim)


def _dtype(name):
    return {"float16": cutlass.Float16, "bfloat16": cutlass.BFloat16}[name]


def _smem_layout(rows, D, stages=0):
    atom = cute.make_composed_layout(cute.make_swizzle(3, 3, 3), 0, cute.make_layout((8, 64), stride=(64, 1)))
    if stages:
        return cute.tile_to_shape(atom, (rows, D, stages), (0, 1, 2))
    return cute.tile_to_shape(atom, (rows, D), (0, 1))


def _a_view(rP):
    """An accumulator-shaped fragment (4, MMA_M, MMA_N) as an A operand ((4, 2), MMA_M, MMA_N / 2)."""
    d = cute.logical_divide(rP.layout, (None, None, 2))
    lay = cute.make_layout(((d.shape[0], d.shape[2][0]), d.shape[1], d.shape[2][1]),
                           stride=((d.stride[0], d.stride[2][0]), d.stride[1], d.stride[2][1]))
    return cute.make_tensor(rP.iterator, lay)


class _Common:
    def __init__(self, D, dtype, causal):
        self.D = D
        self.dtype = dtype
        self.causal = causal
        self.sQ_layout = _smem_layout(BM, D)
        self.sK_layout = _smem_layout(BN, D)
        elems = 128 // dtype.width
        atom_g2s = cute.make_copy_atom(cpasync.CopyG2SOp(cache_mode=cpasync.LoadCacheMode.GLOBAL), dtype,
                                       num_bits_per_copy=128)
        atom_st = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), dtype, num_bits_per_copy=128)
        tl = cute.make_layout((THREADS // (64 // elems), 64 // elems), stride=(64 // elems, 1))
        vl = cute.make_layout((1, elems))
        self.g2s = cute.make_tiled_copy_tv(atom_g2s, tl, vl)
        self.r2g = cute.make_tiled_copy_tv(atom_st, tl, vl)
        self.mma = cute.make_tiled_mma(warp.MmaF16BF16Op(dtype, cutlass.Float32, (16, 8, 16)), (THREADS // 32, 1, 1),
                                       permutation_mnk=(THREADS // 32 * 16, 16, 16))
        self.ld_a = cute.make_copy_atom(warp.LdMatrix8x8x16bOp(transpose=False, num_matrices=4), dtype)
        self.ld_bt = cute.make_copy_atom(warp.LdMatrix8x8x16bOp(transpose=True, num_matrices=4), dtype)


def _gemm_ss(mma, tidx, ld_a, ld_b, sA, sB, acc):
    """acc = sA @ sB^T (both [rows, K] in smem, K = head dim)."""
    thr = mma.get_slice(tidx)
    rA = thr.make_fragment_A(thr.partition_A(sA))
    rB = thr.make_fragment_B(thr.partition_B(sB))
    ca = cute.make_tiled_copy_A(ld_a, mma).get_slice(tidx)
    cb = cute.make_tiled_copy_B(ld_b, mma).get_slice(tidx)
    tAs = ca.partition_S(sA)
    tAr = ca.retile(rA)
    tBs = cb.partition_S(sB)
    tBr = cb.retile(rB)
    acc.fill(0.0)
    for k in range(cute.size(tAs.shape[2])):
        cute.copy(ca, tAs[None, None, k], tAr[None, None, k])
        cute.copy(cb, tBs[None, None, k], tBr[None, None, k])
        cute.gemm(mma, acc, rA[None, None, k], rB[None, None, k], acc)


def _gemm_rs(mma, tidx, ld_bt, rA, sBt, acc):
    """acc += rA @ sBt^T with rA an A-operand view of registers and sBt a transposed smem view [N, K]."""
    thr = mma.get_slice(tidx)
    rB = thr.make_fragment_B(thr.partition_B(sBt))
    cb = cute.make_tiled_copy_B(ld_bt, mma).get_slice(tidx)
    tBs = cb.partition_S(sBt)
    tBr = cb.retile(rB)
    for k in range(cute.size(rA.shape[2])):
        cute.copy(cb, tBs[None, None, k], tBr[None, None, k])
        cute.gemm(mma, acc, rA[None, None, k], rB[None, None, k], acc)


def _store_tile(c, tidx, acc, s_tile, g_tile):
    """Registers (accumulator layout, fp32) -> dtype -> smem tile -> 128-bit stores to the gmem tile."""
    r = cute.make_fragment_like(acc, c.dtype)
    r.store(acc.load().to(c.dtype))
    atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), c.dtype)
    cs = cute.make_tiled_copy_C(atom, c.mma).get_slice(tidx)
    cute.copy(atom, cs.retile(r), cs.partition_D(s_tile))
    cute.arch.sync_threads()
    cg = c.r2g.get_slice(tidx)
    src = cg.partition_S(s_tile)
    dst = cg.partition_D(g_tile)
    tmp = cute.make_fragment_like(dst, c.dtype)
    cute.copy(c.r2g, src, tmp)
    cute.copy(c.r2g, tmp, dst)


@cute.jit
def _bias_table(sTab: cute.Tensor, tidx: cutlass.Int32, mBias: cute.Tensor, h: cutlass.Int32, W: cutlass.Int32,
                dist0: cutlass.Int32, causal: cutlass.Constexpr):
    """sTab[x] = log2(e) * bias[h, |dist|] for the signed distance dist = dist0 + x within the band, else 0."""
    if tidx < NTAB:
        dist = dist0 + tidx
        t = dist
        if cutlass.const_expr(not causal):
            t = cutlass.max(dist, -dist)
        val = cutlass.Float32(0.0)
        if t >= 0 and t < W:
            val = mBias[h, t] * LOG2E
        sTab[tidx] = val


@cute.jit
def _free_tile(m0: cutlass.Int32, n0: cutlass.Int32, lb: cutlass.Int32, W: cutlass.Int32, causal: cutlass.Constexpr):
    """Every query row and key of the BM x BN tile at (m0, n0) is below lengths[b] (``lb``) and no entry is masked or
    biased: the backward's mask-free path. (The forward's rule, for keys alone, is ``_tiles.keys_free``; written
    this way the backward's machine code is the one checked on the GPU.)"""
    dlo = m0 - n0 - (BN - 1)
    free = m0 + BM <= lb and n0 + BN <= lb and dlo >= W
    if cutlass.const_expr(not causal):
        free = m0 + BM <= lb and n0 + BN <= lb and (dlo >= W or dlo + (BM + BN - 2) <= -W)
    return free


def _build_dq(D, dtype, causal):
    @cute.kernel
    def kernel(mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mdO: cute.Tensor, mLSE: cute.Tensor,
               mBias: cute.Tensor, mTau: cute.Tensor, mLens: cute.Tensor, mdQ: cute.Tensor, mDelta: cute.Tensor,
               mRdiv: cute.Tensor, scale: cutlass.Float32):
        c = _Common(D, dtype, causal)
        tidx, _, _ = cute.arch.thread_idx()
        mb, h, b = cute.arch.block_idx()
        H = mQ.shape[1]
        Hkv = mK.shape[1]
        W = mBias.shape[1]
        hk = h // (H // Hkv)
        lb = mLens[b]
        m0 = mb * BM
        sc2 = scale * LOG2E
        tau = mTau[h]

        smem = cutlass.utils.SmemAllocator()
        sQ = smem.allocate_tensor(dtype, c.sQ_layout, 1024)
        sdO = smem.allocate_tensor(dtype, c.sQ_layout, 1024)
        sK3 = smem.allocate_tensor(dtype, _smem_layout(BN, D, 2), 1024)
        sV3 = smem.allocate_tensor(dtype, _smem_layout(BN, D, 2), 1024)
        sTab = smem.allocate_tensor(cutlass.Float32, cute.make_layout(NTAB + 1), 16)

        gQ = cute.local_tile(mQ[b, h, None, None], (BM, D), (mb, 0))
        gdO = cute.local_tile(mdO[b, h, None, None], (BM, D), (mb, 0))
        gK = cute.local_tile(mK[b, hk, None, None], (BN, D), (None, 0))
        gV = cute.local_tile(mV[b, hk, None, None], (BN, D), (None, 0))
        gdQ = cute.local_tile(mdQ[b, h, None, None], (BM, D), (mb, 0))
        cp = c.g2s.get_slice(tidx)
        tKg = cp.partition_S(gK)
        tKs = cp.partition_D(sK3)
        tVg = cp.partition_S(gV)
        tVs = cp.partition_D(sV3)
        cute.copy(c.g2s, cp.partition_S(gQ), cp.partition_D(sQ))
        cute.copy(c.g2s, cp.partition_S(gdO), cp.partition_D(sdO))
        cute.arch.cp_async_commit_group()

        thr = c.mma.get_slice(tidx)
        acc_shape_s = thr.partition_shape_C((BM, BN))
        acc_dq = cute.make_rmem_tensor(thr.partition_shape_C((BM, D)), cutlass.Float32)
        acc_dq.fill(0.0)
        cS = thr.partition_C(cute.make_identity_tensor((BM, BN)))
        cS_mn = mn_view(cS)
        nrows = cute.size(cS_mn, mode=[0])
        ncols = cute.size(cS_mn, mode=[1])

        # per-row constants
        lse2 = cute.make_rmem_tensor(nrows, cutlass.Float32)
        thr_r = cute.make_rmem_tensor(nrows, cutlass.Float32)
        inv_i = cute.make_rmem_tensor(nrows, cutlass.Float32)
        r_acc = cute.make_rmem_tensor(nrows, cutlass.Float32)
        d_acc = cute.make_rmem_tensor(nrows, cutlass.Float32)
        for r in cutlass.range_constexpr(nrows):
            m = m0 + cS_mn[r, 0][0]
            lse2[r] = mLSE[b, h, m] * LOG2E
            ii = cutlass.Float32(cutlass.max(lb, 1))
            if cutlass.const_expr(causal):
                ii = cutlass.Float32(m + 1)
            inv_i[r] = cutlass.Float32(1.0) / ii
            thr_r[r] = tau * inv_i[r]
            r_acc[r] = 0.0
            d_acc[r] = 0.0

        n_hi = lb
        if cutlass.const_expr(causal):
            n_hi = cutlass.min(lb, m0 + BM)
        n_blocks = (n_hi + BN - 1) // BN
        if m0 >= lb:
            n_blocks = 0

        for sweep in cutlass.range_constexpr(2):
            # two K/V stages: tile nb + 1 loads while tile nb computes
            cute.arch.sync_threads()
            if n_blocks > 0:
                cute.copy(c.g2s, tKg[None, None, None, 0], tKs[None, None, None, 0])
                cute.copy(c.g2s, tVg[None, None, None, 0], tVs[None, None, None, 0])
            cute.arch.cp_async_commit_group()
            for nb in cutlass.range(n_blocks, unroll=1):
                n0 = nb * BN
                st = nb % 2
                cute.arch.sync_threads()  # the previous tile's readers are done with its stage and sTab
                if nb + 1 < n_blocks:
                    cute.copy(c.g2s, tKg[None, None, None, nb + 1], tKs[None, None, None, 1 - st])
                    cute.copy(c.g2s, tVg[None, None, None, nb + 1], tVs[None, None, None, 1 - st])
                cute.arch.cp_async_commit_group()
                _bias_table(sTab, tidx, mBias, h, W, m0 - n0 - (BN - 1), causal)
                cute.arch.cp_async_wait_group(1)
                cute.arch.sync_threads()
                sK = sK3[None, None, st]
                sV = sV3[None, None, st]
                sKt = cute.composition(sK, cute.make_layout((D, BN), stride=(BN, 1)))
                acc_s = cute.make_rmem_tensor(acc_shape_s, cutlass.Float32)
                acc_da = cute.make_rmem_tensor(acc_shape_s, cutlass.Float32)
                _gemm_ss(c.mma, tidx, c.ld_a, c.ld_a, sQ, sK, acc_s)
                _gemm_ss(c.mma, tidx, c.ld_a, c.ld_a, sdO, sV, acc_da)
                s_mn = mn_view(acc_s)
                da_mn = mn_view(acc_da)
                # a free tile: every row and key valid, every key visible, no bias: nothing to mask
                free = _free_tile(m0, n0, lb, W, causal)
                if free:
                    for r in cutlass.range_constexpr(nrows):
                        rs = cutlass.Float32(0.0)
                        ds_ = cutlass.Float32(0.0)
                        for cc in cutlass.range_constexpr(ncols):
                            p = cute.math.exp2(s_mn[r, cc] * sc2 - lse2[r], fastmath=True)
                            dp = da_mn[r, cc] if p + thr_r[r] > 0.0 else cutlass.Float32(0.0)
                            if cutlass.const_expr(sweep == 0):
                                rs = rs + dp
                                ds_ = ds_ + p * dp
                            else:
                                s_mn[r, cc] = p * (dp - d_acc[r])
                        if cutlass.const_expr(sweep == 0):
                            r_acc[r] = r_acc[r] + rs
                            d_acc[r] = d_acc[r] + ds_
                else:
                    for r in cutlass.range_constexpr(nrows):
                        mr = cS_mn[r, 0][0]
                        m = m0 + mr
                        row_ok = m < lb
                        one = one_key_row(m, lb, causal)
                        rs = cutlass.Float32(0.0)
                        ds_ = cutlass.Float32(0.0)
                        for cc in cutlass.range_constexpr(ncols):
                            nc = cS_mn[0, cc][1]
                            n = n0 + nc
                            vis = row_ok and n < lb
                            if cutlass.const_expr(causal):
                                vis = vis and n <= m
                            sv = s_mn[r, cc] * sc2 + sTab[mr - nc + (BN - 1)] - lse2[r]
                            p = cute.math.exp2(sv, fastmath=True)
                            p = p if vis else cutlass.Float32(0.0)
                            p = cutlass.Float32(1.0) if (vis and one) else p
                            keep = vis and (p + thr_r[r] > 0.0)
                            dp = da_mn[r, cc] if keep else cutlass.Float32(0.0)
                            if cutlass.const_expr(sweep == 0):
                                rs = rs + dp
                                ds_ = ds_ + p * dp
                            else:
                                s_mn[r, cc] = p * (dp - d_acc[r])
                        if cutlass.const_expr(sweep == 0):
                            r_acc[r] = r_acc[r] + rs
                            d_acc[r] = d_acc[r] + ds_
                if cutlass.const_expr(sweep == 1):
                    rP = cute.make_fragment_like(acc_s, dtype)
                    rP.store(acc_s.load().to(dtype))
                    _gemm_rs(c.mma, tidx, c.ld_bt, _a_view(rP), sKt, acc_dq)
            if cutlass.const_expr(sweep == 0):
                for r in cutlass.range_constexpr(nrows):
                    r_acc[r] = quad_reduce(r_acc[r], _add)
                    d_acc[r] = quad_reduce(d_acc[r], _add)

        # row outputs (one lane of each quad)
        if tidx % 4 == 0:
            for r in cutlass.range_constexpr(nrows):
                m = m0 + cS_mn[r, 0][0]
                mDelta[b, h, m] = d_acc[r]
                mRdiv[b, h, m] = r_acc[r] * inv_i[r]
        for i in cutlass.range_constexpr(cute.size(acc_dq)):
            acc_dq[i] = acc_dq[i] * scale
        cute.arch.cp_async_wait_group(0)
        cute.arch.sync_threads()  # sQ is reused to stage dQ
        _store_tile(c, tidx, acc_dq, sQ, gdQ)

    @cute.jit
    def launch(mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mdO: cute.Tensor, mLSE: cute.Tensor,
               mBias: cute.Tensor, mTau: cute.Tensor, mLens: cute.Tensor, mdQ: cute.Tensor, mDelta: cute.Tensor,
               mRdiv: cute.Tensor, scale: cutlass.Float32, stream):
        kernel(mQ, mK, mV, mdO, mLSE, mBias, mTau, mLens, mdQ, mDelta, mRdiv, scale).launch(
            grid=[cute.ceil_div(mQ.shape[2], BM), mQ.shape[1], mQ.shape[0]], block=[THREADS, 1, 1], stream=stream,
            smem=_smem_bytes("dq", D))

    return launch


def _build_dkdv(D, dtype, causal):
    @cute.kernel
    def kernel(mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mdO: cute.Tensor, mLSE: cute.Tensor,
               mDelta: cute.Tensor, mBias: cute.Tensor, mTau: cute.Tensor, mLens: cute.Tensor, mdK: cute.Tensor,
               mdV: cute.Tensor, mPart: cute.Tensor, L: cutlass.Int32, scale: cutlass.Float32):
        c = _Common(D, dtype, causal)
        tidx, _, _ = cute.arch.thread_idx()
        kb, hk, b = cute.arch.block_idx()
        H = mQ.shape[1]
        Hkv = mK.shape[1]
        W = mBias.shape[1]
        groups = H // Hkv
        WP = cutlass.min(W, L)
        lb = mLens[b]
        n0 = kb * BN
        sc2 = scale * LOG2E

        smem = cutlass.utils.SmemAllocator()
        sK = smem.allocate_tensor(dtype, c.sK_layout, 1024)
        sV = smem.allocate_tensor(dtype, c.sK_layout, 1024)
        NS = 2 if D == 64 else 1  # query tile stages (D = 128: one, two CTAs per SM fit)
        sQ3 = smem.allocate_tensor(dtype, _smem_layout(BM, D, NS), 1024)
        sdO3 = smem.allocate_tensor(dtype, _smem_layout(BM, D, NS), 1024)
        sDs = smem.allocate_tensor(cutlass.Float32, cute.make_layout((BN, BM), stride=(BM, 1)), 16)
        sTab = smem.allocate_tensor(cutlass.Float32, cute.make_layout(NTAB + 1), 16)
        sLse = smem.allocate_tensor(cutlass.Float32, cute.make_layout(BM), 16)
        sDel = smem.allocate_tensor(cutlass.Float32, cute.make_layout(BM), 16)
        sThr = smem.allocate_tensor(cutlass.Float32, cute.make_layout(BM), 16)

        gK = cute.local_tile(mK[b, hk, None, None], (BN, D), (kb, 0))
        gV = cute.local_tile(mV[b, hk, None, None], (BN, D), (kb, 0))
        gdK = cute.local_tile(mdK[b, hk, None, None], (BN, D), (kb, 0))
        gdV = cute.local_tile(mdV[b, hk, None, None], (BN, D), (kb, 0))
        cp = c.g2s.get_slice(tidx)
        cute.copy(c.g2s, cp.partition_S(gK), cp.partition_D(sK))
        cute.copy(c.g2s, cp.partition_S(gV), cp.partition_D(sV))
        cute.arch.cp_async_commit_group()
        tQs = cp.partition_D(sQ3)
        tdOs = cp.partition_D(sdO3)

        thr = c.mma.get_slice(tidx)
        acc_shape_s = thr.partition_shape_C((BN, BM))
        acc_dk = cute.make_rmem_tensor(thr.partition_shape_C((BN, D)), cutlass.Float32)
        acc_dv = cute.make_rmem_tensor(thr.partition_shape_C((BN, D)), cutlass.Float32)
        acc_dk.fill(0.0)
        acc_dv.fill(0.0)
        cS = thr.partition_C(cute.make_identity_tensor((BN, BM)))
        cS_mn = mn_view(cS)
        nrows = cute.size(cS_mn, mode=[0])
        ncols = cute.size(cS_mn, mode=[1])

        q_lo = 0
        if cutlass.const_expr(causal):
            q_lo = n0 // BM
        n_q = (lb + BM - 1) // BM - q_lo
        if n0 >= lb:
            n_q = 0
        if n_q < 0:
            n_q = 0

        total = groups * n_q
        if total > 0:  # prologue: the first query tile into stage 0
            h0 = hk * groups
            cute.copy(c.g2s, cp.partition_S(cute.local_tile(mQ[b, h0, None, None], (BM, D), (q_lo, 0))),
                      tQs[None, None, None, 0])
            cute.copy(c.g2s, cp.partition_S(cute.local_tile(mdO[b, h0, None, None], (BM, D), (q_lo, 0))),
                      tdOs[None, None, None, 0])
        cute.arch.cp_async_commit_group()
        # one flattened loop over (query head of the group, query block), in a fixed order
        for it in cutlass.range(total, unroll=1):
            g = it // n_q
            h = hk * groups + g
            qb = q_lo + (it - g * n_q)
            m0 = qb * BM
            tau = mTau[h]
            st = it % NS
            cute.arch.sync_threads()  # previous tile's readers are done
            if cutlass.const_expr(NS == 2):
                if it + 1 < total:
                    g1 = (it + 1) // n_q
                    h1 = hk * groups + g1
                    qb1 = q_lo + (it + 1 - g1 * n_q)
                    cute.copy(c.g2s, cp.partition_S(cute.local_tile(mQ[b, h1, None, None], (BM, D), (qb1, 0))),
                              tQs[None, None, None, 1 - st])
                    cute.copy(c.g2s, cp.partition_S(cute.local_tile(mdO[b, h1, None, None], (BM, D), (qb1, 0))),
                              tdOs[None, None, None, 1 - st])
                cute.arch.cp_async_commit_group()
            else:
                if it > 0:
                    cute.copy(c.g2s, cp.partition_S(cute.local_tile(mQ[b, h, None, None], (BM, D), (qb, 0))),
                              tQs[None, None, None, 0])
                    cute.copy(c.g2s, cp.partition_S(cute.local_tile(mdO[b, h, None, None], (BM, D), (qb, 0))),
                              tdOs[None, None, None, 0])
                cute.arch.cp_async_commit_group()
            # signed distance m - n of tile element (key i, query j) is m0 - n0 + j - i
            _bias_table(sTab, tidx, mBias, h, W, m0 - n0 - (BN - 1), causal)
            if tidx < BM:
                m = m0 + tidx
                sLse[tidx] = mLSE[b, h, m] * LOG2E
                sDel[tidx] = mDelta[b, h, m]
                ii = cutlass.Float32(cutlass.max(lb, 1))
                if cutlass.const_expr(causal):
                    ii = cutlass.Float32(m + 1)
                sThr[tidx] = tau / ii
            cute.arch.cp_async_wait_group(NS - 1)
            cute.arch.sync_threads()
            sQ = sQ3[None, None, st]
            sdO = sdO3[None, None, st]
            sQt = cute.composition(sQ, cute.make_layout((D, BM), stride=(BM, 1)))
            sdOt = cute.composition(sdO, cute.make_layout((D, BM), stride=(BM, 1)))
            acc_s = cute.make_rmem_tensor(acc_shape_s, cutlass.Float32)
            acc_da = cute.make_rmem_tensor(acc_shape_s, cutlass.Float32)
            _gemm_ss(c.mma, tidx, c.ld_a, c.ld_a, sK, sQ, acc_s)
            _gemm_ss(c.mma, tidx, c.ld_a, c.ld_a, sV, sdO, acc_da)
            s_mn = mn_view(acc_s)
            da_mn = mn_view(acc_da)
            # a free tile: every query and key valid, every key visible, no bias: nothing to mask
            free = _free_tile(m0, n0, lb, W, causal)
            # column-major walk: each query column's LSE, tau/i and Delta are read once and die after its rows
            if free:
                for cc in cutlass.range_constexpr(ncols):
                    jc = cS_mn[0, cc][1]
                    lse_j = sLse[jc]
                    thr_j = sThr[jc]
                    del_j = sDel[jc]
                    for r in cutlass.range_constexpr(nrows):
                        p = cute.math.exp2(s_mn[r, cc] * sc2 - lse_j, fastmath=True)
                        sh = p + thr_j
                        keep = sh > 0.0
                        a = sh if keep else cutlass.Float32(0.0)
                        dp = da_mn[r, cc] if keep else cutlass.Float32(0.0)
                        s_mn[r, cc] = p * (dp - del_j)
                        da_mn[r, cc] = a
            else:
                for cc in cutlass.range_constexpr(ncols):
                    jc = cS_mn[0, cc][1]
                    m = m0 + jc
                    one = one_key_row(m, lb, causal)
                    lse_j = sLse[jc]
                    thr_j = sThr[jc]
                    del_j = sDel[jc]
                    for r in cutlass.range_constexpr(nrows):
                        ir = cS_mn[r, 0][0]
                        n = n0 + ir
                        vis = n < lb and m < lb
                        if cutlass.const_expr(causal):
                            vis = vis and n <= m
                        sv = s_mn[r, cc] * sc2 + sTab[jc - ir + (BN - 1)] - lse_j
                        p = cute.math.exp2(sv, fastmath=True)
                        p = p if vis else cutlass.Float32(0.0)
                        p = cutlass.Float32(1.0) if (vis and one) else p
                        sh = p + thr_j
                        keep = vis and (sh > 0.0)
                        a = sh if keep else cutlass.Float32(0.0)
                        dp = da_mn[r, cc] if keep else cutlass.Float32(0.0)
                        s_mn[r, cc] = p * (dp - del_j)
                        da_mn[r, cc] = a
            # dbias partials: diagonal sums of dS over the band
            dlo = m0 - n0 - (BN - 1)
            dhi = m0 - n0 + (BM - 1)
            band = dlo < WP and dhi > -WP
            if cutlass.const_expr(causal):
                band = dlo < WP and dhi >= 0
            if band:
                for r in cutlass.range_constexpr(nrows):
                    for cc in cutlass.range_constexpr(ncols):
                        sDs[cS_mn[r, 0][0], cS_mn[0, cc][1]] = s_mn[r, cc]
            # the GEMM operands in q's dtype now: the fp32 tiles die before the diagonal sums
            rA = cute.make_fragment_like(acc_da, dtype)
            rA.store(acc_da.load().to(dtype))
            rS = cute.make_fragment_like(acc_s, dtype)
            rS.store(acc_s.load().to(dtype))
            if band:
                cute.arch.sync_threads()
                if tidx < NTAB:
                    e = tidx - (BN - 1)  # j - i
                    dist = dlo + tidx
                    ok = dist < WP and dist > -WP
                    if cutlass.const_expr(causal):
                        ok = dist < WP and dist >= 0
                    if ok:
                        tot = cutlass.Float32(0.0)
                        i_lo = cutlass.max(0, -e)
                        i_hi = cutlass.min(BN, BM - e)
                        for i in cutlass.range(i_lo, i_hi, unroll=4):
                            tot = tot + sDs[i, i + e]
                        idx = dist + WP - 1
                        mPart[b, h, kb, idx] = mPart[b, h, kb, idx] + tot
            _gemm_rs(c.mma, tidx, c.ld_bt, _a_view(rA), sdOt, acc_dv)
            _gemm_rs(c.mma, tidx, c.ld_bt, _a_view(rS), sQt, acc_dk)

        cute.arch.cp_async_wait_group(0)
        for i in cutlass.range_constexpr(cute.size(acc_dk)):
            acc_dk[i] = acc_dk[i] * scale
        cute.arch.sync_threads()  # sK and sV are reused to stage dK and dV
        _store_tile(c, tidx, acc_dk, sK, gdK)
        _store_tile(c, tidx, acc_dv, sV, gdV)

    @cute.jit
    def launch(mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mdO: cute.Tensor, mLSE: cute.Tensor,
               mDelta: cute.Tensor, mBias: cute.Tensor, mTau: cute.Tensor, mLens: cute.Tensor, mdK: cute.Tensor,
               mdV: cute.Tensor, mPart: cute.Tensor, L: cutlass.Int32, scale: cutlass.Float32,
               stream):
        kernel(mQ, mK, mV, mdO, mLSE, mDelta, mBias, mTau, mLens, mdK, mdV, mPart, L, scale).launch(
            grid=[cute.ceil_div(mK.shape[2], BN), mK.shape[1], mK.shape[0]], block=[THREADS, 1, 1], stream=stream,
            smem=_smem_bytes("dkdv", D))

    return launch


def _fakes(kernel, D, dtype):
    from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

    B, H, Hkv, LP, W, NKB, WP2 = (cute.sym_int() for _ in range(7))
    row = (3, 2, 1, 0)

    def t(dt, shape, order, align=16):
        return make_fake_compact_tensor(dt, shape, stride_order=order, assumed_align=align)

    q = t(dtype, (B, H, LP, D), row)
    kv = t(dtype, (B, Hkv, LP, D), row)
    vec = t(cutlass.Float32, (B, H, LP), (2, 1, 0), 4)
    bias = t(cutlass.Float32, (H, W), (1, 0), 4)
    tau = t(cutlass.Float32, (H,), (0,), 4)
    lens = t(cutlass.Int32, (B,), (0,), 4)
    stream = make_fake_stream(use_tvm_ffi_env_stream=True)
    if kernel == "dq":
        return [q, kv, kv, q, vec, bias, tau, lens, q, vec, vec, cutlass.Float32(1.0), stream]
    part = t(cutlass.Float32, (B, H, NKB, WP2), (3, 2, 1, 0), 4)
    return [q, kv, kv, q, vec, vec, bias, tau, lens, kv, kv, part, cutlass.Int32(1), cutlass.Float32(1.0), stream]


def compile(key: KernelKey):
    """The TVM-FFI compiled kernel of ``key`` (kernel in KERNELS)."""
    assert key.kernel in KERNELS and key.head_dim in (64, 128) and key.dtype in ("float16", "bfloat16")
    dtype = _dtype(key.dtype)
    build = _build_dq if key.kernel == "dq" else _build_dkdv
    fn = build(key.head_dim, dtype, bool(key.causal))
    return cute.compile(fn, *_fakes(key.kernel, key.head_dim, dtype), options="--enable-tvm-ffi")
