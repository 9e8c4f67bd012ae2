"""CuTe DSL kernel: the lazy attention forward's row log-sum-exp (SPEC section 1), the LSE its Elastic-Softmax needs
before the first product with V: ``lse_sm90``, then ``fwd_sm90`` (``_lazy_attention_fwd_sm90_kernel``, O from this
LSE). The cute backend's forward is these two kernels.

This sweep is a GEMM pass with one exp2 per score: its exponential and row-sum stream is as long as its GEMMs. On the
forward's two consumer warpgroups (one warp per scheduler each) neither hides under the other; here four consumer
warpgroups share the SM, so each scheduler has four warps to issue from.

Persistent like ``fwd_sm90``: one CTA per SM (five warpgroups, 640 threads) takes tiles (query block of BM = 256
rows, head, batch) in grid order, the next one gridDim.x + a ticket from the call's counter
(``_tiles.claim_next_tile``). Every CTA triggers the dependent launch of ``fwd_sm90`` at its start
(griddepcontrol.launch_dependents): its CTAs take the SMs this grid's CTAs leave and wait for this grid's end before
reading the LSE.

- warpgroup 0, the producer: its warp 0 claims the tiles (the tile pipe) and issues every TMA load (setmaxnreg down
  to 24 registers): per tile, Q into sQ as four quarters [WM = 64, D] (four TMA copies completing one barrier of the
  Q pipeline), then the key tiles [BN, D] of the block (keys below min(m0 + BM, lengths[b]) causal, else
  lengths[b]) into a ring of STAGES buffers.
- warpgroups 1 .. 4, the consumers (setmaxnreg up to 112, ``consumer_regs``): warpgroup w owns query rows
  m0 + 64 (w - 1) ..; per key tile it issues S = Q_w K^T (m64nBNk16, both operands in shared memory), waits,
  releases the stage and folds the tile into its rows' running max and sum (``_sweep1_rows``: every tile takes the
  max on q.k and one FFMA per exp2, masked entries -inf by a select; a band tile's exp2 times exp2(bias) from the
  table, ``_fold_band_exp``; of the causal diagonal tile (wm0 - n0 is 0 or 64) only the half of the keys the
  mask cuts is compared, and where the last 64 keys follow every row only the first 64 are folded). The kernels
  get scale > 0 (the launcher maps a negative or zero scale onto q), so q.k * scale keeps -inf. A tile no row of
  the warpgroup sees (causal: its first key after the warpgroup's last row) is released without a GEMM.
  Exp-domain band folds need every log2-domain bias of the head's table within +-EXP_RANGE
  (``_exp_band``): the row max is then the scores' without the bias, at most EXP_RANGE from the row's, so
  the fp32 sum neither overflows nor loses a term that matters (an exp2 flushed to 0 below 2^-126 weighs at most
  2^(2 EXP_RANGE - 126) of the row's largest term). A table with a bias outside (or NaN) carries its fill's tag in
  entry FLAG, and that tile's band tiles take per-tile tables of the log2-domain bias with the forward's
  ``_scores``, as where W is too large for the CTA's table. No ping-pong: the four warpgroups' GEMMs and
  exponentials interleave by themselves (issuing them in turn, 0, 1, 2, 3, 0, ..., timed no faster).

Synchronisation (``fwd_sm90``'s docstring gives the tile and table pipes' rules):
- Tile pipe (2 slots): the next tile index from the producer's elected lane to the 512 consumer threads.
- Q pipeline (1 stage): full barrier = the TMA bytes of sQ; the consumers wait once per tile and release it (one
  arrive per warp) after the tile's last key tile's GEMMs, before its last fold and the LSE stores.
- Table pipe (2 stages): the CTA's table of exp2(bias) over every distance a tile sees, in the half of sT of the
  tile's parity (causal min(W, L) <= 3583, non-causal <= 1663; the half's last entry is the range flag), filled per
  tile by the 512 consumer threads, waited on before a warpgroup's first non-free key tile (and, by every consumer,
  before the block's first band tile: the range flag decides CTA-uniformly whether the per-tile tables of (b)
  replace it), released after the tile.
- KV pipeline (STAGES stages): full[s] completes when the TMA bytes of stage s land; empty[s] needs one arrive from
  each of the 16 consumer warps (lane 0 of each) after that warpgroup's GEMM on stage s completed (or, a tile the
  warpgroup skips, at once).
- Named barrier 1 (the 512 consumer threads), at CTA-uniform points: (a) after zeroing the rows of sQ at query
  positions >= lengths[b] (generic stores, then fence.proxy.async, then the barrier, before any wgmma reads them);
  (b) where W is too large for the CTA's table or its range flag is set, a per-tile table filled by all consumers
  on every non-free tile of the block (CTA-uniform: the tile's class is the whole block's), one barrier per fill
  (the forward's rule: fill k starts after the barrier of fill k - 1, which no consumer passes before its reads of
  fill k - 2).

Rules: rows >= lengths[b] compute with q = 0 (their LSE is the log-sum-exp of the bias over the valid keys); keys >=
lengths[b] masked by a select (never by adding -inf); lengths[b] = 0 gives LSE = -inf; NaN propagates (NaN-propagating
max). The stored LSE is rounded so that its recovery round(LSE * log2 e), which ``fwd_sm90`` and the backward compute,
does not exceed the row's log2 log-sum-exp (``_lse_to_store``).

Layout (contiguous): Q [B, H, L, D], K [B, Hkv, L, D] fp16/bf16; Bias [H, W] fp32; Lens [B] int32; LSE [B, H, L]
fp32 (written, natural log). B, H, Hkv, L, W are runtime values; D, dtype and causal are compiled in.
"""

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
from cutlass._mlir.dialects import llvm
from cutlass.cute.nvgpu import cpasync, warpgroup

