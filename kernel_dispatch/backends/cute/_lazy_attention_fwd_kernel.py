"""CuTe DSL kernel: the lazy attention forward (SPEC section 1), both sweeps fused in one CTA.

One CTA per (query block of BM = 64 rows, head, batch), 4 warps (128 threads, 16 query rows per warp). The Q tile
stays in shared memory for both sweeps over the visible key blocks of BN = 64 keys:

- sweep 1: S = scale * Q K^T (+ bias, masks), online row max / sum of exp -> LSE (stored, natural log);
- sweep 2: S again, P = exp(S - LSE), A = relu(P + tau / i) re-masked, O += A V (fp32, no renormalisation).

SM80-style tensor-core path, which sm_90a runs: cp.async global->shared loads (rows past lengths[b] zero-filled),
K and V double-buffered (the next key block loads during the current one; one CTA barrier per key block),
ldmatrix shared->registers, mma.sync m16n8k16 (fp16/bf16 in, fp32 accumulate). Key blocks whose every entry is
unmasked and unbiased ("free") skip the index work; the others first fill a shared table of the tile's BM + BN - 1
diagonals (log2-domain bias), add it per element and select -inf for masked entries. In sweep 2 a warp whose 16
rows keep no key of a block (tau < 0: every P <= -tau / i) skips that block's A V product.
Query rows past lengths[b] load as zeros (golden zeroes padded q, so their LSE is the log-sum-exp of the bias over
the valid keys, as golden returns it) and store O = 0 exactly; lengths[b] = 0 gives LSE = -inf and O = 0.

Layout (all contiguous): Q, O [B, H, L, D]; K, V [B, Hkv, L, D] fp16/bf16; Bias [H, W], Tau [H] fp32; Lens [B]
int32; LSE [B, H, L] fp32. B, H, Hkv, L, W are runtime values; D, dtype and causal are compiled in.
"""

import time

import cutlass
import cutlass.cute as cute
from cutlass._mlir.dialects import llvm
from cutlass.cute.nvgpu import cpasync, warp

from ._kernel_key import KernelKey
from ._tiles import keys_free, mn_view, quad_reduce

KERNELS = ("fwd",)
ARGS = {
    "fwd": [
        "q fp16/bf16 [B,H,L,D] contiguous",
        "k fp16/bf16 [B,Hkv,L,D] contiguous",
        "v fp16/bf16 [B,Hkv,L,D] contiguous",
        "bias fp32 [H,W] contiguous",
        "tau fp32 [H]",
        "lengths int32 [B] (L when no padding; values in [0, L])",
        "lse fp32 [B,H,L] (written, natural log)",
        "o fp16/bf16 [B,H,L,D] (written)",
        "scale float (python scalar)",
    ]
}

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453
NUM_THREADS = 128
STAGES = 2  # K and V buffers
FOLD_SCALE = True  # sweep 1, free tiles: the scale folds into the exponent's FMA (scale > 0)
# (BM, BN) per head dim
TILES = {64: (64, 64), 128: (64, 64)}


