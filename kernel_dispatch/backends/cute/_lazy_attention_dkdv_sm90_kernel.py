"""CuTe DSL kernel: the key-major half of the lazy attention backward (SPEC section 1), dK, dV and the dbias
partials, on Hopper's own machinery (TMA, wgmma, warp specialisation). B=4 H=16 L=4096 bf16 causal W=512 on an
H100: 1.19 ms at D=128, 0.90 ms at D=64 (the SM80-style kernel it replaced: 2.20 and 1.46 ms; docs/cute-backend.md).

One CTA per (key block of BN = 128 keys, kv head, batch), three warpgroups (384 threads), launched as a
programmatic dependent of ``dq_sm90`` (DEPENDENT_LAUNCH): a CTA may start while ``dq_sm90``'s last CTAs run; its
producer loads K and V, then waits for ``dq_sm90``'s grid to end (griddepcontrol.wait) before the first Q / dO /
LSE / Delta stage, so every read of Delta, and every computation and store, follows ``dq_sm90``'s writes (it writes
nothing ``dq_sm90`` reads):

- warpgroup 0, the producer: its warp 0 issues every TMA load (setmaxnreg down to 24 registers). K and V of the
  block once (each as two halves [WN = 64, D], four copies completing the one barrier of the KV pipeline), then for
  every (query head of the GQA group, query block of BM = 64 rows) that sees the block's keys, in a fixed order,
  one stage of the QdO ring (PipelineTmaAsync, STAGES stages): the Q tile [BM, D], the dO tile [BM, D], and the
  LSE and Delta vectors [BM] fp32 (four TMA copies completing the stage's full barrier).
- warpgroups 1 and 2, the consumers (setmaxnreg up to 240): warpgroup w owns keys n0 + 64 w .. n0 + 64 w + 63 and
  computes, per stage, the transposed tiles [64 keys, 64 queries] with wgmma (m64n64k16, both operands in shared
  memory): S^T = K_w Q^T and dA^T = V_w dO^T; then in registers P^T = exp2(S^T scale log2 e + bias - LSE log2 e), A^T
  = relu(P + tau / i)^T (re-masked), dS^T = P (Mk dA - Delta) (fp32), and accumulates with wgmma m64nDk16 whose A
  operand comes from registers (the fp32 tile converted to q's dtype, same register order as the accumulator; DS_SMEM,
  off, puts dS^T in shared memory instead): dV_w += A^T dO and dK_w += dS^T Q, both B operands the stage's Q / dO
  bytes seen through an MN-major view of the same swizzled shared memory (a K-major [64, D] SW128 tile and an MN-major
  [D, 64] SW128 tile are the same bytes). dK, dV stay in registers (64 x D fp32 per warpgroup) until the epilogue; dK
  is multiplied by scale at the end. No atomics: each CTA owns its dK, dV rows and the order over (head, query block)
  is fixed.

Synchronisation:
- KV pipeline (1 stage): the consumers wait on its full barrier once; sK and sV are never refilled.
- QdO pipeline (STAGES stages): full[s] = the TMA bytes of the stage (2 BM D elements + 2 BM fp32); empty[s] needs
  one arrive from each of the 8 consumer warps (consumer_release) after both of that warpgroup's accumulating wgmma
  groups reading the stage completed (wait_group(0) precedes every release). DEFER (D = 64): the accumulating GEMMs
  of tile t stay in flight while tile t + 1's score GEMMs are issued, and stage t is released after tile t + 1's
  wait_group(0) (one stage later); every tile is then computed (a tile no key of the warpgroup is visible from adds
  exact zeros), since a skipped path would merge the in-flight accumulators with ordinary values and ptxas would
  serialize every wgmma; for the same reason the accumulators are pinned (_pin: empty volatile asm) after the final
  wait. Without DEFER (D = 128: the rA, rS registers held across the next score GEMMs do not fit in 240 registers,
  ptxas serializes for lack of registers) a warpgroup whose keys no query of the tile sees (causal, or keys / rows
  past lengths[b]) waits and releases without computing. The loop is the same in both warpgroups.
- Named barrier 1 + w (warpgroup w's 128 threads), all at warpgroup-uniform points:
  (a) bias tables (generic proxy): non-free tile number k of the warpgroup fills its table k % 2, then the barrier;
      a thread starts fill k only after passing the barrier of fill k - 1, which no thread of the warpgroup
      reaches before finishing its reads of fill k - 2.
  (b) dbias diagonals: a band tile (some |m - n| < min(W, L); always a non-free tile) writes dS^T fp32 into the
      warpgroup's sDs skewed, entry (key i, query j) at column (j - i) mod 64 (row stride DS_STRIDE = 72 words: at
      most 2-way bank conflicts), a thread's two entries on one diagonal ((i, j) and (i + 8, j + 8)) added first
      (18 stores instead of 32), barrier; then column w holds wrapped diagonal w, which is diagonal j - i = w on
      rows i < 64 - w and w - 64 below. Threads 2 w and 2 w + 1 sum column w over the rows that hold entries (20
      loads each, the same for every thread: summing the true diagonals instead, the middle ones take 64 and the
      warpgroup waits for them), swap by shuffle the part the other finishes, and add diagonal w (even thread) or
      w - 64 (odd) into Partial[b, h, 2 kb + w, dist + P0] (read-modify-write in global memory; the read is
      issued right after this tile's table barrier, under the GEMMs). The next writes to sDs
      and the next read of the same Partial entry (by any thread of the warpgroup) come after the table barrier (a)
      of the next non-free tile, which orders them (bar.sync orders the memory accesses of its participants).
  (c) epilogue: dK (then dV) registers -> the warpgroup's own half of sK (sV), free since its last wgmma
      completed and never read by the other warpgroup -> barrier -> 16-byte stores of rows < LP -> barrier.
- wgmma: warpgroup.fence() before every GEMM whose register operands were written by ordinary instructions;
  commit_group + wait_group before any register or buffer of that GEMM is read, rewritten or released.

Rules: keys and rows >= lengths[b] masked (the launcher zero-fills their q, k, v, dO
rows, so their products are finite); rows with one visible key (causal row 0, or lengths[b] == 1) get P = 1 exactly;
mask-free tiles (every row and key valid, every distance >= W or, non-causal, <= -W) skip the index work.
The causal threshold tau / i is tau * rcp.approx(i) here (the forward divides, dq_sm90 multiplies by 1 / i): the
mask Mk = [P + tau / i > 0] can differ between them only where P + tau / i is within an ulp of 0.

Layout (the launcher pads rows to LP, a multiple of ROW_MULTIPLE = 64, with zeros): Q, dO [B, H, LP, D];
K, V, dK, dV [B, Hkv, LP, D] (contiguous, fp16 or bf16, 16-byte aligned); LSE, Delta [B, H, LP] fp32 (16-byte
aligned: TMA); Bias [H, W] fp32; Tau [H] fp32; Lens [B] int32; Partial [B, H, LP / KEY_BLOCK, NC] fp32, whose
entries 0 .. min(W, L) - 1 causal (entry = distance m - n, P0 = 0), else 0 .. 2 min(W, L) - 2 (entry = m - n +
min(W, L) - 1 = P0 + m - n) ``dq_sm90`` zeroed (its other columns are not read here). The grid covers
ceil(LP / 128) key blocks; a second half past LP reads zeros (TMA's out-of-bounds fill) and stores nothing.
"""

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
from cutlass._mlir.dialects import llvm
from cutlass.cute.nvgpu import cpasync, warpgroup