from . import _lazy_attention_fwd_sm90_kernel as fwd_module
from ._kernel_key import KernelKey
from ._lazy_attention_fwd_sm90_kernel import LazyAttentionFwdSm90
from ._exp_band import EXP_RANGE
from ._tiles import (DSL_DTYPES, FILL_BATCH, LOG2E, SCHEDULE_STAGES, WG, CtaTable, acc_mn_view, bias_at,
                     claim_next_tile, compile_kernel, cta_table_extent, fake_rows, fill_cta_table, keys_free,
                     load_row_block, pairwise_reduce, pairwise_sum, persistent_dims, persistent_grid,
                     publish_tile, quad_reduce, query_block, receive_tile, schedule_pipe, score_mmas, start_producer,
                     struct_bytes, sw128_atoms, table_pipe, thread_roles, tile_class, tile_coords, tile_table,
                     tma_pipeline, tma_views)

KERNELS = ("lse_sm90",)
ARGS = {
    "lse_sm90": [
        "q fp16/bf16 [B,H,L,D] contiguous",
        "k fp16/bf16 [B,Hkv,L,D] contiguous",
        "bias fp32 [H,W] contiguous",
        "lengths int32 [B] (L when no padding; values in [0, L])",
        "lse fp32 [B,H,L] (written, natural log)",
        "counter int32 [1] (zero; the persistent CTAs' tile tickets, zero again at the end)",
        "ctas int (python scalar: CTAs to launch, the SM count)",
        "scale float (python scalar, > 0: the launcher maps a negative or zero scale onto q)",
    ]
}

WM = 64  # query rows per consumer warpgroup
CONSUMERS = 4  # consumer warpgroups (BM = WM * CONSUMERS query rows per CTA)
BN = 128  # keys per tile
STAGES_64, STAGES_128 = 8, 4  # K ring depth per head dim
PRODUCER_REGS = 24
TABLE = 512  # entries of one per-tile bias table (BM + BN - 1 used)
CTA_TABLE = 8192  # entries of the CTA's table over every distance its tiles see
CONSUMER_BARRIER = 1
LN2 = 0.6931471805599453
FLAG = CTA_TABLE // 2 - 1  # the entry of a table half holding its fill's tag where some bias is out of EXP_RANGE
EXP_BAND = True  # band tiles fold in the exp domain (the table holds exp2(bias)); False: the log2 table as the forward


