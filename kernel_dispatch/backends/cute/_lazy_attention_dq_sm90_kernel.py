"""CuTe DSL kernel: the lazy attention backward's query-major half (SPEC section 1) on Hopper's own machinery (TMA,
wgmma, warp specialisation): dQ, Delta and the dtau rows Rdiv (summed per 64-row block), in ONE sweep over the keys.

The one-sweep form (as the TileLang ``_lazy_attention_dq_delta_kernel``): for any row constant D0,
dQ_m = scale * (sum_n P (Mk dA - D0) k_n - (Delta - D0) sum_n P k_n), so one sweep accumulates per query row

    X = sum_n P (Mk dA - D0) k_n,   Y = sum_n P k_n,   Delta = sum_n P Mk dA,   R = sum_n Mk dA

and ends with dQ = scale (X - (Delta - D0) Y), Rdiv = R / i. D0 = rowsum(dO * O) (O the forward output in q's
dtype; fp32 products and sums, in the consumers' prologue); a non-finite D0 is replaced by 0 (any constant is
exact). Rows that see exactly one key (causal row 0, or lengths[b] == 1) have dS = 0 exactly: their dQ is stored as
0 (unless Delta is not finite), and their P is 1 exactly (``_tiles.one_key_row``). Per tile: 4 GEMMs (S = Q K^T,
dA = dO V^T, X += T K, Y += P K) and one exponential pass.

One CTA per (query block of BM = 128 rows, head, batch), three warpgroups (384 threads). Each CTA triggers the
dependent launch of ``dkdv_sm90`` at its start (griddepcontrol.launch_dependents), so that grid's CTAs start as
this one's last CTAs run.

- warpgroup 0, the producer: its warp 0 issues every TMA load (setmaxnreg down to 24). Q and dO once (two halves
  [WM = 64, D] each; four TMA copies completing the one barrier of the QdO pipeline), then K(0), V(0), K(1), V(1),
  ... into one ring of STAGES tiles [BN = 64, D] (the KV pipeline; a K and a V tile have the same bytes); its
  warps 1..3 zero the CTA's rows of Partial (below).
- warpgroups 1 and 2, the consumers (setmaxnreg up to 240): each owns 64 query rows. Prologue: the warpgroup's
  rows of O in 16-byte vectors from global memory (issued before the QdO wait; rows >= LP are zeros), then with
  dO's half of sdO the products of each row's 64-column vectors summed in fp32 by the row's threads (shuffles)
  into sD0, from which each thread takes the D0 of the rows it owns in the accumulator layout. Per key tile:
  turn A: S = Q K^T and dA = dO V^T (m64n64k16, both operands in shared memory), one commit group; then V's stage
  is released; registers: P, Mk, Delta/R partial sums, T = P (Mk dA - D0) and P converted to q's dtype (the
  register A operand of the next GEMMs); turn B: X += T K and Y += P K (m64nDk16, A from registers, B = K^T: the
  same K stage seen through an MN-major swizzled layout, which maps (d, n) to the byte (n, d) of the K-major one),
  then K's stage is released. With PINGPONG the two warpgroups take turns issuing (named barriers 2 and 3),
  so one warpgroup's GEMMs run while the other does its exponentials.

Registers at D = 128 per consumer thread: acc S 32 + acc dA 32 + X 64 + Y 64 fp32 (BN = 64 keeps this < 240).

Synchronisation: as ``_lazy_attention_fwd_sm90_kernel`` (its docstring): QdO pipeline (1 stage, never released);
KV pipeline (STAGES stages; empty[s] takes one arrive per consumer warp after the warpgroup's wgmma reading stage s
completed: wait_group(0) precedes every release; V stages are released before the K stage of the same tile, which
mbarriers allow: each stage has its own empty barrier); named barrier 1 (256 consumer threads): the bias table, once
after the prologue's fill of the CTA's table where it fits (``CTA_TABLE``: causal min(W, LP) <= 6912, non-causal
<= 3391), otherwise one barrier per non-free tile with two per-tile table buffers; named barriers 2, 3: ping-pong
turns (2 turns per tile per warpgroup, warpgroup 1 arrives once on barrier 2 before its first turn, warpgroup 0 syncs
once more on barrier 2 after its last); named barriers 4, 5 (the warpgroup's 128 threads): in the prologue between
the writes of its rows of sD0 and their reads (only when tiles run, a CTA-uniform condition), in the epilogue between
the warps' Rdiv sums in sRd and their sum, then the staging of dQ through the warpgroup's own half of sQ.

Partial (the dbias partials of ``dkdv_sm90``, a dependent launch of this kernel): warps 1..3 of the producer
warpgroup zero the dbias columns of the rows of the CTA's two 64-row blocks (coalesced 4-byte stores), and each
consumer warpgroup writes its block's sum of Rdiv into the row's last column in the epilogue (rows in order within a
thread, over lanes 4, 8, 16 apart by shuffles, then the four warps in order), so the launcher sums Partial once for
dbias and dtau and fills nothing; ``dkdv_sm90`` reads Partial only after this grid has ended (griddepcontrol.wait).

Rules: the launcher zero-fills rows >= lengths[b] of q, k, v, dO, O (NaN included) and rows >= L, so no shared
memory is zeroed here; rows >= LP (the block's tail past the tensors) arrive as zeros from TMA's out-of-bounds
fill and are never stored. Tiles that are not free (``_is_free``: every row and key of the 128 x 64 tile valid,
every key visible, no bias) read the bias from the shared table by distance (log2 domain); keys >= lengths[b], the
causal mask and rows >= lengths[b] are applied by selects only on those among them that cross lengths[b] or the
diagonal (with the table index clamped to the table). Rows >= lengths[b] get
dQ = 0, Delta = 0, Rdiv = 0. Deterministic: no atomics, fixed summation order.

Layout (contiguous): Q, dO, O, dQ [B, H, LP, D]; K, V [B, Hkv, LP, D] fp16/bf16; LSE, Delta [B, H, LP] fp32; Partial
[B, H, LP / 64, NC] fp32; Bias [H, W], Tau [H] fp32; Lens [B] int32. B, H, Hkv, LP, W are runtime values; D, dtype
and causal compiled in.
"""

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
from cutlass.cute.nvgpu import cpasync, warpgroup