from ._kernel_key import KernelKey
from ._tiles import (DSL_DTYPES, LOG2E, WG, HopperKernel, acc_mn_view, accumulate_mma, compile_kernel, fake_rows,
                     grid_block, grid_dims, one_key_row, score_mmas, store_through_smem, struct_bytes, sw128_atoms,
                     thread_roles, tile_bias_table, tma_pipeline, tma_views)

KERNELS = ("dkdv_sm90",)
ARGS = {
    "dkdv_sm90": ["q fp16/bf16 [B,H,LP,D]", "k [B,Hkv,LP,D]", "v [B,Hkv,LP,D]", "do [B,H,LP,D]",
                  "lse fp32 [B,H,LP] (16-byte aligned)", "delta fp32 [B,H,LP] (16-byte aligned)", "bias fp32 [H,W]",
                  "tau fp32 [H]", "lens int32 [B]", "dk out [B,Hkv,LP,D]", "dv out [B,Hkv,LP,D]",
                  "partial out fp32 [B,H,LP/64,NC] (entries < min(W,L) causal else 2*min(W,L)-1 zeroed by dq_sm90)",
                  "L int", "scale float"],
}

ROW_MULTIPLE = 64  # the launcher pads L to LP, a multiple of this
KEY_BLOCK = 64  # keys per Partial block (one consumer warpgroup's keys)
BN = 128  # keys per CTA
WN = 64  # keys per consumer warpgroup
BM = 64  # query rows per tile (stage)
STAGES = {64: 6, 128: 3}  # Q/dO ring depth per head dim
DEFER = {64: True, 128: False}  # release a stage one tile late (its dV, dK GEMMs complete under the next tile's)
DS_SMEM = {64: False, 128: False}  # dK's A operand dS^T from shared memory: frees 16 registers, so D = 128 fits DEFER
# without serialization; timed on an H100 with DEFER at D = 128: 1.28 ms vs 1.22 ms without both, so off (its
# correctness is unchecked on a GPU)
DS_STRIDE = 72  # row stride of the skewed dS staging (fp32 words; = 8 mod 32: at most 2-way bank conflicts)
NUM_THREADS = 3 * WG
PRODUCER_REGS = 24
CONSUMER_REGS = 240
assert BM == WN, "the skewed dS staging (dbias) wraps diagonals of a square tile"
TABLE = 128  # entries of one bias-by-diagonal table (BM + WN - 1 used)
WG_BARRIER = 1  # named barriers 1 and 2: one per consumer warpgroup (128 threads)
# measurement switch (wrong results; docs/cute-backend.md): "no_dbias" skips the dbias partials of band tiles
ABLATE = ""
# programmatic dependent launch after dq_sm90 (which triggers it at each CTA's start): this kernel's CTAs start as
# dq_sm90's last ones run and load K and V; the producer waits for dq_sm90's grid before the first Delta (and Q, dO)
DEPENDENT_LAUNCH = True