@cute.jit
def fill_exp_table(sTk, t, threads: cutlass.Constexpr, W, L, mBias, h, BM: cutlass.Constexpr, BN: cutlass.Constexpr,
                   causal: cutlass.Constexpr, tag):
    """Fill (thread ``t`` of ``threads``) the CTA's table over every distance its band tiles see, as
    ``_tiles.fill_cta_table`` does, with exp2 of each log2-domain bias; where some bias is outside [-EXP_RANGE,
    EXP_RANGE] (or NaN) its thread writes ``tag`` into entry FLAG, and the tile's band tiles take per-tile tables
    of the log2-domain bias (``_tiles.tile_table``), as where W is too large for the CTA's table."""
    cta = cta_table_extent(W, L, BM, BN, causal, FLAG)
    if cta.whole:
        for t0 in cutlass.range(t, cta.entries, FILL_BATCH * threads, unroll=1):
            vals = [bias_at(cta.d_first + t0 + j * threads, W, mBias, h, causal) for j in range(FILL_BATCH)]
            for j in cutlass.range_constexpr(FILL_BATCH):
                if t0 + j * threads < cta.entries:
                    sTk[t0 + j * threads] = cute.math.exp2(vals[j], fastmath=True)
                    if not (vals[j] <= EXP_RANGE and vals[j] >= -EXP_RANGE):
                        sTk[FLAG] = tag
    return cta


def consumer_regs() -> int:
    """Registers per consumer thread after setmaxnreg: what the launch gives (65536 over the CTA's threads, in steps
    of 8) less the producer warpgroup's 24, shared by the consumers (steps of 8). Two CTAs per SM would leave 80 at
    launch, fewer than ptxas needs for the m64n128 score wgmma (90)."""
    launch = 65536 // ((CONSUMERS + 1) * WG) // 8 * 8
    return ((CONSUMERS + 1) * launch - PRODUCER_REGS) // CONSUMERS // 8 * 8