from ._kernel_key import KernelKey
from ._tiles import (DSL_DTYPES, LOG2E, ORDER_BARRIER, WG, HopperKernel, acc_mn_view, accumulate_mma, compile_kernel,
                     fake_rows, fill_cta_table, load_row_block, grid_dims, one_key_row, quad_reduce, query_block,
                     query_grid_block, score_mmas, store_through_smem, struct_bytes, sw128_atoms, thread_roles,
                     tile_table, tma_pipeline, tma_views, turn_pass, turn_wait, vector_copy, vector_lanes)

KERNELS = ("dq_sm90",)
ARGS = {
    "dq_sm90": [
        "q fp16/bf16 [B,H,LP,D] contiguous",
        "k fp16/bf16 [B,Hkv,LP,D] contiguous",
        "v fp16/bf16 [B,Hkv,LP,D] contiguous",
        "do fp16/bf16 [B,H,LP,D] contiguous",
        "lse fp32 [B,H,LP] (natural log; rows >= L: 0)",
        "o fp16/bf16 [B,H,LP,D] contiguous (the forward output in q's dtype; D0 = rowsum(dO * O) is computed here)",
        "bias fp32 [H,W] contiguous",
        "tau fp32 [H]",
        "lengths int32 [B] (values in [0, L])",
        "dq out fp16/bf16 [B,H,LP,D]",
        "delta out fp32 [B,H,LP]",
        "partial out fp32 [B,H,LP/64,NC] (dkdv_sm90's dbias partials, columns < NC - 1, zeroed here; column NC - 1: "
        "the sum of Rdiv over each 64-row block)",
        "scale float (python scalar)",
    ]
}
ROW_MULTIPLE = 64  # the launcher pads L to LP, a multiple of this (any LP works: stores are guarded by LP)

BM = 128  # query rows per CTA (two consumer warpgroups of WM)
WM = 64  # query rows per consumer warpgroup
BN = 64  # keys per tile
STAGES = {64: 10, 128: 8}  # K/V ring depth (shared memory: Q, dO + STAGES tiles of BN x D)
NUM_THREADS = 3 * WG
PRODUCER_REGS = 24
CONSUMER_REGS = 240
TABLE = 256  # entries of one bias-by-distance table (BM + BN - 1 used)
CTA_TABLE = 7168  # entries of the CTA's table over every distance its tiles see (where they fit; shared memory)
CONSUMER_BARRIER = 1
WG_BARRIER = 4  # 4 and 5: a consumer warpgroup's own 128 threads (D0 in the prologue, dQ's staging at the end)
PINGPONG = True