class LazyAttentionDkdvSm90(HopperKernel):
    STAGES = STAGES

    # ------------------------------------------------------------------ host side
    @cute.jit
    def __call__(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mdO: cute.Tensor, mLSE: cute.Tensor,
                 mDelta: cute.Tensor, mBias: cute.Tensor, mTau: cute.Tensor, mLens: cute.Tensor, mdK: cute.Tensor,
                 mdV: cute.Tensor, mPart: cute.Tensor, L: cutlass.Int32, scale: cutlass.Float32, stream):
        D = self.D
        dt = self.dtype
        # S^T = K_w Q^T and dA^T = V_w dO^T: A = the warpgroup's K / V half (WN x D), B = Q / dO (BM x D)
        s_first, s_rest = score_mmas(dt, WN, BM)
        # dV += A^T dO, dK += dS^T Q: A from registers (WN x BM), B = dO^T / Q^T (D x BM, D contiguous)
        kv_mma = accumulate_mma(dt, WN, D)
        # dK += dS^T Q with dS^T from shared memory (DS_SMEM): A = sDsb (WN x BM, K-major)
        dk_mma = accumulate_mma(dt, WN, D, a_in_registers=False)
        k_atom, mn_atom = sw128_atoms(dt)
        sKV_layout = cute.tile_to_shape(k_atom, (WN, D, 2), order=(0, 1, 2))  # two halves, one per warpgroup
        sQ_layout = cute.tile_to_shape(k_atom, (BM, D, self.stages), order=(0, 1, 2))
        sQt_layout = cute.tile_to_shape(mn_atom, (D, BM, self.stages), order=(1, 0, 2))  # same bytes, MN-major
        sVec_layout = cute.make_layout((BM, self.stages))
        sDsb_layout = cute.tile_to_shape(k_atom, (WN, BM, 2), order=(0, 1, 2))  # dS^T in dtype, one per warpgroup

        q_t = cute.make_tensor(mQ.iterator, cute.select(mQ.layout, mode=[2, 3, 1, 0]))
        do_t = cute.make_tensor(mdO.iterator, cute.select(mdO.layout, mode=[2, 3, 1, 0]))
        k_t = cute.make_tensor(mK.iterator, cute.select(mK.layout, mode=[2, 3, 1, 0]))
        v_t = cute.make_tensor(mV.iterator, cute.select(mV.layout, mode=[2, 3, 1, 0]))
        l_t = cute.make_tensor(mLSE.iterator, cute.select(mLSE.layout, mode=[2, 1, 0]))
        d_t = cute.make_tensor(mDelta.iterator, cute.select(mDelta.layout, mode=[2, 1, 0]))
        g2s = cpasync.CopyBulkTensorTileG2SOp()
        q_slice = cute.slice_(sQ_layout, (None, None, 0))
        kv_slice = cute.slice_(sKV_layout, (None, None, 0))
        vec_slice = cute.slice_(sVec_layout, (None, 0))
        tma_q, tma_q_t = cpasync.make_tiled_tma_atom(g2s, q_t, q_slice, (BM, D))
        tma_do, tma_do_t = cpasync.make_tiled_tma_atom(g2s, do_t, q_slice, (BM, D))
        tma_k, tma_k_t = cpasync.make_tiled_tma_atom(g2s, k_t, kv_slice, (WN, D))
        tma_v, tma_v_t = cpasync.make_tiled_tma_atom(g2s, v_t, kv_slice, (WN, D))
        tma_l, tma_l_t = cpasync.make_tiled_tma_atom(g2s, l_t, vec_slice, (BM,))
        tma_d, tma_d_t = cpasync.make_tiled_tma_atom(g2s, d_t, vec_slice, (BM,))

        @cute.struct
        class SharedStorage:
            kv_mbar: cute.struct.MemRange[cutlass.Int64, 2]
            qd_mbar: cute.struct.MemRange[cutlass.Int64, 2 * self.stages]
            sK: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sKV_layout)], 1024]
            sV: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sKV_layout)], 1024]
            sQ: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sQ_layout)], 1024]
            sdO: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sQ_layout)], 1024]
            sDsb: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sDsb_layout) if DS_SMEM[D] else 8], 1024]
            sL: cute.struct.Align[cute.struct.MemRange[cutlass.Float32, BM * self.stages], 128]
            sDl: cute.struct.Align[cute.struct.MemRange[cutlass.Float32, BM * self.stages], 128]
            sT: cute.struct.Align[cute.struct.MemRange[cutlass.Float32, 4 * TABLE], 16]  # [entry, buffer, wg]
            sDs: cute.struct.Align[cute.struct.MemRange[cutlass.Float32, 2 * WN * DS_STRIDE], 16]  # [key, query, wg]

        LP = mK.shape[2]
        self.kernel(s_first, s_rest, kv_mma, dk_mma, tma_q, tma_q_t, tma_do, tma_do_t, tma_k, tma_k_t, tma_v, tma_v_t,
                    tma_l, tma_l_t, tma_d, tma_d_t, mBias, mTau, mLens, mdK, mdV, mPart, L, scale,
                    sKV_layout, sQ_layout, sQt_layout, sVec_layout, sDsb_layout, SharedStorage).launch(
            grid=grid_dims((LP + BN - 1) // BN, mK.shape[1], mK.shape[0]), block=[NUM_THREADS, 1, 1],
            smem=SharedStorage.size_in_bytes(), stream=stream, min_blocks_per_mp=1, use_pdl=DEPENDENT_LAUNCH)

    # ------------------------------------------------------------------ helpers
    @cute.jit
    def _pin(self, acc: cute.Tensor):
        """An empty volatile asm on every register of ``acc`` (CUTLASS's warpgroup_fence_operand): the values are
        read after the preceding wgmma wait, never before."""
        for i in cutlass.range_constexpr(cute.size(acc)):
            acc[i] = cutlass.Float32(llvm.inline_asm(cutlass.Float32.mlir_type, [acc[i].ir_value()], "", "=f,0",
                                                     has_side_effects=True, is_align_stack=False,
                                                     asm_dialect=llvm.AsmDialect.AD_ATT))

    @cute.jit
    def _is_free(self, m0, nw, lb, W):
        """Every query row and key of the tile [m0, m0 + BM) x [nw, nw + WN) is valid and no entry is masked or
        biased."""
        dlo = m0 - nw - (WN - 1)
        inside = m0 + BM <= lb and nw + WN <= lb
        free = inside and dlo >= W
        if cutlass.const_expr(not self.causal):
            free = inside and (dlo >= W or dlo + (BM + WN - 2) <= -W)
        return free

    @cute.kernel
    def kernel(self, s_first: cute.TiledMma, s_rest: cute.TiledMma, kv_mma: cute.TiledMma, dk_mma: cute.TiledMma,
               tma_q: cute.CopyAtom, tma_q_t: cute.Tensor, tma_do: cute.CopyAtom, tma_do_t: cute.Tensor,
               tma_k: cute.CopyAtom, tma_k_t: cute.Tensor, tma_v: cute.CopyAtom, tma_v_t: cute.Tensor,
               tma_l: cute.CopyAtom, tma_l_t: cute.Tensor, tma_d: cute.CopyAtom, tma_d_t: cute.Tensor,
               mBias: cute.Tensor, mTau: cute.Tensor, mLens: cute.Tensor, mdK: cute.Tensor, mdV: cute.Tensor,
               mPart: cute.Tensor, L: cutlass.Int32, scale: cutlass.Float32,
               sKV_layout: cute.ComposedLayout, sQ_layout: cute.ComposedLayout, sQt_layout: cute.ComposedLayout,
               sVec_layout: cute.Layout, sDsb_layout: cute.ComposedLayout, SharedStorage: cutlass.Constexpr):
        D = self.D
        dt = self.dtype
        tidx, warp_idx, wg_idx = thread_roles()
        LP = mdK.shape[2]
        kb, hk, b = grid_block()
        H = tma_q_t.shape[2]
        Hkv = tma_k_t.shape[2]
        W = mBias.shape[1]
        groups = H // Hkv
        WP = cutlass.min(W, L)
        p0 = WP - 1  # Partial's entry of distance 0 (causal: only the distances 0 .. WP - 1 exist)
        if cutlass.const_expr(self.causal):
            p0 = cutlass.Int32(0)
        lb = mLens[b]
        n0 = kb * BN

        # the (query head, query block) loop, the same in every warp: query blocks q_lo .. q_lo + n_q - 1
        q_lo = 0
        if cutlass.const_expr(self.causal):
            q_lo = n0 // BM
        n_q = (lb + BM - 1) // BM - q_lo
        if n0 >= lb:
            n_q = 0
        if n_q < 0:
            n_q = 0
        total = groups * n_q

        smem = cutlass.memory.SmemAllocator()
        storage = smem.allocate(SharedStorage)
        sK = storage.sK.get_tensor(sKV_layout.outer, swizzle=sKV_layout.inner)
        sV = storage.sV.get_tensor(sKV_layout.outer, swizzle=sKV_layout.inner)
        sQ = storage.sQ.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)
        sdO = storage.sdO.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)
        sQt = cute.make_tensor(cute.recast_ptr(sQ.iterator, sQt_layout.inner), sQt_layout.outer)
        sdOt = cute.make_tensor(cute.recast_ptr(sdO.iterator, sQt_layout.inner), sQt_layout.outer)
        sDsb = sK  # (unused unless DS_SMEM)
        if cutlass.const_expr(DS_SMEM[D]):
            sDsb = storage.sDsb.get_tensor(sDsb_layout.outer, swizzle=sDsb_layout.inner)
        sL = storage.sL.get_tensor(sVec_layout)
        sDl = storage.sDl.get_tensor(sVec_layout)
        sT = storage.sT.get_tensor(cute.make_layout((TABLE, 2, 2)))
        sDs = storage.sDs.get_tensor(cute.make_layout((WN, BM, 2), stride=(DS_STRIDE, 1, WN * DS_STRIDE)))

        kv_pipe = tma_pipeline(storage.kv_mbar.data_ptr(), 1, 2 * BN * D * dt.width // 8)
        qd_pipe = tma_pipeline(storage.qd_mbar.data_ptr(), self.stages, 2 * BM * D * dt.width // 8 + 2 * BM * 4)

        if wg_idx == 0:
            # ============================ producer warpgroup: warp 0 issues the TMA loads
            cute.arch.warpgroup_reg_dealloc(PRODUCER_REGS)
            if warp_idx == 0:
                for atom in (tma_q, tma_do, tma_k, tma_v, tma_l, tma_d):
                    cpasync.prefetch_descriptor(atom)
                gK = cute.local_tile(tma_k_t[None, None, hk, b], (WN, D), (None, 0))
                gV = cute.local_tile(tma_v_t[None, None, hk, b], (WN, D), (None, 0))
                tKsK, tKgK = tma_views(tma_k, sK, gK)
                tVsV, tVgV = tma_views(tma_v, sV, gV)
                kv_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, 1)
                kv_pipe.producer_acquire(kv_state)
                for half in cutlass.range_constexpr(2):
                    cute.copy(tma_k, tKgK[None, 2 * kb + half], tKsK[None, half],
                              tma_bar_ptr=kv_pipe.producer_get_barrier(kv_state))
                    cute.copy(tma_v, tVgV[None, 2 * kb + half], tVsV[None, half],
                              tma_bar_ptr=kv_pipe.producer_get_barrier(kv_state))
                st = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.stages)
                if cutlass.const_expr(DEPENDENT_LAUNCH):  # dq_sm90's Delta complete and visible (its grid has ended)
                    cute.arch.griddepcontrol_wait()
                for it in cutlass.range(total, unroll=1):
                    g = it // n_q
                    h = hk * groups + g
                    qb = q_lo + (it - g * n_q)
                    gQ = cute.local_tile(tma_q_t[None, None, h, b], (BM, D), (None, 0))
                    gdO = cute.local_tile(tma_do_t[None, None, h, b], (BM, D), (None, 0))
                    gL = cute.local_tile(tma_l_t[None, h, b], (BM,), (None,))
                    gDl = cute.local_tile(tma_d_t[None, h, b], (BM,), (None,))
                    tQs, tQg = tma_views(tma_q, sQ, gQ)
                    tOs, tOg = tma_views(tma_do, sdO, gdO)
                    tLs, tLg = tma_views(tma_l, sL, gL, 1)
                    tDs, tDg = tma_views(tma_d, sDl, gDl, 1)
                    qd_pipe.producer_acquire(st)
                    bar = qd_pipe.producer_get_barrier(st)
                    cute.copy(tma_q, tQg[None, qb], tQs[None, st.index], tma_bar_ptr=bar)
                    cute.copy(tma_do, tOg[None, qb], tOs[None, st.index], tma_bar_ptr=bar)
                    cute.copy(tma_l, tLg[None, qb], tLs[None, st.index], tma_bar_ptr=bar)
                    cute.copy(tma_d, tDg[None, qb], tDs[None, st.index], tma_bar_ptr=bar)
                    st.advance()
        else:
            # ============================ consumer warpgroups 1, 2: 64 keys each
            cute.arch.warpgroup_reg_alloc(CONSUMER_REGS)
            s_first.set(warpgroup.Field.ACCUMULATE, False)
            s_rest.set(warpgroup.Field.ACCUMULATE, True)
            kv_mma.set(warpgroup.Field.ACCUMULATE, True)
            dk_mma.set(warpgroup.Field.ACCUMULATE, True)
            wg = wg_idx - 1
            wtid = tidx % WG
            bar_id = WG_BARRIER + wg
            sc2 = scale * LOG2E
            nw = n0 + WN * wg  # this warpgroup's first key

            thr_s = s_first.get_slice(wtid)
            thr_kv = kv_mma.get_slice(wtid)
            tSrK = thr_s.make_fragment_A(thr_s.partition_A(sK[None, None, wg]))  # (MMA, MMA_M, MMA_K)
            tSrV = thr_s.make_fragment_A(thr_s.partition_A(sV[None, None, wg]))
            tSrQ = thr_s.make_fragment_B(thr_s.partition_B(sQ))  # (MMA, MMA_N, MMA_K, STAGES)
            tSrdO = thr_s.make_fragment_B(thr_s.partition_B(sdO))
            tKrQt = thr_kv.make_fragment_B(thr_kv.partition_B(sQt))  # (MMA, MMA_N, MMA_K, STAGES)
            tKrdOt = thr_kv.make_fragment_B(thr_kv.partition_B(sdOt))
            acc_S = thr_s.make_fragment_C(thr_s.partition_shape_C((WN, BM)))
            acc_P = thr_s.make_fragment_C(thr_s.partition_shape_C((WN, BM)))  # dA^T, then A^T
            acc_dK = thr_kv.make_fragment_C(thr_kv.partition_shape_C((WN, D)))
            acc_dV = thr_kv.make_fragment_C(thr_kv.partition_shape_C((WN, D)))
            acc_dK.fill(0.0)
            acc_dV.fill(0.0)
            rA = cute.make_rmem_tensor(thr_kv.partition_shape_A((WN, BM)), dt)
            rA_as_S = cute.make_tensor(rA.iterator, acc_S.layout)
            rS = cute.make_rmem_tensor(thr_kv.partition_shape_A((WN, BM)), dt)
            rS_as_S = cute.make_tensor(rS.iterator, acc_S.layout)
            thr_dk = dk_mma.get_slice(wtid)
            tDrDs = thr_dk.make_fragment_A(thr_dk.partition_A(sDsb[None, None, wg]))  # (MMA, MMA_M, MMA_K)
            tDrQt = thr_dk.make_fragment_B(thr_dk.partition_B(sQt))
            ds_copy = cute.make_tiled_copy_C(cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), dt), s_first)
            thr_ds = ds_copy.get_slice(wtid)
            tDsDs = thr_ds.partition_D(sDsb[None, None, wg])

            cS = thr_s.partition_C(cute.make_identity_tensor((WN, BM)))
            tScS_mn = acc_mn_view(cS)
            acc_S_mn = acc_mn_view(acc_S)
            acc_P_mn = acc_mn_view(acc_P)
            n_rows = cute.size(acc_S_mn.shape[0])
            n_cols = cute.size(acc_S_mn.shape[1])

            kv_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, 1)
            kv_pipe.consumer_wait(kv_state)
            st = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
            fills = cutlass.Int32(0)
            thr_nc = cutlass.Float32(1.0) / cutlass.Float32(cutlass.max(lb, 1))  # non-causal 1/i

            # the accumulating GEMMs of tile t complete under tile t + 1's score GEMMs: stage t is released after
            # the wait_group(0) of tile t + 1 (rel follows st one release behind; pending: a stage awaits release)
            rel = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
            pending = cutlass.Int32(0)
            for it in cutlass.range(total, unroll=1):
                g = it // n_q
                h = hk * groups + g
                qb = q_lo + (it - g * n_q)
                m0 = qb * BM
                qd_pipe.consumer_wait(st)
                s = st.index
                useful = nw < lb and m0 < lb  # some key of this warpgroup is visible from some row of the tile
                if cutlass.const_expr(self.causal):
                    useful = useful and m0 + BM - 1 >= nw
                work = useful
                if cutlass.const_expr(DEFER[D]):
                    # every tile computed (a useless one adds exact zeros): no path where the accumulators of the
                    # dV, dK GEMMs still in flight merge with a skipped tile's (ptxas would serialize every wgmma)
                    work = cutlass.Boolean(True)
                if work:
                    tau = mTau[h]
                    free = self._is_free(m0, nw, lb, W)
                    dlo = m0 - nw - (WN - 1)  # signed distance m - n at (key WN - 1, query 0)
                    warpgroup.fence()
                    for k in cutlass.range_constexpr(cute.size(tSrK.shape[2])):
                        cute.gemm(s_first if k == 0 else s_rest, acc_S, tSrK[None, None, k],
                                  tSrQ[None, None, k, s], acc_S)
                    for k in cutlass.range_constexpr(cute.size(tSrV.shape[2])):
                        cute.gemm(s_first if k == 0 else s_rest, acc_P, tSrV[None, None, k],
                                  tSrdO[None, None, k, s], acc_P)
                    warpgroup.commit_group()
                    # bias table of the tile's diagonals, while the GEMMs run
                    tbl, fills = tile_bias_table(sT[None, None, wg], fills, not free, wtid, BM + WN - 1, dlo, W, mBias,
                                                 h, self.causal, bar_id, WG)
                    # dbias partials of a band tile (some |m - n| < WP; always non-free, so the table barrier above
                    # ordered the previous read-modify-writes): the thread's Partial entry is read now, its latency
                    # under the GEMMs
                    dhi = dlo + (BM + WN - 2)
                    band = dlo < WP and dhi > -WP
                    if cutlass.const_expr(self.causal):
                        band = dlo < WP and dhi >= 0
                    band = band and useful  # (a useless tile's dS is zero; its Partial block may not exist)
                    if cutlass.const_expr("no_dbias" in ABLATE):
                        band = cutlass.Boolean(False)
                    # thread 2 w + half finishes diagonal w (half 0) or w - 64 (half 1, w >= 1) of the tile
                    dist = dlo + (WN - 1) + wtid // 2 - WN * (wtid % 2)
                    has_diag = wtid % 2 == 0 or wtid >= 2
                    own = has_diag and dist < WP and dist > -WP
                    if cutlass.const_expr(self.causal):
                        own = has_diag and dist < WP and dist >= 0
                    part_old = cutlass.Float32(0.0)
                    if band and own:
                        part_old = mPart[b, h, 2 * kb + wg, dist + p0]
                    warpgroup.wait_group(0)  # S^T, dA^T and the previous tile's dV, dK GEMMs
                    if pending == 1:
                        qd_pipe.consumer_release(rel)
                        rel.advance()
                    # column-major walk: each query column's LSE, tau / i and Delta are read once
                    if free:
                        for cc in cutlass.range_constexpr(n_cols):
                            j = tScS_mn[0, cc][1]
                            lse_j = sL[j, s] * LOG2E
                            del_j = sDl[j, s]
                            thr_j = tau * thr_nc
                            if cutlass.const_expr(self.causal):
                                thr_j = tau * cute.arch.rcp_approx(cutlass.Float32(m0 + j + 1))
                            for r in cutlass.range_constexpr(n_rows):
                                p = cute.math.exp2(acc_S_mn[r, cc] * sc2 - lse_j, fastmath=True)
                                sh = p + thr_j
                                keep = sh > 0.0
                                a = sh if keep else cutlass.Float32(0.0)
                                dp = acc_P_mn[r, cc] if keep else cutlass.Float32(0.0)
                                acc_S_mn[r, cc] = p * (dp - del_j)
                                acc_P_mn[r, cc] = a
                    else:
                        for cc in cutlass.range_constexpr(n_cols):
                            j = tScS_mn[0, cc][1]
                            m = m0 + j
                            one = one_key_row(m, lb, self.causal)
                            lse_j = sL[j, s] * LOG2E
                            del_j = sDl[j, s]
                            thr_j = tau * thr_nc
                            if cutlass.const_expr(self.causal):
                                thr_j = tau * cute.arch.rcp_approx(cutlass.Float32(m + 1))
                            for r in cutlass.range_constexpr(n_rows):
                                i = tScS_mn[r, 0][0]
                                n = nw + i
                                vis = n < lb and m < lb
                                if cutlass.const_expr(self.causal):
                                    vis = vis and n <= m
                                sv = acc_S_mn[r, cc] * sc2 + tbl[j - i + (WN - 1)] - lse_j
                                p = cute.math.exp2(sv, fastmath=True)
                                p = p if vis else cutlass.Float32(0.0)
                                p = cutlass.Float32(1.0) if (vis and one) else p
                                sh = p + thr_j
                                keep = vis and (sh > 0.0)
                                a = sh if keep else cutlass.Float32(0.0)
                                dp = acc_P_mn[r, cc] if keep else cutlass.Float32(0.0)
                                acc_S_mn[r, cc] = p * (dp - del_j)
                                acc_P_mn[r, cc] = a
                    # dbias partials: the band's diagonal sums of dS (fp32)
                    if band:
                        # a thread's entries (i, j) and (i + 8, j + 8) (columns cc, cc + 2 of its two rows) lie on
                        # one diagonal: their sum goes to row i; row i + 8 keeps only the entries without a partner
                        # (j < 8). Entry (i, j) goes to column (j - i) mod 64: the wrapped diagonal
                        i0 = tScS_mn[0, 0][0]
                        for cc in cutlass.range_constexpr(n_cols):
                            j = tScS_mn[0, cc][1]
                            val = acc_S_mn[0, cc]
                            if cutlass.const_expr(cc + 2 < n_cols):
                                val = val + acc_S_mn[1, cc + 2]
                            sDs[i0, (j - i0 + WN) % WN, wg] = val
                        for cc in cutlass.range_constexpr(2):
                            j = tScS_mn[1, cc][1]
                            sDs[i0 + 8, (j - i0 - 8 + WN) % WN, wg] = acc_S_mn[1, cc]
                    rA_as_S.store(acc_P.load().to(dt))
                    if cutlass.const_expr(DS_SMEM[D]):
                        # dS^T -> the warpgroup's sDsb (its last reader, the previous tile's dK GEMM, completed at
                        # this tile's wait_group(0)); generic stores -> fence -> barrier -> wgmma (async proxy)
                        rDs = cute.make_fragment_like(acc_S, dt)
                        rDs.store(acc_S.load().to(dt))
                        cute.copy(ds_copy, thr_ds.retile(rDs), tDsDs)
                        cute.arch.fence_proxy("async.shared", space="cta")
                        cute.arch.barrier(barrier_id=bar_id, number_of_threads=WG)  # (also orders the sDs writes)
                    else:
                        rS_as_S.store(acc_S.load().to(dt))
                    warpgroup.fence()
                    for k in cutlass.range_constexpr(cute.size(rA.shape[2])):
                        cute.gemm(kv_mma, acc_dV, rA[None, None, k], tKrdOt[None, None, k, s], acc_dV)
                    if cutlass.const_expr(DS_SMEM[D]):
                        for k in cutlass.range_constexpr(cute.size(tDrDs.shape[2])):
                            cute.gemm(dk_mma, acc_dK, tDrDs[None, None, k], tDrQt[None, None, k, s], acc_dK)
                    else:
                        for k in cutlass.range_constexpr(cute.size(rS.shape[2])):
                            cute.gemm(kv_mma, acc_dK, rS[None, None, k], tKrQt[None, None, k, s], acc_dK)
                    warpgroup.commit_group()
                    if band:  # while the accumulating GEMMs run
                        if cutlass.const_expr(not DS_SMEM[D]):
                            cute.arch.barrier(barrier_id=bar_id, number_of_threads=WG)
                        # wrapped diagonal w = wtid // 2 (column w of the skewed tile), its rows split by parity
                        # between threads 2 w and 2 w + 1: row i's entry lies on diagonal w if i + w < 64, else on
                        # w - 64; the two threads swap the halves they do not finish
                        wd = wtid // 2
                        half = wtid % 2
                        pos = cutlass.Float32(0.0)
                        neg = cutlass.Float32(0.0)
                        # rows i % 16 < 8 (pair sums), 16 per thread; then the rows i % 16 >= 8 that hold an entry
                        # without a partner: i = (j - w) mod 64 for j < 8, 4 per thread
                        for k in cutlass.range(WN // 4, unroll=8):  # (fully unrolled, its loads in flight spill)
                            i = 16 * (k // 4) + 2 * (k % 4) + half
                            v = sDs[i, wd, wg]
                            first = i + wd < WN
                            pos = pos + (v if first else cutlass.Float32(0.0))
                            neg = neg + (cutlass.Float32(0.0) if first else v)
                        for k in cutlass.range_constexpr(4):
                            i = (2 * k + half - wd + WN) % WN
                            v = sDs[i, wd, wg]
                            v = v if i % 16 >= 8 else cutlass.Float32(0.0)
                            first = i + wd < WN
                            pos = pos + (v if first else cutlass.Float32(0.0))
                            neg = neg + (cutlass.Float32(0.0) if first else v)
                        got = cute.arch.shuffle_sync_bfly(neg if half == 0 else pos, offset=1, mask=-1,
                                                          mask_and_clamp=31)
                        if own:
                            mPart[b, h, 2 * kb + wg, dist + p0] = part_old + (pos + got if half == 0 else
                                                                                  got + neg)
                    if cutlass.const_expr(DEFER[D]):
                        pending = cutlass.Int32(1)
                    else:
                        warpgroup.wait_group(0)
                        qd_pipe.consumer_release(rel)
                        rel.advance()
                else:
                    warpgroup.wait_group(0)
                    if pending == 1:
                        qd_pipe.consumer_release(rel)
                        rel.advance()
                    qd_pipe.consumer_release(rel)
                    rel.advance()
                    pending = cutlass.Int32(0)
                st.advance()
            warpgroup.wait_group(0)
            # LLVM takes the wait as independent of the accumulator values and would hoist the epilogue's reads of
            # them above it (ptxas then serializes every wgmma of the kernel): pin them after the wait
            self._pin(acc_dK)
            self._pin(acc_dV)
            if pending == 1:
                qd_pipe.consumer_release(rel)
                rel.advance()

            # ---------------- epilogue: dK = scale * acc, dV; staged through this warpgroup's halves of sK, sV
            for i in cutlass.range_constexpr(cute.size(acc_dK)):
                acc_dK[i] = acc_dK[i] * scale
            blk = 2 * kb + wg
            gdK = cute.local_tile(mdK[b, hk, None, None], (WN, D), (blk, 0))
            gdV = cute.local_tile(mdV[b, hk, None, None], (WN, D), (blk, 0))
            store_through_smem(kv_mma, acc_dK, sK[None, None, wg], gdK, blk * WN, LP, wtid, bar_id, dt, WN, D, True)
            store_through_smem(kv_mma, acc_dV, sV[None, None, wg], gdV, blk * WN, LP, wtid, bar_id, dt, WN, D, True)


def fake_args(key: KernelKey):
    """Fake tensors (B, H, Hkv, LP, W and Partial's sizes runtime; LP a multiple of 64) and scalars in ARGS order,
    plus the env stream."""
    dt, D = DSL_DTYPES[key.dtype], key.head_dim
    B, H, Hkv, W, NKB, WP2 = (cute.sym_int() for _ in range(6))
    LP = cute.sym_int(divisibility=ROW_MULTIPLE)
    q = fake_rows(dt, (B, H, LP, D))
    kv = fake_rows(dt, (B, Hkv, LP, D))
    vec = fake_rows(cutlass.Float32, (B, H, LP))  # 16-byte aligned: TMA
    bias, tau = fake_rows(cutlass.Float32, (H, W), 4), fake_rows(cutlass.Float32, (H,), 4)
    lens = fake_rows(cutlass.Int32, (B,), 4)
    part = fake_rows(cutlass.Float32, (B, H, NKB, WP2), 4)
    stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
    return [q, kv, kv, q, vec, vec, bias, tau, lens, kv, kv, part, cutlass.Int32(1), cutlass.Float32(1.0), stream]


def shared_bytes(key: KernelKey) -> int:
    """Dynamic shared memory of one CTA (SharedStorage): mbarriers, K and V [BN, D], STAGES Q and dO tiles [BM, D]
    (each 1024-byte aligned), the dS^T tiles in dtype (DS_SMEM), STAGES LSE and Delta vectors, the bias tables, the
    dS staging [2, WN, BM] fp32; the DSL adds 1024 bytes of static shared memory on top."""
    D, el, stages = key.head_dim, 2, STAGES[key.head_dim]
    return struct_bytes(((2 * 8, 8), (2 * stages * 8, 8), (BN * D * el, 1024), (BN * D * el, 1024),
                         (BM * D * el * stages, 1024), (BM * D * el * stages, 1024),
                         (2 * WN * BM * el if DS_SMEM[D] else 8 * el, 1024), (BM * stages * 4, 128),
                         (BM * stages * 4, 128), (4 * TABLE * 4, 16), (2 * WN * DS_STRIDE * 4, 16)))


def compile(key: KernelKey, options: str = "--enable-tvm-ffi"):
    """The compiled TVM FFI function for ``key`` (``key.kernel`` must be ``"dkdv_sm90"``)."""
    return compile_kernel(LazyAttentionDkdvSm90, KERNELS, fake_args, key, options)