class LazyAttentionLseSm90(LazyAttentionFwdSm90):
    def __init__(self, head_dim: int, dtype, causal: bool):
        self.STAGES = {64: STAGES_64, 128: STAGES_128}
        super().__init__(head_dim, dtype, causal)

    def key_tile(self) -> int:
        return BN

    @cute.jit
    def _lse_to_store(self, lse2):
        """The natural-log LSE for a row whose log2 log-sum-exp is lse2: rounded, then one ulp lower where the
        backward's recovery round(LSE * log2 e) would exceed lse2 (the backward and ``fwd_sm90`` recompute P against
        the stored LSE)."""
        lse = lse2 * LN2
        bits = cutlass.Int32(llvm.bitcast(cutlass.Int32.mlir_type, lse.ir_value()))
        step = cutlass.Int32(-1) if lse > 0.0 else cutlass.Int32(1)
        down = cutlass.Float32(llvm.bitcast(cutlass.Float32.mlir_type, (bits + step).ir_value()))
        return down if lse * LOG2E > lse2 else lse

    @cute.jit
    def _sweep1_rows(self, acc_mn, free, masked, span, tScS_mn, tbl, m0, wm0, n0, lb, sc2, row_max, row_sum,
                     exp_band):
        """Fold a tile's raw scores (q.k) into the online row max and sum (log2 domain): free tiles straight from
        q.k; band tiles where ``exp_band`` (``tbl`` holds exp2 of the bias) as exp2(scores without bias) times the
        table's entry (``_fold_band_exp``), else after the bias and masks (the forward's ``_scores``)."""
        ablate = fwd_module.ABLATE.split("+")
        if cutlass.const_expr("mask_free" in ablate):  # timing only: every tile folds as a free one
            free = True
        if cutlass.const_expr("band_free" in ablate):  # timing only: unmasked band tiles fold as free ones
            free = free or not masked
        if free:
            self._fold_rows(acc_mn, row_max, row_sum, sc2, True)
        elif exp_band:
            self._fold_band_exp(acc_mn, masked, span, tScS_mn, tbl, m0, wm0, n0, lb, sc2, row_max, row_sum)
        else:
            self._scores(acc_mn, tScS_mn, tbl, m0, n0, lb, sc2, masked, span)
            self._fold_rows(acc_mn, row_max, row_sum, sc2, False)

    @cute.jit
    def _fold_band_exp(self, acc_mn, masked, span, tScS_mn, tbl, m0, wm0, n0, lb, sc2, row_max, row_sum):
        """A band tile folded as a free one (the max on q.k, one FFMA per exp2 argument, which needs sc2 > 0) with
        each exp2 times exp2(bias) from the table ``tbl``: the bias leaves the path to the row max. The max is then
        not the row's (a bias of up to EXP_RANGE shifts it), which the fp32 sum absorbs. A masked tile's entries
        are q.k or -inf by a select (exp2 0); its table index is clamped to ``span`` only where the tile crosses
        lengths[b] (or, not causal, always): a causal tile before lengths[b] sees only the table's distances."""
        n_cols = cute.size(acc_mn.shape[1])
        n_rows = cute.size(acc_mn.shape[0])
        near = lambda r, c: tbl[tScS_mn[r, 0][0] - tScS_mn[0, c][1] + (BN - 1)]  # an index inside the table
        cut = n0 + BN > lb
        if cutlass.const_expr(not self.causal):
            cut = True
        if masked and not cut:  # the diagonal tile: wm0 - n0 is 0 or WM (keys n0 + WM .. follow every row / the
            half = n_cols // 2  # first WM keys precede every row); columns c < half are keys n0 .. n0 + WM - 1
            if wm0 == n0:
                for c in cutlass.range_constexpr(half):
                    for r in cutlass.range_constexpr(n_rows):
                        ok = n0 + tScS_mn[0, c][1] <= m0 + tScS_mn[r, 0][0]
                        acc_mn[r, c] = acc_mn[r, c] if ok else -cutlass.Float32.inf
                self._fold_rows(acc_mn, row_max, row_sum, sc2, True, near, half)
            else:
                for c in cutlass.range_constexpr(half, n_cols):
                    for r in cutlass.range_constexpr(n_rows):
                        ok = n0 + tScS_mn[0, c][1] <= m0 + tScS_mn[r, 0][0]
                        acc_mn[r, c] = acc_mn[r, c] if ok else -cutlass.Float32.inf
                self._fold_rows(acc_mn, row_max, row_sum, sc2, True, near)
        elif masked:
            for c in cutlass.range_constexpr(n_cols):
                j = tScS_mn[0, c][1]
                key_ok = n0 + j < lb
                for r in cutlass.range_constexpr(n_rows):
                    ok = key_ok
                    if cutlass.const_expr(self.causal):
                        ok = key_ok and (n0 + j <= m0 + tScS_mn[r, 0][0])
                    acc_mn[r, c] = acc_mn[r, c] if ok else -cutlass.Float32.inf
            self._fold_rows(acc_mn, row_max, row_sum, sc2, True, lambda r, c: tbl[cutlass.min(cutlass.max(
                tScS_mn[r, 0][0] - tScS_mn[0, c][1] + (BN - 1), span.lo), span.hi)])
        else:
            self._fold_rows(acc_mn, row_max, row_sum, sc2, True, near)

    @cute.jit
    def _fold_rows(self, acc_mn, row_max, row_sum, sc2, raw: cutlass.Constexpr, weight=None, n_used=None):
        """row_max / row_sum <- the tile's scores folded in; ``raw``: acc_mn holds q.k (scores = sc2 * q.k: the max
        is taken on q.k, which needs sc2 > 0, and exp2 gets one FFMA per score), else log2-domain scores; each
        exp2 times ``weight(r, c)`` where given; only the first ``n_used`` columns where given (the rest masked).
        The tile's row sum is a balanced tree (a chain of 32 dependent adds per row is what ptxas makes of a
        reduce)."""
        n_cols = cute.size(acc_mn.shape[1]) if cutlass.const_expr(n_used is None) else n_used
        for r in cutlass.range_constexpr(cute.size(acc_mn.shape[0])):
            if cutlass.const_expr(raw and "no_max" in fwd_module.ABLATE.split("+")):  # timing only: no row max
                mx = cutlass.Float32(0.0)
            elif cutlass.const_expr(n_used is None):
                mx = quad_reduce(acc_mn[r, None].load().reduce(cute.ReductionOp.MAX, -cutlass.Float32.inf, 0),
                                 cute.arch.fmax)
            else:
                mx = quad_reduce(pairwise_reduce([acc_mn[r, c] for c in range(n_cols)], cute.arch.fmax),
                                 cute.arch.fmax)
            if cutlass.const_expr(raw):
                mx = mx * sc2
            prev = row_max[r]
            new = cute.arch.fmax(prev, mx)
            safe = cutlass.Float32(0.0) if new == -cutlass.Float32.inf else new
            for c in cutlass.range_constexpr(n_cols):
                x = acc_mn[r, c] * sc2 - safe if cutlass.const_expr(raw) else acc_mn[r, c] - safe
                acc_mn[r, c] = self._exp2(x)
            if cutlass.const_expr(weight is None):
                tile_sum = pairwise_sum([acc_mn[r, c] for c in range(n_cols)])
            else:
                tile_sum = pairwise_sum([acc_mn[r, c] * weight(r, c) + acc_mn[r, c + 1] * weight(r, c + 1)
                                         for c in range(0, n_cols, 2)])
            row_sum[r] = row_sum[r] * self._exp2(prev - safe, fastmath=True) + tile_sum
            row_max[r] = new

    @cute.jit
    def __call__(self, mQ: cute.Tensor, mK: cute.Tensor, mBias: cute.Tensor, mLens: cute.Tensor, mLSE: cute.Tensor,
                 mCounter: cute.Tensor, ctas: cutlass.Int32, scale: cutlass.Float32, stream):
        D = self.D
        dt = self.dtype
        BM = WM * CONSUMERS
        qk_mma, qk_rest = score_mmas(dt, WM, BN)
        k_atom, _ = sw128_atoms(dt)
        sQ_layout = cute.tile_to_shape(k_atom, (WM, D, CONSUMERS), order=(0, 1, 2))
        sK_layout = cute.tile_to_shape(k_atom, (BN, D, self.stages), order=(0, 1, 2))
        q_t = cute.make_tensor(mQ.iterator, cute.select(mQ.layout, mode=[2, 3, 1, 0]))
        k_t = cute.make_tensor(mK.iterator, cute.select(mK.layout, mode=[2, 3, 1, 0]))
        g2s = cpasync.CopyBulkTensorTileG2SOp()
        tma_q, tma_q_t = cpasync.make_tiled_tma_atom(g2s, q_t, cute.slice_(sQ_layout, (None, None, 0)), (WM, D))
        tma_k, tma_k_t = cpasync.make_tiled_tma_atom(g2s, k_t, cute.slice_(sK_layout, (None, None, 0)), (BN, D))

        @cute.struct
        class SharedStorage:
            tile_mbar: cute.struct.MemRange[cutlass.Int64, 2 * SCHEDULE_STAGES]
            tile: cute.struct.MemRange[cutlass.Int32, SCHEDULE_STAGES]
            table_mbar: cute.struct.MemRange[cutlass.Int64, 4]
            q_mbar: cute.struct.MemRange[cutlass.Int64, 2]
            kv_mbar: cute.struct.MemRange[cutlass.Int64, 2 * self.stages]
            sQ: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sQ_layout)], 1024]
            sK: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sK_layout)], 1024]
            sT: cute.struct.Align[cute.struct.MemRange[cutlass.Float32, max(CTA_TABLE, 2 * TABLE)], 16]

        L = mQ.shape[2]
        self.kernel(qk_mma, qk_rest, tma_q, tma_q_t, tma_k, tma_k_t, mBias, mLens, mLSE, mCounter, scale, sQ_layout,
                    sK_layout, SharedStorage).launch(
            grid=persistent_grid(ctas, (L + BM - 1) // BM, mQ.shape[1], mQ.shape[0]),
            block=[(CONSUMERS + 1) * WG, 1, 1],
            smem=SharedStorage.size_in_bytes(), stream=stream, min_blocks_per_mp=1)

    @cute.kernel
    def kernel(self, qk_mma: cute.TiledMma, qk_rest: cute.TiledMma, tma_q: cute.CopyAtom, tma_q_t: cute.Tensor,
               tma_k: cute.CopyAtom, tma_k_t: cute.Tensor, mBias: cute.Tensor, mLens: cute.Tensor, mLSE: cute.Tensor,
               mCounter: cute.Tensor, scale: cutlass.Float32, sQ_layout: cute.ComposedLayout,
               sK_layout: cute.ComposedLayout, SharedStorage: cutlass.Constexpr):
        D = self.D
        dt = self.dtype
        BM = WM * CONSUMERS
        tidx, warp_idx, wg_idx = thread_roles()
        L, H, B, Hkv, W, n_mblocks, total = persistent_dims(mLSE, tma_k_t, mBias, BM)
        cute.arch.griddepcontrol_launch_dependents()  # fwd_sm90 may start on the SMs this grid's CTAs leave

        smem = cutlass.memory.SmemAllocator()
        storage = smem.allocate(SharedStorage)
        sQ = storage.sQ.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)
        sK = storage.sK.get_tensor(sK_layout.outer, swizzle=sK_layout.inner)
        sT = storage.sT.get_tensor(cute.make_layout(max(CTA_TABLE, 2 * TABLE)))
        sTile = storage.tile.get_tensor(cute.make_layout(SCHEDULE_STAGES))
        tile_pipe = schedule_pipe(storage.tile_mbar.data_ptr(), CONSUMERS * WG)
        tbl_pipe = table_pipe(storage.table_mbar.data_ptr(), CONSUMERS * WG, CONSUMERS * WG)
        q_pipe = tma_pipeline(storage.q_mbar.data_ptr(), 1, BM * D * dt.width // 8, 4 * CONSUMERS)
        kv_pipe = tma_pipeline(storage.kv_mbar.data_ptr(), self.stages, BN * D * dt.width // 8, 4 * CONSUMERS)

        if wg_idx == 0:
            cute.arch.warpgroup_reg_dealloc(PRODUCER_REGS)
            if warp_idx == 0:
                cpasync.prefetch_descriptor(tma_q)
                cpasync.prefetch_descriptor(tma_k)
                tile, tile_state, q_state, kv_state = start_producer(tile_pipe, sTile, self.stages)
                while tile < total:
                    bx, h, b, hk = tile_coords(tile, H, Hkv, n_mblocks)
                    mb, m0, lb, n_blocks = query_block(bx, L, mLens[b], BM, BN, self.causal)
                    if cutlass.const_expr("no_tiles" in fwd_module.ABLATE.split("+")):  # the forward's switch
                        n_blocks = 0
                    gQ = cute.local_tile(tma_q_t[None, None, h, b], (WM, D), (None, 0))  # (WM, D, query quarters)
                    gK = cute.local_tile(tma_k_t[None, None, hk, b], (BN, D), (None, 0))
                    tQsQ, tQgQ = tma_views(tma_q, sQ, gQ)
                    tKsK, tKgK = tma_views(tma_k, sK, gK)
                    load_row_block(q_pipe, [(tma_q, tQgQ, tQsQ)], CONSUMERS * mb, CONSUMERS, q_state)
                    q_state.advance()
                    for nb in cutlass.range(n_blocks, unroll=1):
                        kv_pipe.producer_acquire(kv_state)
                        cute.copy(tma_k, tKgK[None, nb], tKsK[None, kv_state.index],
                                  tma_bar_ptr=kv_pipe.producer_get_barrier(kv_state))
                        kv_state.advance()
                    tile = claim_next_tile(mCounter, total)
                    publish_tile(tile_pipe, tile_state, sTile, tile)
                    tile_state.advance()
        else:
            cute.arch.warpgroup_reg_alloc(consumer_regs())
            qk_mma.set(warpgroup.Field.ACCUMULATE, False)
            qk_rest.set(warpgroup.Field.ACCUMULATE, True)
            ctid = tidx - WG  # 0 .. 511 over the consumer warpgroups
            wg = wg_idx - 1
            wtid = tidx % WG
            sc2 = scale * LOG2E

            thr_qk = qk_mma.get_slice(wtid)
            tSrQ = thr_qk.make_fragment_A(thr_qk.partition_A(sQ[None, None, wg]))
            tSrK = thr_qk.make_fragment_B(thr_qk.partition_B(sK))
            acc_S = thr_qk.make_fragment_C(thr_qk.partition_shape_C((WM, BN)))
            cS = cute.local_tile(cute.make_identity_tensor((BM, BN)), (WM, BN), (wg, 0))
            tScS_mn = acc_mn_view(thr_qk.partition_C(cS))
            acc_S_mn = acc_mn_view(acc_S)
            n_rows = cute.size(acc_S_mn.shape[0])
            row_max = cute.make_rmem_tensor((n_rows,), cutlass.Float32)
            row_sum = cute.make_rmem_tensor((n_rows,), cutlass.Float32)

            tile_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, SCHEDULE_STAGES)
            q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, 1)
            kv_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
            fills = cutlass.Int32(0)
            tbl_fill = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, 2)
            tbl_read = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, 2)
            tile = receive_tile(tile_pipe, tile_state, sTile)
            tile_state.advance()
            while tile < total:
                bx, h, b, hk = tile_coords(tile, H, Hkv, n_mblocks)
                mb, m0, lb, n_blocks = query_block(bx, L, mLens[b], BM, BN, self.causal)
                if cutlass.const_expr("no_tiles" in fwd_module.ABLATE.split("+")):
                    n_blocks = 0
                wm0 = m0 + WM * wg  # this warpgroup's first query row
                row_max.fill(-cutlass.Float32.inf)
                row_sum.fill(0.0)

                # the table for this head in the half of sT of the tile's parity
                sTk = cute.make_tensor(sT.iterator + tbl_fill.index * (CTA_TABLE // 2),
                                       cute.make_layout(CTA_TABLE // 2))
                tbl_pipe.producer_acquire(tbl_fill)
                tag = cutlass.Float32(tile) + 0.5
                if cutlass.const_expr(EXP_BAND):
                    cta = fill_exp_table(sTk, ctid, CONSUMERS * WG, W, L, mBias, h, BM, BN, self.causal, tag)
                else:
                    cta = fill_cta_table(sTk, ctid, CONSUMERS * WG, W, L, mBias, h, BM, BN, self.causal, FLAG)
                tbl_pipe.producer_commit(tbl_fill)
                tbl_fill.advance()
                q_pipe.consumer_wait(q_state)
                if m0 + BM > lb and lb < L:  # rows at positions >= lengths[b] become zeros (rows >= L arrive as 0)
                    for i in cutlass.range(ctid, BM * D, CONSUMERS * WG, unroll=1):
                        r = i // D
                        if m0 + r >= lb:
                            sQ[r % WM, i - r * D, r // WM] = dt(0.0)
                    cute.arch.fence_proxy("async.shared", space="cta")
                    cute.arch.barrier(barrier_id=CONSUMER_BARRIER, number_of_threads=CONSUMERS * WG)
                if n_blocks == 0:
                    q_pipe.consumer_release(q_state)

                flagged = cutlass.Boolean(False)
                for nb in cutlass.range(n_blocks, unroll=1):
                    n0 = nb * BN
                    needed = not keys_free(m0, n0, lb, W, BM, BN, self.causal)
                    whole = cta.whole
                    if cutlass.const_expr(EXP_BAND):
                        if needed and cta.whole:  # the exp table's range flag (CTA-uniform): per-tile tables if set
                            tbl_pipe.consumer_wait(tbl_read)
                            flagged = sTk[FLAG] == tag
                        whole = cta.whole and not flagged
                    tbl, span, fills = tile_table(sTk, CtaTable(whole, cta.d_first, cta.entries), fills, needed,
                                                  ctid, m0, n0, W, mBias, h, BM, BN, TABLE, self.causal,
                                                  CONSUMER_BARRIER, CONSUMERS * WG)
                    seen = True
                    if cutlass.const_expr(self.causal):
                        seen = n0 <= wm0 + WM - 1
                    kv_pipe.consumer_wait(kv_state)
                    if seen:
                        warpgroup.fence()
                        self._gemm_s(qk_mma, qk_rest, acc_S, tSrQ, tSrK, kv_state.index)
                        warpgroup.commit_group()
                        warpgroup.wait_group(0)
                    kv_pipe.consumer_release(kv_state)
                    if nb == n_blocks - 1:  # the last score GEMM done: Q to the producer for the next tile
                        q_pipe.consumer_release(q_state)
                    kv_state.advance()
                    if seen:
                        free, masked = tile_class(wm0, n0, lb, W, WM, BN, self.causal)
                        if not free:
                            tbl_pipe.consumer_wait(tbl_read)  # the tile's table complete
                        self._sweep1_rows(acc_S_mn, free, masked, span, tScS_mn, tbl, m0, wm0, n0, lb, sc2, row_max,
                                          row_sum, whole if cutlass.const_expr(EXP_BAND) else False)
                q_state.advance()
                tbl_pipe.consumer_release(tbl_read)
                tbl_read.advance()

                lane = tidx % 4
                for r in cutlass.range_constexpr(n_rows):
                    s = quad_reduce(row_sum[r], lambda x, y: x + y)
                    lse2 = row_max[r] + cute.math.log2(s, fastmath=False)
                    m = m0 + tScS_mn[r, 0][0]
                    if lane == 0 and m < L:
                        mLSE[b, h, m] = self._lse_to_store(lse2)
                tile = receive_tile(tile_pipe, tile_state, sTile)
                tile_state.advance()


def fake_args(key: KernelKey):
    """Fake tensors (B, H, Hkv, L, W runtime) and scalars in ARGS order, plus the env stream."""
    dt, D = DSL_DTYPES[key.dtype], key.head_dim
    B, H, Hkv, L, W = (cute.sym_int() for _ in range(5))
    return [fake_rows(dt, (B, H, L, D)), fake_rows(dt, (B, Hkv, L, D)), fake_rows(cutlass.Float32, (H, W), 4),
            fake_rows(cutlass.Int32, (B,), 4), fake_rows(cutlass.Float32, (B, H, L), 4),
            fake_rows(cutlass.Int32, (1,), 4), cutlass.Int32(1), cutlass.Float32(1.0),
            cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)]


def shared_bytes(key: KernelKey) -> int:
    """Dynamic shared memory of one CTA: the mbarriers, Q [BM, D], STAGES tiles [BN, D], the fp32 bias table."""
    D, el, stages = key.head_dim, 2, {64: STAGES_64, 128: STAGES_128}[key.head_dim]
    return struct_bytes(((2 * SCHEDULE_STAGES * 8, 8), (SCHEDULE_STAGES * 4, 4), (4 * 8, 8), (2 * 8, 8),
                         (2 * stages * 8, 8),
                         (WM * CONSUMERS * D * el, 1024), (BN * D * el * stages, 1024),
                         (max(CTA_TABLE, 2 * TABLE) * 4, 16)))


def compile(key: KernelKey, options: str = "--enable-tvm-ffi"):
    """The compiled TVM FFI function for ``key`` (``key.kernel`` must be ``"lse_sm90"``)."""
    return compile_kernel(LazyAttentionLseSm90, KERNELS, fake_args, key, options)