class LazyAttentionFwd:
    def __init__(self, head_dim: int, dtype, causal: bool):
        self.D = head_dim
        self.dtype = dtype
        self.causal = causal
        self.BM, self.BN = TILES[head_dim]
        self.threads = NUM_THREADS
        self.stages = STAGES
        self.table = self.BM + self.BN  # bias by diagonal of one tile (BM + BN - 1 used)

    # ------------------------------------------------------------------ host side
    @cute.jit
    def __call__(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mBias: cute.Tensor, mTau: cute.Tensor,
                 mLens: cute.Tensor, mLSE: cute.Tensor, mO: cute.Tensor, scale: cutlass.Float32, stream):
        D, BM, BN = self.D, self.BM, self.BN
        dt = self.dtype
        smem_k = 64 if D % 64 == 0 else 32
        swz = 3 if smem_k == 64 else 2
        atom = cute.make_composed_layout(cute.make_swizzle(swz, 3, 3), 0,
                                         cute.make_layout((8, smem_k), stride=(smem_k, 1)))
        sQ_layout = cute.tile_to_shape(atom, (BM, D), (0, 1))
        sKV_layout = cute.tile_to_shape(atom, (BN, D, self.stages), (0, 1, 2))

        @cute.struct
        class SharedStorage:
            sQ: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sQ_layout)], 1024]
            sK: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sKV_layout)], 1024]
            sV: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sKV_layout)], 1024]
            sT: cute.struct.Align[cute.struct.MemRange[cutlass.Float32, self.table], 16]

        copy_bits = 128
        elems = copy_bits // dt.width
        atom_async = cute.make_copy_atom(cpasync.CopyG2SOp(cache_mode=cpasync.LoadCacheMode.GLOBAL), dt,
                                         num_bits_per_copy=copy_bits)
        atom_store = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), dt, num_bits_per_copy=copy_bits)
        cols = smem_k // elems
        t_layout = cute.make_layout((self.threads // cols, cols), stride=(cols, 1))
        v_layout = cute.make_layout((1, elems))
        gcopy_in = cute.make_tiled_copy_tv(atom_async, t_layout, v_layout)
        gcopy_out = cute.make_tiled_copy_tv(atom_store, t_layout, v_layout)

        tiled_mma = cute.make_tiled_mma(warp.MmaF16BF16Op(dt, cutlass.Float32, (16, 8, 16)),
                                        (self.threads // 32, 1, 1),
                                        permutation_mnk=(self.threads // 32 * 16, 16, 16))

        L = mQ.shape[2]
        n_mblocks = (L + BM - 1) // BM
        self.kernel(mQ, mK, mV, mBias, mTau, mLens, mLSE, mO, scale, sQ_layout, sKV_layout, gcopy_in, gcopy_out,
                    tiled_mma, SharedStorage).launch(grid=[n_mblocks, mQ.shape[1], mQ.shape[0]],
                                                     block=[self.threads, 1, 1], stream=stream)

    # ------------------------------------------------------------------ helpers
    @cute.jit
    def _load_rows(self, gcopy, tg, ts, tc, row0, limit):
        """cp.async rows of one tile whose row (row0 + local) < limit; zero-fill the others."""
        for r in cutlass.range_constexpr(cute.size(ts.shape[1])):
            if row0 + tc[0, r, 0][0] < limit:
                cute.copy(gcopy, tg[None, r, None], ts[None, r, None])
            else:
                ts[None, r, None].fill(0)

    @cute.jit
    def _gemm_s(self, tiled_mma, acc_S, s_copy_Q, tSsQ, tSrQ_v, tSrQ, s_copy_K, tSsK, tSrK_v, tSrK):
        acc_S.fill(0.0)
        nk = cute.size(tSsQ.shape[2])
        cute.copy(s_copy_Q, tSsQ[None, None, 0], tSrQ_v[None, None, 0])
        cute.copy(s_copy_K, tSsK[None, None, 0], tSrK_v[None, None, 0])
        for k in cutlass.range_constexpr(nk):
            if cutlass.const_expr(k + 1 < nk):
                cute.copy(s_copy_Q, tSsQ[None, None, k + 1], tSrQ_v[None, None, k + 1])
                cute.copy(s_copy_K, tSsK[None, None, k + 1], tSrK_v[None, None, k + 1])
            cute.gemm(tiled_mma, acc_S, tSrQ[None, None, k], tSrK[None, None, k], acc_S)

    @cute.jit
    def _lse_to_store(self, lse2):
        """The natural-log LSE for a row whose log2 log-sum-exp is lse2: rounded, then one ulp lower where the
        backward's recovery round(LSE * log2 e) would exceed lse2 (with scores beyond 2^24 a recovered LSE2 one ulp
        high would make a dominant key's P 1/2 or 0); the other backends' kernels store it the same way."""
        lse = lse2 * LN2
        bits = cutlass.Int32(llvm.bitcast(cutlass.Int32.mlir_type, lse.ir_value()))
        step = cutlass.Int32(-1) if lse > 0.0 else cutlass.Int32(1)
        down = cutlass.Float32(llvm.bitcast(cutlass.Float32.mlir_type, (bits + step).ir_value()))
        return down if lse * LOG2E > lse2 else lse

    @cute.jit
    def _fill_table(self, sT, tidx, m0, n0, W, mBias, h):
        """sT[t] = log2-domain bias of the tile's diagonal t (distance m - n = m0 - n0 + t - (BN - 1)), 0 outside the
        band (the causal mask is applied by :meth:`_scores`)."""
        BN = self.BN
        for t0 in cutlass.range_constexpr(0, self.BM + BN - 1, self.threads):
            t = t0 + tidx
            if t < self.BM + BN - 1:
                self._table_entry(sT, t, m0 - n0 + t - (BN - 1), W, mBias, h)

    @cute.jit
    def _table_entry(self, sT, t, d, W, mBias, h):
        a = d
        if cutlass.const_expr(not self.causal):
            a = cutlass.max(d, -d)
        val = cutlass.Float32(0.0)
        if a < W and a >= 0:
            val = mBias[h, a] * LOG2E
        sT[t] = val

    @cute.jit
    def _scores(self, acc_mn, tScS_mn, sT, m0, n0, lb, sc2):
        """acc_mn (raw q.k) -> log2-domain scores with bias and masks, in place. Masked entries are set to -inf by a
        select (never by adding -inf: a NaN product of a masked key must not reach its row, as in golden)."""
        for c in cutlass.range_constexpr(cute.size(acc_mn.shape[1])):
            j = tScS_mn[0, c][1]
            key_ok = n0 + j < lb
            for r in cutlass.range_constexpr(cute.size(acc_mn.shape[0])):
                i = tScS_mn[r, 0][0]
                val = acc_mn[r, c] * sc2 + sT[i - j + (self.BN - 1)]
                ok = key_ok
                if cutlass.const_expr(self.causal):
                    ok = key_ok and (n0 + j <= m0 + i)
                acc_mn[r, c] = val if ok else -cutlass.Float32.inf

    # ------------------------------------------------------------------ kernel
    @cute.kernel
    def kernel(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mBias: cute.Tensor, mTau: cute.Tensor,
               mLens: cute.Tensor, mLSE: cute.Tensor, mO: cute.Tensor, scale: cutlass.Float32,
               sQ_layout: cute.ComposedLayout, sKV_layout: cute.ComposedLayout, gcopy_in: cute.TiledCopy,
               gcopy_out: cute.TiledCopy, tiled_mma: cute.TiledMma, SharedStorage: cutlass.Constexpr):
        D, BM, BN = self.D, self.BM, self.BN
        dt = self.dtype
        tidx, _, _ = cute.arch.thread_idx()
        bx, h, b = cute.arch.block_idx()

        L = mQ.shape[2]
        H = mQ.shape[1]
        Hkv = mK.shape[1]
        W = mBias.shape[1]
        hk = h // (H // Hkv)
        n_mblocks = (L + BM - 1) // BM
        mb = bx
        if cutlass.const_expr(self.causal):
            mb = n_mblocks - 1 - bx  # longest rows first
        m0 = mb * BM
        lb = cutlass.min(mLens[b], L)
        key_end = lb
        if cutlass.const_expr(self.causal):
            key_end = cutlass.min(m0 + BM, lb)
        n_blocks = (key_end + BN - 1) // BN
        sc2 = scale * LOG2E

        gQ = cute.local_tile(mQ[b, h, None, None], (BM, D), (mb, 0))
        gK = cute.local_tile(mK[b, hk, None, None], (BN, D), (None, 0))
        gV = cute.local_tile(mV[b, hk, None, None], (BN, D), (None, 0))

        smem = cutlass.memory.SmemAllocator()
        storage = smem.allocate(SharedStorage)
        sQ = storage.sQ.get_tensor(sQ_layout)
        sK = storage.sK.get_tensor(sKV_layout)
        sV = storage.sV.get_tensor(sKV_layout)
        sT = storage.sT.get_tensor(cute.make_layout(self.table))
        sVt = cute.composition(sV, cute.make_layout((D, BN, self.stages), stride=(BN, 1, BN * D)))

        thr_in = gcopy_in.get_slice(tidx)
        tQgQ = thr_in.partition_S(gQ)
        tQsQ = thr_in.partition_D(sQ)
        tKgK = thr_in.partition_S(gK)
        tKsK = thr_in.partition_D(sK)
        tVgV = thr_in.partition_S(gV)
        tVsV = thr_in.partition_D(sV)
        tQc = thr_in.partition_S(cute.make_identity_tensor((BM, D)))
        tKc = thr_in.partition_S(cute.make_identity_tensor((BN, D)))

        thr_mma = tiled_mma.get_slice(tidx)
        tSrQ = thr_mma.make_fragment_A(thr_mma.partition_A(sQ))
        tSrK = thr_mma.make_fragment_B(thr_mma.partition_B(sK[None, None, 0]))
        tOrVt = thr_mma.make_fragment_B(thr_mma.partition_B(sVt[None, None, 0]))
        acc_O = cute.make_rmem_tensor(thr_mma.partition_shape_C((BM, D)), cutlass.Float32)
        acc_O.fill(0.0)
        acc_S = cute.make_rmem_tensor(thr_mma.partition_shape_C((BM, BN)), cutlass.Float32)

        s_copy_Q = cute.make_tiled_copy_A(
            cute.make_copy_atom(warp.LdMatrix8x8x16bOp(transpose=False, num_matrices=4), dt), tiled_mma)
        s_copy_K = cute.make_tiled_copy_B(
            cute.make_copy_atom(warp.LdMatrix8x8x16bOp(transpose=False, num_matrices=4), dt), tiled_mma)
        s_copy_V = cute.make_tiled_copy_B(
            cute.make_copy_atom(warp.LdMatrix8x8x16bOp(transpose=True, num_matrices=4), dt), tiled_mma)
        thr_sQ = s_copy_Q.get_slice(tidx)
        thr_sK = s_copy_K.get_slice(tidx)
        thr_sV = s_copy_V.get_slice(tidx)
        tSsQ = thr_sQ.partition_S(sQ)
        tSrQ_v = thr_sQ.retile(tSrQ)
        tSsK = thr_sK.partition_S(sK)
        tSrK_v = thr_sK.retile(tSrK)
        tOsVt = thr_sV.partition_S(sVt)
        tOrVt_v = thr_sV.retile(tOrVt)

        tScS_mn = mn_view(thr_mma.partition_C(cute.make_identity_tensor((BM, BN))))
        acc_S_mn = mn_view(acc_S)
        acc_O_mn = mn_view(acc_O)
        tOcO_mn = mn_view(thr_mma.partition_C(cute.make_identity_tensor((BM, D))))
        n_rows = cute.size(acc_S_mn.shape[0])

        row_max = cute.make_rmem_tensor((n_rows,), cutlass.Float32)
        row_sum = cute.make_rmem_tensor((n_rows,), cutlass.Float32)
        lse2 = cute.make_rmem_tensor((n_rows,), cutlass.Float32)
        thr = cute.make_rmem_tensor((n_rows,), cutlass.Float32)
        row_max.fill(-cutlass.Float32.inf)
        row_sum.fill(0.0)

        # ---------------- prologue: Q (rows >= lb zero) and the first K block
        self._load_rows(gcopy_in, tQgQ, tQsQ, tQc, m0, lb)
        if n_blocks > 0:
            self._load_rows(gcopy_in, tKgK[None, None, None, 0], tKsK[None, None, None, 0], tKc, 0, lb)
        cute.arch.cp_async_commit_group()

        # ---------------- sweep 1: row log-sum-exp; K double-buffered, one barrier per key block
        for nb in cutlass.range(n_blocks, unroll=1):
            n0 = nb * BN
            stage = nb % 2
            cute.arch.cp_async_wait_group(0)
            cute.arch.sync_threads()  # K(nb) visible; every thread is past block nb - 1 (its buffer and sT)
            if nb + 1 < n_blocks:
                self._load_rows(gcopy_in, tKgK[None, None, None, nb + 1], tKsK[None, None, None, 1 - stage], tKc,
                                n0 + BN, lb)
            cute.arch.cp_async_commit_group()
            free = keys_free(m0, n0, lb, W, BM, BN, self.causal)
            if not free:
                self._fill_table(sT, tidx, m0, n0, W, mBias, h)
            self._gemm_s(tiled_mma, acc_S, s_copy_Q, tSsQ, tSrQ_v, tSrQ, s_copy_K, tSsK[None, None, None, stage],
                         tSrK_v, tSrK)
            mul = cutlass.Float32(1.0)  # the scale still to apply to acc_S (free tiles with scale > 0 fold it in)
            if free:
                if cutlass.const_expr(FOLD_SCALE):
                    if sc2 > 0.0:
                        mul = sc2
                if mul == 1.0:
                    for r in cutlass.range_constexpr(n_rows):
                        for c in cutlass.range_constexpr(cute.size(acc_S_mn.shape[1])):
                            acc_S_mn[r, c] = acc_S_mn[r, c] * sc2
            else:
                cute.arch.sync_threads()  # sT filled
                self._scores(acc_S_mn, tScS_mn, sT, m0, n0, lb, sc2)
            for r in cutlass.range_constexpr(n_rows):
                row = acc_S_mn[r, None].load()
                mx = quad_reduce(row.reduce(cute.ReductionOp.MAX, -cutlass.Float32.inf, 0), cute.arch.fmax) * mul
                prev = row_max[r]
                new = cute.arch.fmax(prev, mx)
                safe = cutlass.Float32(0.0) if new == -cutlass.Float32.inf else new
                e = cute.math.exp2(row * mul - safe, fastmath=True)
                row_sum[r] = row_sum[r] * cute.math.exp2(prev - safe, fastmath=True) + e.reduce(
                    cute.ReductionOp.ADD, cutlass.Float32(0.0), 0)
                row_max[r] = new

        # ---------------- LSE: finish the rows, store (natural log)
        lane = tidx % 4
        for r in cutlass.range_constexpr(n_rows):
            s = quad_reduce(row_sum[r], lambda x, y: x + y)
            lse2[r] = row_max[r] + cute.math.log2(s, fastmath=False)
            m = m0 + tOcO_mn[r, 0][0]
            if lane == 0 and m < L:
                mLSE[b, h, m] = self._lse_to_store(lse2[r])
            if cutlass.const_expr(self.causal):
                thr[r] = mTau[h] / cutlass.Float32(m + 1)
            else:
                thr[r] = mTau[h] / cutlass.Float32(lb)

        # ---------------- sweep 2: O = relu(P + tau / i) V, only where some row is valid; K, V double-buffered
        n_blocks2 = n_blocks if m0 < lb else 0
        cute.arch.cp_async_wait_group(0)
        cute.arch.sync_threads()  # every thread is past sweep 1 (K buffers, sT)
        if n_blocks2 > 0:
            self._load_rows(gcopy_in, tKgK[None, None, None, 0], tKsK[None, None, None, 0], tKc, 0, lb)
            self._load_rows(gcopy_in, tVgV[None, None, None, 0], tVsV[None, None, None, 0], tKc, 0, lb)
        cute.arch.cp_async_commit_group()
        for nb in cutlass.range(n_blocks2, unroll=1):
            n0 = nb * BN
            stage = nb % 2
            cute.arch.cp_async_wait_group(0)
            cute.arch.sync_threads()  # K(nb), V(nb) visible; every thread is past block nb - 1
            if nb + 1 < n_blocks2:
                self._load_rows(gcopy_in, tKgK[None, None, None, nb + 1], tKsK[None, None, None, 1 - stage], tKc,
                                n0 + BN, lb)
                self._load_rows(gcopy_in, tVgV[None, None, None, nb + 1], tVsV[None, None, None, 1 - stage], tKc,
                                n0 + BN, lb)
            cute.arch.cp_async_commit_group()
            free = keys_free(m0, n0, lb, W, BM, BN, self.causal)
            if not free:
                self._fill_table(sT, tidx, m0, n0, W, mBias, h)
            self._gemm_s(tiled_mma, acc_S, s_copy_Q, tSsQ, tSrQ_v, tSrQ, s_copy_K, tSsK[None, None, None, stage],
                         tSrK_v, tSrK)
            if free:
                for r in cutlass.range_constexpr(n_rows):
                    row = acc_S_mn[r, None].load()
                    x = row * sc2 - lse2[r]
                    p = cute.math.exp2(cute.where(x > 0.0, cute.full_like(x, 0.0), x), fastmath=True)
                    a = p + thr[r]
                    acc_S_mn[r, None] = cute.where(a < 0.0, cute.full_like(a, 0.0), a)  # relu keeping NaN
            else:
                cute.arch.sync_threads()  # sT filled
                self._scores(acc_S_mn, tScS_mn, sT, m0, n0, lb, sc2)
                for r in cutlass.range_constexpr(n_rows):
                    row = acc_S_mn[r, None].load()
                    x = row - lse2[r]
                    p = cute.math.exp2(cute.where(x > 0.0, cute.full_like(x, 0.0), x), fastmath=True)
                    a = p + thr[r]
                    a = cute.where(a < 0.0, cute.full_like(a, 0.0), a)  # relu keeping NaN
                    acc_S_mn[r, None] = cute.where(row == -cutlass.Float32.inf, cute.full_like(a, 0.0), a)
            # a warp whose rows keep no key of this block (tau < 0 far from the diagonal) skips its A V
            # A >= 0, so its sum is 0 only when every entry is; a NaN sum (kept by the relu) counts as live
            live = acc_S.load().reduce(cute.ReductionOp.ADD, cutlass.Float32(0.0), 0) != 0.0
            if cute.arch.vote_any_sync(live):
                rP = cute.make_fragment_like(acc_S, dt)
                rP.store(acc_S.load().to(dt))
                # (4, MMA_M, MMA_N) -> ((4, 2), MMA_M, MMA_N / 2): the C layout of m16n8 as the A layout of m16n8k16
                pl = cute.logical_divide(rP.layout, (None, None, 2))
                tOrS = cute.make_tensor(rP.iterator, cute.make_layout(
                    ((pl.shape[0], pl.shape[2][0]), pl.shape[1], pl.shape[2][1]),
                    stride=((pl.stride[0], pl.stride[2][0]), pl.stride[1], pl.stride[2][1])))
                nk = cute.size(tOrS.shape[2])
                cute.copy(s_copy_V, tOsVt[None, None, 0, stage], tOrVt_v[None, None, 0])
                for k in cutlass.range_constexpr(nk):
                    if cutlass.const_expr(k + 1 < nk):
                        cute.copy(s_copy_V, tOsVt[None, None, k + 1, stage], tOrVt_v[None, None, k + 1])
                    cute.gemm(tiled_mma, acc_O, tOrS[None, None, k], tOrVt[None, None, k], acc_O)

        # ---------------- epilogue: rows >= lb exactly zero; stage O in sQ, store rows < L
        cute.arch.cp_async_wait_group(0)
        for r in cutlass.range_constexpr(n_rows):
            m = m0 + tOcO_mn[r, 0][0]
            if m >= lb:
                acc_O_mn[r, None] = cute.full_like(acc_O_mn[r, None].load(), 0.0)
        rO = cute.make_fragment_like(acc_O, dt)
        rO.store(acc_O.load().to(dt))
        cute.arch.sync_threads()
        s_copy_O = cute.make_tiled_copy_C(cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), dt), tiled_mma)
        thr_sO = s_copy_O.get_slice(tidx)
        cute.copy(s_copy_O, thr_sO.retile(rO), thr_sO.partition_D(sQ))
        cute.arch.sync_threads()
        gO = cute.local_tile(mO[b, h, None, None], (BM, D), (mb, 0))
        thr_out = gcopy_out.get_slice(tidx)
        tOsO = thr_out.partition_S(sQ)
        tOgO = thr_out.partition_D(gO)
        tOc = thr_out.partition_D(cute.make_identity_tensor((BM, D)))
        tOrO = cute.make_fragment_like(tOgO, dt)
        cute.copy(gcopy_out, tOsO, tOrO)
        for r in cutlass.range_constexpr(cute.size(tOgO.shape[1])):
            if m0 + tOc[0, r, 0][0] < L:
                cute.copy(gcopy_out, tOrO[None, r, None], tOgO[None, r, None])


_DTYPES = {"float16": "Float16", "bfloat16": "BFloat16"}


def fake_args(key: KernelKey):
    """Fake tensors (B, H, Hkv, L, W runtime) and scalars in ARGS order, plus the env stream."""
    dt = getattr(cutlass, _DTYPES[key.dtype])
    D = key.head_dim
    B, H, Hkv, L, W = (cute.sym_int() for _ in range(5))
    rows = (3, 2, 1, 0)
    q = cute.runtime.make_fake_compact_tensor(dt, (B, H, L, D), stride_order=rows, assumed_align=16)
    k = cute.runtime.make_fake_compact_tensor(dt, (B, Hkv, L, D), stride_order=rows, assumed_align=16)
    v = cute.runtime.make_fake_compact_tensor(dt, (B, Hkv, L, D), stride_order=rows, assumed_align=16)
    bias = cute.runtime.make_fake_compact_tensor(cutlass.Float32, (H, W), stride_order=(1, 0), assumed_align=4)
    tau = cute.runtime.make_fake_compact_tensor(cutlass.Float32, (H,), assumed_align=4)
    lens = cute.runtime.make_fake_compact_tensor(cutlass.Int32, (B,), assumed_align=4)
    lse = cute.runtime.make_fake_compact_tensor(cutlass.Float32, (B, H, L), stride_order=(2, 1, 0), assumed_align=4)
    o = cute.runtime.make_fake_compact_tensor(dt, (B, H, L, D), stride_order=rows, assumed_align=16)
    stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
    return [q, k, v, bias, tau, lens, lse, o, cutlass.Float32(1.0), stream]


def shared_bytes(key: KernelKey) -> int:
    """Dynamic shared memory of one CTA (the launch asks for the kernel's SharedStorage): Q [BM, D], K and V
    [BN, D] x STAGES (1024-byte aligned each), the fp32 bias-by-diagonal table (BM + BN entries)."""
    BM, BN = TILES[key.head_dim]
    D, el, off = key.head_dim, 2, 0
    for size, align in ((BM * D * el, 1024), (BN * D * el * STAGES, 1024), (BN * D * el * STAGES, 1024),
                        ((BM + BN) * 4, 16)):
        off = -(-off // align) * align + size
    return off


def compile(key: KernelKey, options: str = "--enable-tvm-ffi"):
    """The compiled TVM FFI function for ``key`` (``key.kernel`` must be ``"fwd"``)."""
    if key.kernel not in KERNELS:
        raise ValueError(f"unknown kernel {key.kernel!r}; this module has {KERNELS}")
    dt = getattr(cutlass, _DTYPES[key.dtype])
    op = LazyAttentionFwd(key.head_dim, dt, key.causal)
    return cute.compile(op, *fake_args(key), options=options)


if __name__ == "__main__":
    import sys

    for spec in sys.argv[1:] or ["128:bfloat16:1"]:
        d, t, c = spec.split(":")
        t0 = time.perf_counter()
        compile(KernelKey("fwd", int(d), t, bool(int(c))))
        print(spec, f"{time.perf_counter() - t0:.1f}s")
