"""CuTe DSL kernel, a measurement candidate not yet run on a GPU and not shipped: the lazy attention forward (SPEC
section 1) in one persistent kernel, ``fused_fwd_sm90``, whose LSE warpgroup computes the row LSE of the CTA's next
tile while ``fwd_sm90``'s two consumer warpgroups compute O of the current one from the LSE handed over in shared
memory. ``lse_sm90``'s exponential stream is as long as its GEMMs; here the SM's exponentials are 2/3 of its GEMM time
(docs/cute-backend.md, "Next" 1). Outputs (O, LSE) are meant to be bitwise those of ``lse_sm90`` then ``fwd_sm90``.

One CTA per SM (four warpgroups, 512 threads) takes tiles (query block of BM = 128 rows, head, batch) in grid order,
rotated so that each CTA's first tile, whose O waits for an LSE no tile ran ahead of, is one of the shortest
(``SHORT_FIRST``):

- warpgroup 0 (setmaxnreg down to 24): warp 1 claims the tiles (its CTA index, then gridDim.x + a ticket from the
  call's zeroed counter), publishes each index on the tile pipe and issues the LSE warpgroup's loads: Q into sQl as
  two halves [64, D], the key tiles [BN, D] into the LSE ring (``ring_stages``). Warp 0 takes each index from the
  tile pipe and issues the O warpgroups' loads as ``fwd_sm90``'s producer does (Q into sQ, K / V into the KV ring).
  Warps 2 and 3 fill each tile's bias table (``_tiles.fill_tables_ahead``).
- warpgroups 1 and 2 (setmaxnreg up to 192): ``fwd_sm90``'s consumers (``LazyAttentionFwdSm90._forward_tiles``), the
  LSE of each tile's rows from the LSE pipe instead of global memory.
- warpgroup 3, the LSE warpgroup (setmaxnreg down to 104): per tile, both 64-row halves of Q against every key tile
  (one m64n128 score GEMM per half, waited, then folded into the half's online row max and sum as ``lse_sm90``'s
  consumers do), then each row's LSE to global memory (the backward's residual) and to the LSE pipe.

Synchronisation (``fwd_sm90``'s docstring gives the O warpgroups' own rules: Q and KV pipelines, turns, barrier 1):
- Tile pipe (2 slots): the index from warp 1's elected lane to the 480 readers (both O warpgroups, the LSE warpgroup,
  warp 0, the two filler warps). Warp 1 publishes tile t + 2 once every reader has taken tile t, i.e. once the O
  warpgroups start tile t. The LSE warpgroup may then take tile t + 2, but waits for its table, which the fillers
  write only after the O warpgroups released tile t's: it computes at most one tile ahead of them. The first tile's
  O waits for its LSE.
- LSE pipe (mbarriers, PipelineAsync, 2 stages of sL [BM] fp32): the 128 LSE threads acquire a stage (the O
  warpgroups have read the tile two back), store their rows' LSE as ``lse_sm90`` stores it and commit; the 256 O
  threads wait, read their rows and release.
- Table pipe (2 stages by tile parity, filled by the 64 filler threads, read by the 384 consumer threads): the LSE
  warpgroup waits on a tile's table before its first key tile (its per-tile tables, where W is too large for the
  CTA's, are then never written while the O warpgroups read the same half); the O warpgroups wait before their first
  non-free key tile. Both release after the tile.
- Q pipelines (1 stage each: sQ for the O warpgroups, 8 consumer warps; sQl for the LSE warpgroup, 4) and the KV and
  LSE rings (PipelineTmaAsync; one arrive per consumer warp after the GEMM reading a stage completed).
- Named barrier 4 (the LSE warpgroup's 128 threads): after zeroing rows of sQl at positions >= lengths[b], and its
  per-tile bias tables. Barriers 1-3 are the O warpgroups' (``fwd_sm90``).

Layout and arguments as ``fwd_sm90``'s, the LSE [B, H, L] fp32 written (natural log). B, H, Hkv, L, W are runtime
values; D, dtype and causal are compiled in.
"""

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
from cutlass.cute.nvgpu import cpasync, warpgroup