class LazyAttentionDqSm90(HopperKernel):
    STAGES = STAGES

    # ------------------------------------------------------------------ host side
    @cute.jit
    def __call__(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mdO: cute.Tensor, mLSE: cute.Tensor,
                 mO: cute.Tensor, mBias: cute.Tensor, mTau: cute.Tensor, mLens: cute.Tensor, mdQ: cute.Tensor,
                 mDelta: cute.Tensor, mPart: cute.Tensor, scale: cutlass.Float32, stream):
        D = self.D
        dt = self.dtype
        # S = Q K^T and dA = dO V^T: (WM, BN), A = the Q / dO half, B = the K / V tile
        s_first, s_rest = score_mmas(dt, WM, BN)
        # X += T K, Y += P K: (WM, D), A from registers (WM x BN), B = K^T (D x BN, D contiguous)
        xy_mma = accumulate_mma(dt, WM, D)

        k_atom, mn_atom = sw128_atoms(dt)
        sQ_layout = cute.tile_to_shape(k_atom, (WM, D, 2), order=(0, 1, 2))
        sK_layout = cute.tile_to_shape(k_atom, (BN, D, self.stages), order=(0, 1, 2))
        # the same bytes as sK_layout with the two modes swapped (checked: both are
        # S<3,4,3> o ((8,8),(64,D/64)):((64,512),(1,4096)) up to the mode order)
        sKt_layout = cute.tile_to_shape(mn_atom, (D, BN, self.stages), order=(1, 0, 2))

        q_t = cute.make_tensor(mQ.iterator, cute.select(mQ.layout, mode=[2, 3, 1, 0]))
        do_t = cute.make_tensor(mdO.iterator, cute.select(mdO.layout, mode=[2, 3, 1, 0]))
        k_t = cute.make_tensor(mK.iterator, cute.select(mK.layout, mode=[2, 3, 1, 0]))
        v_t = cute.make_tensor(mV.iterator, cute.select(mV.layout, mode=[2, 3, 1, 0]))
        g2s = cpasync.CopyBulkTensorTileG2SOp()
        half_q = cute.slice_(sQ_layout, (None, None, 0))
        tile_k = cute.slice_(sK_layout, (None, None, 0))
        tma_q, tma_q_t = cpasync.make_tiled_tma_atom(g2s, q_t, half_q, (WM, D))
        tma_do, tma_do_t = cpasync.make_tiled_tma_atom(g2s, do_t, half_q, (WM, D))
        tma_k, tma_k_t = cpasync.make_tiled_tma_atom(g2s, k_t, tile_k, (BN, D))
        tma_v, tma_v_t = cpasync.make_tiled_tma_atom(g2s, v_t, tile_k, (BN, D))

        @cute.struct
        class SharedStorage:
            q_mbar: cute.struct.MemRange[cutlass.Int64, 2]
            kv_mbar: cute.struct.MemRange[cutlass.Int64, 2 * self.stages]
            sQ: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sQ_layout)], 1024]
            sdO: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sQ_layout)], 1024]
            sKV: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sK_layout)], 1024]
            sT: cute.struct.Align[cute.struct.MemRange[cutlass.Float32, max(CTA_TABLE, 2 * TABLE)], 16]
            sD0: cute.struct.Align[cute.struct.MemRange[cutlass.Float32, BM], 16]
            sRd: cute.struct.Align[cute.struct.MemRange[cutlass.Float32, 2 * WG // 32], 16]

        LP = mQ.shape[2]
        n_mblocks = (LP + BM - 1) // BM
        self.kernel(s_first, s_rest, xy_mma, tma_q, tma_q_t, tma_do, tma_do_t, tma_k, tma_k_t, tma_v, tma_v_t,
                    mLSE, mO, mBias, mTau, mLens, mdQ, mDelta, mPart, scale, sQ_layout, sK_layout, sKt_layout,
                    SharedStorage).launch(
            grid=grid_dims(n_mblocks, mQ.shape[1], mQ.shape[0]), block=[NUM_THREADS, 1, 1],
            smem=SharedStorage.size_in_bytes(), stream=stream, min_blocks_per_mp=1)

    # ------------------------------------------------------------------ helpers
    @cute.jit
    def _is_free(self, m0, n0, lb, W):
        """Every row and key of the tile [m0, m0 + BM) x [n0, n0 + BN) is below lengths[b], every key is visible to
        every row and no entry is biased."""
        dlo = m0 - n0 - (BN - 1)  # smallest distance m - n in the tile
        free = m0 + BM <= lb and n0 + BN <= lb and dlo >= W
        if cutlass.const_expr(not self.causal):
            free = m0 + BM <= lb and n0 + BN <= lb and (dlo >= W or dlo + (BM + BN - 2) <= -W)
        return free

    @cute.jit
    def _tile_rows(self, acc_S_mn, acc_dA_mn, tScS_mn, tbl, span, m0, n0, lb, sc2, lse2, thr, d0, r_acc, d_acc,
                   biased: cutlass.Constexpr, masked: cutlass.Constexpr):
        """P, Mk, the row sums R and Delta, and T = P (Mk dA - D0) of one tile, in place (acc_S <- P, acc_dA <- T).
        ``biased``: bias from the table ``tbl``; ``masked``: rows and keys past lengths[b], the causal mask and the
        one-key rows by selects, the table index clamped to ``span`` (such a tile can see distances past the CTA's
        table)."""
        for r in cutlass.range_constexpr(cute.size(acc_S_mn.shape[0])):
            mr = tScS_mn[r, 0][0]
            m = m0 + mr
            row_ok = m < lb
            one = one_key_row(m, lb, self.causal)
            rs = cutlass.Float32(0.0)
            ds_ = cutlass.Float32(0.0)
            for c in cutlass.range_constexpr(cute.size(acc_S_mn.shape[1])):
                nc = tScS_mn[0, c][1]
                sv = acc_S_mn[r, c] * sc2 - lse2[r]
                if cutlass.const_expr(biased and masked):
                    sv = acc_S_mn[r, c] * sc2 + tbl[cutlass.min(cutlass.max(mr - nc + (BN - 1), span.lo), span.hi)] \
                        - lse2[r]
                elif cutlass.const_expr(biased):
                    sv = acc_S_mn[r, c] * sc2 + tbl[mr - nc + (BN - 1)] - lse2[r]
                p = cute.math.exp2(sv, fastmath=True)
                if cutlass.const_expr(masked):
                    n = n0 + nc
                    vis = row_ok and n < lb
                    if cutlass.const_expr(self.causal):
                        vis = vis and n <= m
                    p = p if vis else cutlass.Float32(0.0)
                    p = cutlass.Float32(1.0) if (vis and one) else p
                    keep = vis and (p + thr[r] > 0.0)
                else:
                    keep = p + thr[r] > 0.0
                dp = acc_dA_mn[r, c] if keep else cutlass.Float32(0.0)
                rs = rs + dp
                ds_ = ds_ + p * dp
                acc_dA_mn[r, c] = p * (dp - d0[r])  # T
                acc_S_mn[r, c] = p
            r_acc[r] = r_acc[r] + rs
            d_acc[r] = d_acc[r] + ds_

    @cute.kernel
    def kernel(self, s_first: cute.TiledMma, s_rest: cute.TiledMma, xy_mma: cute.TiledMma,
               tma_q: cute.CopyAtom, tma_q_t: cute.Tensor, tma_do: cute.CopyAtom, tma_do_t: cute.Tensor,
               tma_k: cute.CopyAtom, tma_k_t: cute.Tensor, tma_v: cute.CopyAtom, tma_v_t: cute.Tensor,
               mLSE: cute.Tensor, mO: cute.Tensor, mBias: cute.Tensor, mTau: cute.Tensor, mLens: cute.Tensor,
               mdQ: cute.Tensor, mDelta: cute.Tensor, mPart: cute.Tensor, scale: cutlass.Float32,
               sQ_layout: cute.ComposedLayout, sK_layout: cute.ComposedLayout, sKt_layout: cute.ComposedLayout,
               SharedStorage: cutlass.Constexpr):
        D = self.D
        dt = self.dtype
        tidx, warp_idx, wg_idx = thread_roles()
        cute.arch.griddepcontrol_launch_dependents()  # dkdv_sm90's CTAs may start as this grid's last ones run
        LP = mdQ.shape[2]
        H = mdQ.shape[1]
        bx, h, b, hk = query_grid_block(H, tma_k_t.shape[2])
        W = mBias.shape[1]
        mb, m0, lb, n_blocks = query_block(bx, LP, mLens[b], BM, BN, self.causal)
        if m0 >= lb:
            n_blocks = 0

        smem = cutlass.memory.SmemAllocator()
        storage = smem.allocate(SharedStorage)
        sQ = storage.sQ.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)
        sdO = storage.sdO.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)
        sK = storage.sKV.get_tensor(sK_layout.outer, swizzle=sK_layout.inner)
        sKt = cute.make_tensor(cute.recast_ptr(sK.iterator, sKt_layout.inner), sKt_layout.outer)
        sT = storage.sT.get_tensor(cute.make_layout(max(CTA_TABLE, 2 * TABLE)))
        sD0 = storage.sD0.get_tensor(cute.make_layout(BM))
        sRd = storage.sRd.get_tensor(cute.make_layout(2 * WG // 32))

        q_pipe = tma_pipeline(storage.q_mbar.data_ptr(), 1, 2 * BM * D * dt.width // 8)
        kv_pipe = tma_pipeline(storage.kv_mbar.data_ptr(), self.stages, BN * D * dt.width // 8)

        gQ = cute.local_tile(tma_q_t[None, None, h, b], (WM, D), (None, 0))
        gdO = cute.local_tile(tma_do_t[None, None, h, b], (WM, D), (None, 0))
        gK = cute.local_tile(tma_k_t[None, None, hk, b], (BN, D), (None, 0))
        gV = cute.local_tile(tma_v_t[None, None, hk, b], (BN, D), (None, 0))
        tQsQ, tQgQ = tma_views(tma_q, sQ, gQ)
        tdOsdO, tdOgdO = tma_views(tma_do, sdO, gdO)
        tKsK, tKgK = tma_views(tma_k, sK, gK)
        tVsV, tVgV = tma_views(tma_v, sK, gV)

        if wg_idx == 0:
            # ============================ producer warpgroup: warp 0 issues the TMA loads
            cute.arch.warpgroup_reg_dealloc(PRODUCER_REGS)
            if warp_idx == 0:
                cpasync.prefetch_descriptor(tma_q)
                cpasync.prefetch_descriptor(tma_do)
                cpasync.prefetch_descriptor(tma_k)
                cpasync.prefetch_descriptor(tma_v)
                if n_blocks > 0:
                    load_row_block(q_pipe, [(tma_q, tQgQ, tQsQ), (tma_do, tdOgdO, tdOsdO)], 2 * mb, 2)
                kv_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.stages)
                for nb in cutlass.range(n_blocks, unroll=1):
                    kv_pipe.producer_acquire(kv_state)
                    cute.copy(tma_k, tKgK[None, nb], tKsK[None, kv_state.index],
                              tma_bar_ptr=kv_pipe.producer_get_barrier(kv_state))
                    kv_state.advance()
                    kv_pipe.producer_acquire(kv_state)
                    cute.copy(tma_v, tVgV[None, nb], tVsV[None, kv_state.index],
                              tma_bar_ptr=kv_pipe.producer_get_barrier(kv_state))
                    kv_state.advance()
            else:
                # warps 1..3: the dbias columns of the CTA's two 64-row blocks of Partial zeroed for dkdv_sm90 (a
                # dependent launch, which reads them after this grid has ended)
                for half in cutlass.range_constexpr(2):
                    if m0 + WM * half < LP:
                        for c in cutlass.range(tidx - 32, mPart.shape[3] - 1, WG - 32, unroll=1):
                            mPart[b, h, 2 * mb + half, c] = cutlass.Float32(0.0)
        else:
            # ============================ consumer warpgroups 1, 2: 64 query rows each
            cute.arch.warpgroup_reg_alloc(CONSUMER_REGS)
            s_first.set(warpgroup.Field.ACCUMULATE, False)
            s_rest.set(warpgroup.Field.ACCUMULATE, True)
            xy_mma.set(warpgroup.Field.ACCUMULATE, True)  # X and Y start from zeros
            ctid = tidx - WG
            wg = wg_idx - 1
            wtid = tidx % WG
            sc2 = scale * LOG2E
            tau = mTau[h]

            thr_s = s_first.get_slice(wtid)
            thr_xy = xy_mma.get_slice(wtid)
            tSrQ = thr_s.make_fragment_A(thr_s.partition_A(sQ[None, None, wg]))
            tSrdO = thr_s.make_fragment_A(thr_s.partition_A(sdO[None, None, wg]))
            tSrK = thr_s.make_fragment_B(thr_s.partition_B(sK))  # (MMA, MMA_N, MMA_K, STAGES); V stages too
            tXrKt = thr_xy.make_fragment_B(thr_xy.partition_B(sKt))
            acc_S = thr_s.make_fragment_C(thr_s.partition_shape_C((WM, BN)))
            acc_dA = thr_s.make_fragment_C(thr_s.partition_shape_C((WM, BN)))
            acc_X = thr_xy.make_fragment_C(thr_xy.partition_shape_C((WM, D)))
            acc_Y = thr_xy.make_fragment_C(thr_xy.partition_shape_C((WM, D)))
            acc_X.fill(0.0)
            acc_Y.fill(0.0)
            # register A operands of X += T K and Y += P K: same register order as an (WM, BN) accumulator
            tXrT = cute.make_rmem_tensor(thr_xy.partition_shape_A((WM, BN)), dt)
            tXrP = cute.make_rmem_tensor(thr_xy.partition_shape_A((WM, BN)), dt)
            tXrT_as_S = cute.make_tensor(tXrT.iterator, acc_S.layout)
            tXrP_as_S = cute.make_tensor(tXrP.iterator, acc_S.layout)

            cS = cute.local_tile(cute.make_identity_tensor((BM, BN)), (WM, BN), (wg, 0))
            tScS_mn = acc_mn_view(thr_s.partition_C(cS))
            acc_S_mn = acc_mn_view(acc_S)
            acc_dA_mn = acc_mn_view(acc_dA)
            n_rows = cute.size(acc_S_mn.shape[0])

            lse2 = cute.make_rmem_tensor((n_rows,), cutlass.Float32)
            thr = cute.make_rmem_tensor((n_rows,), cutlass.Float32)
            d0 = cute.make_rmem_tensor((n_rows,), cutlass.Float32)
            r_acc = cute.make_rmem_tensor((n_rows,), cutlass.Float32)
            d_acc = cute.make_rmem_tensor((n_rows,), cutlass.Float32)
            # this warpgroup's rows of O for D0, loaded before the wait for dO (rows >= LP: zeros, as TMA fills dO)
            ocopy = vector_copy(dt)
            thr_o = ocopy.get_slice(wtid)
            tOgO = thr_o.partition_S(cute.local_tile(mO[b, h, None, None], (WM, D), (2 * mb + wg, 0)))
            tOcO = thr_o.partition_S(cute.make_identity_tensor((WM, D)))
            tOrO = cute.make_fragment_like(tOgO, dt)
            tOrO.fill(0.0)
            if n_blocks > 0:
                for i in cutlass.range_constexpr(cute.size(tOgO.shape[1])):
                    if m0 + WM * wg + tOcO[0, i, 0][0] < LP:
                        cute.copy(ocopy, tOgO[None, i, None], tOrO[None, i, None])
            for r in cutlass.range_constexpr(n_rows):
                m = m0 + tScS_mn[r, 0][0]
                lv = cutlass.Float32(0.0)
                if m < LP:
                    lv = mLSE[b, h, m]
                lse2[r] = lv * LOG2E
                d0[r] = 0.0
                ii = cutlass.Float32(cutlass.max(lb, 1))
                if cutlass.const_expr(self.causal):
                    ii = cutlass.Float32(m + 1)
                thr[r] = tau / ii
                r_acc[r] = 0.0
                d_acc[r] = 0.0

            # the CTA's bias table, filled while the TMA of Q and dO is in flight (W too large for it: per-tile
            # tables)
            cta = fill_cta_table(sT, ctid, 2 * WG, W, LP, mBias, h, BM, BN, self.causal, CTA_TABLE)
            if n_blocks > 0:
                q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, 1)
                q_pipe.consumer_wait(q_state)
                # D0 = rowsum(dO * O) of this warpgroup's 64 rows: fp32 products of a row's 64-column vectors, summed
                # over the row's lanes, through sD0 to the threads owning the row in the accumulator layout
                tOrdO = cute.make_fragment_like(tOrO, dt)
                cute.copy(ocopy, thr_o.partition_S(sdO[None, None, wg]), tOrdO)
                lanes = vector_lanes(dt)
                for i in cutlass.range_constexpr(cute.size(tOrO.shape[1])):
                    part = cutlass.Float32(0.0)
                    for j in cutlass.range_constexpr(cute.size(tOrO.shape[2])):
                        for e in cutlass.range_constexpr(cute.size(tOrO.shape[0])):
                            part = part + cutlass.Float32(tOrO[e, i, j]) * cutlass.Float32(tOrdO[e, i, j])
                    for k in cutlass.range_constexpr(lanes.bit_length() - 1):
                        part = part + cute.arch.shuffle_sync_bfly(part, offset=lanes >> (k + 1), mask=-1,
                                                                  mask_and_clamp=31)
                    if wtid % lanes == 0:
                        sD0[WM * wg + tOcO[0, i, 0][0]] = part
                cute.arch.barrier(barrier_id=WG_BARRIER + wg, number_of_threads=WG)
                for r in cutlass.range_constexpr(n_rows):
                    dv = sD0[tScS_mn[r, 0][0]]
                    d0[r] = dv if (dv - dv) == 0.0 else cutlass.Float32(0.0)  # finite, else any constant (0)
            if cta.whole:  # the table is read only after this
                cute.arch.barrier(barrier_id=CONSUMER_BARRIER, number_of_threads=2 * WG)
            kv_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
            fills = cutlass.Int32(0)
            if cutlass.const_expr(PINGPONG):
                if wg == 1:
                    cute.arch.barrier_arrive(barrier_id=ORDER_BARRIER, number_of_threads=2 * WG)

            for nb in cutlass.range(n_blocks, unroll=1):
                n0 = nb * BN
                free = self._is_free(m0, n0, lb, W)
                tbl, span, fills = tile_table(sT, cta, fills, not free, ctid, m0, n0, W, mBias, h, BM, BN, TABLE,
                                              self.causal, CONSUMER_BARRIER, 2 * WG)
                masked = not (m0 + BM <= lb and n0 + BN <= lb)  # (rows or keys past lengths[b]; causal: the diagonal)
                if cutlass.const_expr(self.causal):
                    masked = masked or n0 + BN - 1 > m0
                # ---- turn A: S = Q K^T, dA = dO V^T
                k_state = kv_state.clone()
                kv_pipe.consumer_wait(kv_state)  # K(nb)
                kv_state.advance()
                kv_pipe.consumer_wait(kv_state)  # V(nb)
                kst = k_state.index
                vst = kv_state.index
                warpgroup.fence()
                turn_wait(wg, PINGPONG)
                for k in cutlass.range_constexpr(cute.size(tSrQ.shape[2])):
                    cute.gemm(s_first if k == 0 else s_rest, acc_S, tSrQ[None, None, k], tSrK[None, None, k, kst],
                              acc_S)
                for k in cutlass.range_constexpr(cute.size(tSrdO.shape[2])):
                    cute.gemm(s_first if k == 0 else s_rest, acc_dA, tSrdO[None, None, k],
                              tSrK[None, None, k, vst], acc_dA)
                warpgroup.commit_group()
                turn_pass(wg, PINGPONG)
                warpgroup.wait_group(0)
                kv_pipe.consumer_release(kv_state)  # V's stage
                kv_state.advance()

                # ---- P, Mk, row sums, T = P (Mk dA - D0)
                if free:
                    self._tile_rows(acc_S_mn, acc_dA_mn, tScS_mn, tbl, span, m0, n0, lb, sc2, lse2, thr, d0, r_acc,
                                    d_acc, False, False)
                elif not masked:
                    self._tile_rows(acc_S_mn, acc_dA_mn, tScS_mn, tbl, span, m0, n0, lb, sc2, lse2, thr, d0, r_acc,
                                    d_acc, True, False)
                else:
                    self._tile_rows(acc_S_mn, acc_dA_mn, tScS_mn, tbl, span, m0, n0, lb, sc2, lse2, thr, d0, r_acc,
                                    d_acc, True, True)

                tXrT_as_S.store(acc_dA.load().to(dt))
                tXrP_as_S.store(acc_S.load().to(dt))

                # ---- turn B: X += T K, Y += P K (B = K^T from K's stage)
                warpgroup.fence()
                turn_wait(wg, PINGPONG)
                for k in cutlass.range_constexpr(cute.size(tXrT.shape[2])):
                    cute.gemm(xy_mma, acc_X, tXrT[None, None, k], tXrKt[None, None, k, kst], acc_X)
                for k in cutlass.range_constexpr(cute.size(tXrP.shape[2])):
                    cute.gemm(xy_mma, acc_Y, tXrP[None, None, k], tXrKt[None, None, k, kst], acc_Y)
                warpgroup.commit_group()
                turn_pass(wg, PINGPONG)
                warpgroup.wait_group(0)
                kv_pipe.consumer_release(k_state)  # K's stage

            if cutlass.const_expr(PINGPONG):
                if wg == 0:
                    cute.arch.barrier(barrier_id=ORDER_BARRIER, number_of_threads=2 * WG)

            # ---------------- epilogue
            cX = cute.local_tile(cute.make_identity_tensor((BM, D)), (WM, D), (wg, 0))
            tXcX_mn = acc_mn_view(thr_xy.partition_C(cX))
            acc_X_mn = acc_mn_view(acc_X)
            acc_Y_mn = acc_mn_view(acc_Y)
            lane = tidx % 4
            rd_blk = cutlass.Float32(0.0)  # this thread's rows of Rdiv, summed
            for r in cutlass.range_constexpr(n_rows):
                rsum = quad_reduce(r_acc[r], lambda x, y: x + y)
                dsum = quad_reduce(d_acc[r], lambda x, y: x + y)
                m = m0 + tXcX_mn[r, 0][0]
                ii = cutlass.Float32(cutlass.max(lb, 1))
                if cutlass.const_expr(self.causal):
                    ii = cutlass.Float32(m + 1)
                if m < LP:
                    rd_blk = rd_blk + rsum / ii
                    if lane == 0:
                        mDelta[b, h, m] = dsum
                one = one_key_row(m, lb, self.causal)
                zero = m >= lb or (one and (dsum - dsum) == 0.0)
                corr = dsum - d0[r]
                for c in cutlass.range_constexpr(cute.size(acc_X_mn.shape[1])):
                    val = (acc_X_mn[r, c] - corr * acc_Y_mn[r, c]) * scale
                    acc_X_mn[r, c] = cutlass.Float32(0.0) if zero else val
            # the block's Rdiv sum (the dtau term) into Partial's last column: over the warp's 8 quads (each quad's
            # lanes hold the same rows), then its 4 warps in order
            for k in cutlass.range_constexpr(3):
                rd_blk = rd_blk + cute.arch.shuffle_sync_bfly(rd_blk, offset=4 << k, mask=-1, mask_and_clamp=31)
            if wtid % 32 == 0:
                sRd[4 * wg + wtid // 32] = rd_blk
            cute.arch.barrier(barrier_id=WG_BARRIER + wg, number_of_threads=WG)
            if wtid == 0 and m0 + WM * wg < LP:
                rd_blk = sRd[4 * wg] + sRd[4 * wg + 1] + sRd[4 * wg + 2] + sRd[4 * wg + 3]
                mPart[b, h, 2 * mb + wg, mPart.shape[3] - 1] = rd_blk
            # staged through this warpgroup's own half of sQ (its last wgmma reading it completed; when no tile
            # runs, the half is never loaded and nothing reads it)
            gO = cute.local_tile(mdQ[b, h, None, None], (WM, D), (2 * mb + wg, 0))
            store_through_smem(xy_mma, acc_X, sQ[None, None, wg], gO, m0 + WM * wg, LP, wtid, WG_BARRIER + wg, dt,
                               WM, D, False)

def fake_args(key: KernelKey):
    """Fake tensors (B, H, Hkv, LP, W runtime) and scalars in ARGS order, plus the env stream."""
    dt, D = DSL_DTYPES[key.dtype], key.head_dim
    B, H, Hkv, LP, W = (cute.sym_int() for _ in range(5))
    q = fake_rows(dt, (B, H, LP, D))
    kv = fake_rows(dt, (B, Hkv, LP, D))
    vec = fake_rows(cutlass.Float32, (B, H, LP), 4)
    part = fake_rows(cutlass.Float32, (B, H, cute.sym_int(), cute.sym_int()), 4)
    bias, tau = fake_rows(cutlass.Float32, (H, W), 4), fake_rows(cutlass.Float32, (H,), 4)
    lens = fake_rows(cutlass.Int32, (B,), 4)
    stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
    return [q, kv, kv, q, vec, q, bias, tau, lens, q, vec, part, cutlass.Float32(1.0), stream]


def shared_bytes(key: KernelKey) -> int:
    """Dynamic shared memory of one CTA (SharedStorage): mbarriers, Q and dO [BM, D], STAGES tiles [BN, D] (each
    1024-byte aligned), the fp32 bias table of CTA_TABLE entries, D0 of the BM rows and the warps' Rdiv sums (fp32)."""
    D, el, stages = key.head_dim, 2, STAGES[key.head_dim]
    return struct_bytes(((2 * 8, 8), (2 * stages * 8, 8), (BM * D * el, 1024), (BM * D * el, 1024),
                         (BN * D * el * stages, 1024), (max(CTA_TABLE, 2 * TABLE) * 4, 16),
                         (BM * 4, 16), (2 * WG // 32 * 4, 16)))


def compile(key: KernelKey, options: str = "--enable-tvm-ffi"):
    """The compiled TVM FFI function for ``key`` (``key.kernel`` must be ``"dq_sm90"``)."""
    return compile_kernel(LazyAttentionDqSm90, KERNELS, fake_args, key, options)