from . import _lazy_attention_fwd_sm90_kernel as fwd_module
from ._kernel_key import KernelKey
from ._lazy_attention_lse_sm90_kernel import LazyAttentionLseSm90
from ._tiles import (LOG2E, SCHEDULE_STAGES, WG, acc_mn_view, accumulate_mma, claim_next_tile, compile_kernel,
                     cta_table_extent, fill_tables_ahead, keys_free, load_row_block, persistent_dims, persistent_grid,
                     publish_tile, quad_reduce, query_block, receive_tile, schedule_pipe, score_mmas, start_producer,
                     struct_bytes, sw128_atoms, table_pipe, thread_roles, tile_class, tile_coords, tile_table,
                     tma_pipeline, tma_views)

KERNELS = ("fused_fwd_sm90",)
ARGS = {"fused_fwd_sm90": [a.replace("(read: lse_sm90's, natural log)", "(written, natural log)")
                           for a in fwd_module.ARGS["fwd_sm90"]]}

BM, WM, BN = fwd_module.BM, fwd_module.WM, fwd_module.BN
# ring depths per head dim (shared memory: two Q blocks, both rings, the table); module attributes, so that
# scripts/build_cute_variants.py can set them
KV_STAGES_64, KV_STAGES_128 = 6, 3  # the O warpgroups' K / V ring
LSE_STAGES_64, LSE_STAGES_128 = 4, 1  # the LSE warpgroup's K ring
PRODUCER_REGS, O_REGS, LSE_REGS = 24, 192, 104  # 24 + 2 x 192 + 104 = 512 per thread slot of four warpgroups
FILLERS = 2 * 32  # warps 2 and 3
TABLE = fwd_module.TABLE
CTA_TABLE = fwd_module.CTA_TABLE
LSE_BARRIER = 4  # named barrier of the LSE warpgroup's 128 threads
# measurement switches (wrong results, timing only): "no_tiles" here makes the LSE warpgroup (and warp 1's loads for
# it) take no key tile; fwd_sm90's ABLATE = "no_tiles" does the same for the O warpgroups and warp 0. Each alone
# times the other side of the kernel.
LSE_ABLATE = ""
# each CTA's first tile one of the shortest (``_tiles.tile_coords``): the first tile's O waits for its LSE, computed
# by the LSE warpgroup alone, which for one of the longest causal blocks (32 key tiles at L = 4096) would idle the O
# warpgroups for a few percent of the kernel
SHORT_FIRST = True


def ring_stages(head_dim: int) -> tuple[int, int]:
    """(K / V ring, LSE K ring) depths at ``head_dim``."""
    return {64: (KV_STAGES_64, LSE_STAGES_64), 128: (KV_STAGES_128, LSE_STAGES_128)}[head_dim]


class LazyAttentionFusedFwdSm90(LazyAttentionLseSm90):
    def __init__(self, head_dim: int, dtype, causal: bool):
        self.D, self.dtype, self.causal = head_dim, dtype, causal
        self.stages, self.lse_stages = ring_stages(head_dim)

    @cute.jit
    def __call__(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mBias: cute.Tensor, mTau: cute.Tensor,
                 mLens: cute.Tensor, mLSE: cute.Tensor, mO: cute.Tensor, mCounter: cute.Tensor, ctas: cutlass.Int32,
                 scale: cutlass.Float32, stream):
        D = self.D
        dt = self.dtype
        qk_mma, qk_rest = score_mmas(dt, WM, BN)
        lse_mma, lse_rest = score_mmas(dt, WM, BN)  # the LSE warpgroup's own (an MMA's ACCUMULATE field is per branch)
        pv_mma = accumulate_mma(dt, WM, D)
        sQ_layout, sK_layout, sV_layout, tma_q, tma_q_t, tma_k, tma_k_t, tma_v, tma_v_t = self._qkv_loads(mQ, mK, mV)
        sKl_layout = cute.tile_to_shape(sw128_atoms(dt)[0], (BN, D, self.lse_stages), order=(0, 1, 2))

        @cute.struct
        class SharedStorage:
            tile_mbar: cute.struct.MemRange[cutlass.Int64, 2 * SCHEDULE_STAGES]
            tile: cute.struct.MemRange[cutlass.Int32, SCHEDULE_STAGES]
            table_mbar: cute.struct.MemRange[cutlass.Int64, 4]
            lse_mbar: cute.struct.MemRange[cutlass.Int64, 4]
            q_mbar: cute.struct.MemRange[cutlass.Int64, 2]
            ql_mbar: cute.struct.MemRange[cutlass.Int64, 2]
            kv_mbar: cute.struct.MemRange[cutlass.Int64, 2 * self.stages]
            kl_mbar: cute.struct.MemRange[cutlass.Int64, 2 * self.lse_stages]
            sL: cute.struct.Align[cute.struct.MemRange[cutlass.Float32, 2 * BM], 16]
            sQ: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sQ_layout)], 1024]
            sQl: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sQ_layout)], 1024]
            sKV: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sK_layout)], 1024]
            sKl: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sKl_layout)], 1024]
            sT: cute.struct.Align[cute.struct.MemRange[cutlass.Float32, max(CTA_TABLE, 2 * TABLE)], 16]

        L = mQ.shape[2]
        self.kernel(qk_mma, qk_rest, lse_mma, lse_rest, pv_mma, tma_q, tma_q_t, tma_k, tma_k_t, tma_v, tma_v_t, mBias,
                    mTau, mLens, mLSE, mO, mCounter, scale, sQ_layout, sK_layout, sV_layout, sKl_layout,
                    SharedStorage).launch(
            grid=persistent_grid(ctas, (L + BM - 1) // BM, mQ.shape[1], mQ.shape[0]), block=[4 * WG, 1, 1],
            smem=SharedStorage.size_in_bytes(), stream=stream, min_blocks_per_mp=1)

    @cute.jit
    def _fold_half(self, acc_mn, wm0, span, tScS_mn, tbl, m0, n0, lb, W, sc2, row_max, row_sum):
        """Fold a score tile of the 64 rows from wm0 into their running max and sum: ``lse_sm90``'s fold, with the
        tile class (free, masked) of those rows."""
        free, masked = tile_class(wm0, n0, lb, W, WM, BN, self.causal)
        self._sweep1_rows(acc_mn, free, masked, span, tScS_mn, tbl, m0, n0, lb, sc2, row_max, row_sum)

    @cute.jit
    def _lse_tiles(self, qk_mma: cute.TiledMma, qk_rest: cute.TiledMma, sQl, sKl, sT, sL, sTile, tile_pipe, tbl_pipe,
                   ql_pipe, kl_pipe, lse_pipe, mBias, mLens, mLSE, scale, tidx, H, Hkv, L, W, n_mblocks, total):
        """The LSE warpgroup: every tile's row LSE, both 64-row halves of Q against each key tile (the fold of
        ``lse_sm90``'s consumers), to ``mLSE`` and the LSE pipe."""
        dt = self.dtype
        qk_mma.set(warpgroup.Field.ACCUMULATE, False)
        qk_rest.set(warpgroup.Field.ACCUMULATE, True)
        wtid = tidx % WG
        sc2 = scale * LOG2E
        thr_qk = qk_mma.get_slice(wtid)
        tSrQ = [thr_qk.make_fragment_A(thr_qk.partition_A(sQl[None, None, half])) for half in range(2)]
        tSrK = thr_qk.make_fragment_B(thr_qk.partition_B(sKl))
        acc_S = thr_qk.make_fragment_C(thr_qk.partition_shape_C((WM, BN)))
        acc_S_mn = acc_mn_view(acc_S)
        tScS_mn = [acc_mn_view(thr_qk.partition_C(cute.local_tile(cute.make_identity_tensor((BM, BN)), (WM, BN),
                                                                  (half, 0)))) for half in range(2)]
        n_rows = cute.size(acc_S_mn.shape[0])
        row_max = [cute.make_rmem_tensor((n_rows,), cutlass.Float32) for _ in range(2)]
        row_sum = [cute.make_rmem_tensor((n_rows,), cutlass.Float32) for _ in range(2)]

        tile_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, SCHEDULE_STAGES)
        ql_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, 1)
        kl_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.lse_stages)
        tbl_read = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, 2)
        lse_fill = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, 2)
        fills = cutlass.Int32(0)
        tile = receive_tile(tile_pipe, tile_state, sTile)
        tile_state.advance()
        while tile < total:
            bx, h, b, hk = tile_coords(tile, H, Hkv, n_mblocks, total, SHORT_FIRST)
            mb, m0, lb, n_blocks = query_block(bx, L, mLens[b], BM, BN, self.causal)
            if cutlass.const_expr("no_tiles" in LSE_ABLATE.split("+")):
                n_blocks = 0
            for half in cutlass.range_constexpr(2):
                row_max[half].fill(-cutlass.Float32.inf)
                row_sum[half].fill(0.0)
            sTk = cute.make_tensor(sT.iterator + tbl_read.index * (CTA_TABLE // 2), cute.make_layout(CTA_TABLE // 2))
            cta = cta_table_extent(W, L, BM, BN, self.causal, CTA_TABLE // 2)
            tbl_pipe.consumer_wait(tbl_read)  # before any per-tile table goes into this half
            ql_pipe.consumer_wait(ql_state)
            if m0 + BM > lb and lb < L:  # rows at positions >= lengths[b] compute with q = 0
                for i in cutlass.range(wtid, BM * self.D, WG, unroll=1):
                    r = i // self.D
                    if m0 + r >= lb:
                        sQl[r % WM, i - r * self.D, r // WM] = dt(0.0)
                cute.arch.fence_proxy("async.shared", space="cta")
                cute.arch.barrier(barrier_id=LSE_BARRIER, number_of_threads=WG)
            if n_blocks == 0:
                ql_pipe.consumer_release(ql_state)
            for nb in cutlass.range(n_blocks, unroll=1):
                n0 = nb * BN
                tbl, span, fills = tile_table(sTk, cta, fills, not keys_free(m0, n0, lb, W, BM, BN, self.causal),
                                              wtid, m0, n0, W, mBias, h, BM, BN, TABLE, self.causal, LSE_BARRIER, WG)
                kl_pipe.consumer_wait(kl_state)
                for half in cutlass.range_constexpr(2):
                    seen = True
                    if cutlass.const_expr(self.causal):
                        seen = n0 <= m0 + WM * half + WM - 1
                    if seen:
                        warpgroup.fence()
                        self._gemm_s(qk_mma, qk_rest, acc_S, tSrQ[half], tSrK, kl_state.index)
                        warpgroup.commit_group()
                        warpgroup.wait_group(0)
                    if cutlass.const_expr(half == 1):
                        kl_pipe.consumer_release(kl_state)
                        if nb == n_blocks - 1:
                            ql_pipe.consumer_release(ql_state)
                    if seen:
                        self._fold_half(acc_S_mn, m0 + WM * half, span, tScS_mn[half], tbl, m0, n0, lb, W, sc2,
                                        row_max[half], row_sum[half])
                kl_state.advance()
            ql_state.advance()
            tbl_pipe.consumer_release(tbl_read)
            tbl_read.advance()

            lse_pipe.producer_acquire(lse_fill)
            lane = tidx % 4
            for half in cutlass.range_constexpr(2):
                for r in cutlass.range_constexpr(n_rows):
                    s = quad_reduce(row_sum[half][r], lambda x, y: x + y)
                    lse = self._lse_to_store(row_max[half][r] + cute.math.log2(s, fastmath=False))
                    row = tScS_mn[half][r, 0][0]
                    if lane == 0:
                        sL[lse_fill.index * BM + row] = lse
                        if m0 + row < L:
                            mLSE[b, h, m0 + row] = lse
            lse_pipe.producer_commit(lse_fill)
            lse_fill.advance()
            tile = receive_tile(tile_pipe, tile_state, sTile)
            tile_state.advance()

    @cute.kernel
    def kernel(self, qk_mma: cute.TiledMma, qk_rest: cute.TiledMma, lse_mma: cute.TiledMma, lse_rest: cute.TiledMma,
               pv_mma: cute.TiledMma, tma_q: cute.CopyAtom,
               tma_q_t: cute.Tensor, tma_k: cute.CopyAtom, tma_k_t: cute.Tensor, tma_v: cute.CopyAtom,
               tma_v_t: cute.Tensor, mBias: cute.Tensor, mTau: cute.Tensor, mLens: cute.Tensor, mLSE: cute.Tensor,
               mO: cute.Tensor, mCounter: cute.Tensor, scale: cutlass.Float32, sQ_layout: cute.ComposedLayout,
               sK_layout: cute.ComposedLayout, sV_layout: cute.ComposedLayout, sKl_layout: cute.ComposedLayout,
               SharedStorage: cutlass.Constexpr):
        D = self.D
        dt = self.dtype
        tidx, warp_idx, wg_idx = thread_roles()
        L, H, B, Hkv, W, n_mblocks, total = persistent_dims(mO, tma_k_t, mBias, BM)

        storage = cutlass.memory.SmemAllocator().allocate(SharedStorage)
        sQ, sK, sV = self._qkv_smem(storage, sQ_layout, sK_layout, sV_layout)
        sQl = storage.sQl.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)
        sKl = storage.sKl.get_tensor(sKl_layout.outer, swizzle=sKl_layout.inner)
        sT = storage.sT.get_tensor(cute.make_layout(max(CTA_TABLE, 2 * TABLE)))
        sL = storage.sL.get_tensor(cute.make_layout(2 * BM))
        sTile = storage.tile.get_tensor(cute.make_layout(SCHEDULE_STAGES))

        tile_pipe = schedule_pipe(storage.tile_mbar.data_ptr(), 3 * WG + 32 + FILLERS)
        tbl_pipe = table_pipe(storage.table_mbar.data_ptr(), 3 * WG, FILLERS)
        lse_pipe = pipeline.PipelineAsync.create(
            barrier_storage=storage.lse_mbar.data_ptr(), num_stages=2,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, WG),
            consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, 2 * WG))
        q_pipe = tma_pipeline(storage.q_mbar.data_ptr(), 1, BM * D * dt.width // 8)
        ql_pipe = tma_pipeline(storage.ql_mbar.data_ptr(), 1, BM * D * dt.width // 8, 4)
        kv_pipe = tma_pipeline(storage.kv_mbar.data_ptr(), self.stages, BN * D * dt.width // 8)
        kl_pipe = tma_pipeline(storage.kl_mbar.data_ptr(), self.lse_stages, BN * D * dt.width // 8, 4)

        if wg_idx == 0:
            cute.arch.warpgroup_reg_dealloc(PRODUCER_REGS)
            if warp_idx == 0:  # the O warpgroups' loads, tile by tile from the tile pipe
                cpasync.prefetch_descriptor(tma_q)
                cpasync.prefetch_descriptor(tma_k)
                cpasync.prefetch_descriptor(tma_v)
                tile_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, SCHEDULE_STAGES)
                q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, 1)
                kv_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.stages)
                count = cutlass.Int32(0)  # K / V loads issued (fwd_sm90's load-skipping switches count them)
                tile = receive_tile(tile_pipe, tile_state, sTile)
                tile_state.advance()
                while tile < total:
                    bx, h, b, hk = tile_coords(tile, H, Hkv, n_mblocks, total, SHORT_FIRST)
                    mb, m0, lb, n_seen = query_block(bx, L, mLens[b], BM, BN, self.causal)
                    n_blocks = n_seen if m0 < lb else 0
                    if cutlass.const_expr("no_tiles" in fwd_module.ABLATE.split("+")):  # _forward_tiles' switch
                        n_blocks = 0
                    q_state, kv_state, count = self._load_tile(q_pipe, kv_pipe, q_state, kv_state, count, tma_q,
                                                               tma_q_t, tma_k, tma_k_t, tma_v, tma_v_t, sQ, sK, sV,
                                                               h, b, hk, mb, n_blocks)
                    tile = receive_tile(tile_pipe, tile_state, sTile)
                    tile_state.advance()
            elif warp_idx == 1:  # the tile claims and the LSE warpgroup's loads
                cpasync.prefetch_descriptor(tma_q)
                cpasync.prefetch_descriptor(tma_k)
                tile, tile_state, ql_state, kl_state = start_producer(tile_pipe, sTile, self.lse_stages)
                while tile < total:
                    bx, h, b, hk = tile_coords(tile, H, Hkv, n_mblocks, total, SHORT_FIRST)
                    mb, m0, lb, n_blocks = query_block(bx, L, mLens[b], BM, BN, self.causal)
                    if cutlass.const_expr("no_tiles" in LSE_ABLATE.split("+")):
                        n_blocks = 0
                    gQ = cute.local_tile(tma_q_t[None, None, h, b], (WM, D), (None, 0))
                    gK = cute.local_tile(tma_k_t[None, None, hk, b], (BN, D), (None, 0))
                    tQsQ, tQgQ = tma_views(tma_q, sQl, gQ)
                    tKsK, tKgK = tma_views(tma_k, sKl, gK)
                    load_row_block(ql_pipe, [(tma_q, tQgQ, tQsQ)], 2 * mb, 2, ql_state)
                    ql_state.advance()
                    for nb in cutlass.range(n_blocks, unroll=1):
                        self._load(kl_pipe, kl_state, tma_k, tKgK[None, nb], tKsK, 0)
                        kl_state.advance()
                    tile = claim_next_tile(mCounter)
                    publish_tile(tile_pipe, tile_state, sTile, tile)
                    tile_state.advance()
            else:  # warps 2 and 3: each tile's bias table
                fill_tables_ahead(tile_pipe, tbl_pipe, sTile, sT, tidx - 64, total, H, Hkv, n_mblocks, W, L, mBias,
                                  BM, BN, self.causal, CTA_TABLE // 2, FILLERS, SHORT_FIRST)
        elif wg_idx < 3:
            cute.arch.warpgroup_reg_alloc(O_REGS)
            self._forward_tiles(qk_mma, qk_rest, pv_mma, sQ, sK, sV, sT, sTile, tile_pipe, tbl_pipe, q_pipe, kv_pipe,
                                mBias, mTau, mLens, mLSE, mO, scale, tidx, wg_idx, H, Hkv, L, W, n_mblocks, total,
                                lse_pipe, sL, SHORT_FIRST)
        else:
            cute.arch.warpgroup_reg_dealloc(LSE_REGS)
            self._lse_tiles(lse_mma, lse_rest, sQl, sKl, sT, sL, sTile, tile_pipe, tbl_pipe, ql_pipe, kl_pipe, lse_pipe,
                            mBias, mLens, mLSE, scale, tidx, H, Hkv, L, W, n_mblocks, total)


def fake_args(key: KernelKey):
    """``fwd_sm90``'s fake arguments (the same signature)."""
    return fwd_module.fake_args(key)


def shared_bytes(key: KernelKey) -> int:
    """Dynamic shared memory of one CTA (SharedStorage)."""
    D, el = key.head_dim, 2
    kv, kl = ring_stages(D)
    return struct_bytes(((2 * SCHEDULE_STAGES * 8, 8), (SCHEDULE_STAGES * 4, 4), (4 * 8, 8), (4 * 8, 8), (2 * 8, 8),
                         (2 * 8, 8), (2 * kv * 8, 8), (2 * kl * 8, 8), (2 * BM * 4, 16), (BM * D * el, 1024),
                         (BM * D * el, 1024), (BN * D * el * kv, 1024), (BN * D * el * kl, 1024),
                         (max(CTA_TABLE, 2 * TABLE) * 4, 16)))


def compile(key: KernelKey, options: str = "--enable-tvm-ffi"):
    """The compiled TVM FFI function for ``key`` (``key.kernel`` must be ``"fused_fwd_sm90"``)."""
    return compile_kernel(LazyAttentionFusedFwdSm90, KERNELS, fake_args, key, options)
