"""CuTe DSL kernel: the lazy attention forward's output (SPEC section 1) on Hopper's own machinery (TMA, wgmma, warp
specialisation): O = relu(P + tau / i) V from the row LSE that ``lse_sm90`` (``_lazy_attention_lse_sm90_kernel``)
wrote before it; the LSE and O are the residuals every backend saves.

The forward is two kernels: the Elastic-Softmax needs each row's final log-sum-exp before its first product with V.
One kernel doing both sweeps (sweep 1 the LSE, sweep 2 this) spends sweep 1 on two consumer warpgroups whose
exponential stream, as long as its GEMMs, hides under neither; ``lse_sm90`` runs it on four (docs/cute-backend.md).

Persistent: one CTA per SM (three warpgroups, 384 threads) takes tiles, a tile being (query block of BM = 128 rows,
head, batch) in grid order (heads fastest, then blocks longest first, then the batch: ``_tiles.tile_coords``), the
first its CTA index, each next one gridDim.x + a ticket from the call's counter (``_tiles.claim_next_tile``) as the
CTA frees up; the next tile's Q and first K / V tiles load under the current tile's last ones, its bias table is
filled while the current one runs, and the per-tile prologue (LSE loads) and O stores overlap the other warpgroup's
work instead of a new CTA's launch.

- warpgroup 0, the producer: its warp 0 claims the tiles (publishing each index through the tile pipe) and issues
  every TMA load (setmaxnreg down to 24 registers). Per tile, Q into sQ as
  two halves [WM = 64, D] (two TMA copies completing one barrier of the Q pipeline, one stage), then the key and
  value tiles [BN, D] into a ring of STAGES buffers (the KV pipeline) in the consumers' order: K(0), then K(nb),
  V(nb - 1) for nb = 1 .. n - 1, then V(n - 1). A K tile and a V tile have the same byte size, so they share one
  ring (a V stage is the same bytes seen through V's MN-major swizzled layout). Its warps 1..3, the table fillers,
  take each tile index too and fill the tile's bias table a tile ahead (``_tiles.fill_tables_ahead``).
- Launch: a programmatic dependent launch (DEPENDENT_LAUNCH) of ``lse_sm90``, which triggers it at its CTAs'
  start: this kernel's CTAs start on the SMs ``lse_sm90``'s CTAs leave as its tiles run out, their producer and
  table fillers load the first tile and its table, and the consumers wait (griddepcontrol.wait: ``lse_sm90``'s grid
  ended, its LSE visible) before their first LSE read. Nothing else here reads what ``lse_sm90`` writes, and it
  reads nothing this kernel writes.
- warpgroups 1 and 2, the consumers (setmaxnreg up to 240): each owns one half of the query rows (64) with its own
  wgmma tiled MMA (m64nBNk16 for S = Q K^T, both operands in shared memory; m64nDk16 for O += A V with A from
  registers, the fp32 S accumulator converted to the A-operand fragment, and V^T in shared memory). Ping-pong
  (PINGPONG): the two warpgroups take turns issuing their GEMMs, so one warpgroup's GEMMs run on the tensor cores
  while the other computes its exponentials. Each row's log2 LSE is the stored LSE times log2 e (what the
  backward recovers too); P = exp2(min(S2 - lse2, 0)), A = relu(P + tau / i) re-masked, O += A V (no
  renormalisation): per score one FFMA, the exp2 and one FADD give P + tau / i in fp32 (masked entries 0 by a
  select), and the conversion to A's 16-bit pairs applies the relu (``cvt.rn.relu``) and the cap P <= 1 as a
  halfwise min with max(1 + tau / i, 0) (``min.NaN``), one instruction each per pair (``_to_a``). One turn issues tile nb's score GEMM and tile nb - 1's A V GEMM (two groups), and tile nb's
  exponentials run under the latter (FlashAttention-3's intra-warpgroup overlap). No accumulator is in flight
  across a loop's back edge: one that is makes ptxas serialise every wgmma of the kernel (warning C7514; 16 %
  slower, measured). On free tiles each exp2 argument is one FFMA on q.k (so the scale must be >= 0: the launcher
  negates q for a negative one).

Synchronisation (which barrier guards which buffer):
- Tile pipe (mbarriers, PipelineAsync, 2 slots of sTile): the producer's elected lane writes the next tile index and
  arrives; every consumer and table-filler thread waits, reads it and arrives on the slot's empty barrier. An index
  >= the tile count ends the three loops.
- Q pipeline (mbarriers, PipelineTmaAsync, 1 stage): full barrier = the TMA transaction count of sQ; the consumers
  wait on it once per tile and release it (one arrive per warp) once their last score GEMM of the tile has completed
  (at once where the tile has no key tile), so the producer loads the next tile's Q under the tile's last
  exponentials, A V GEMM and stores.
- KV pipeline (mbarriers, PipelineTmaAsync, STAGES stages): full[s] completes when the TMA bytes of stage s land
  (producer: acquire = wait empty[s] then arrive-expect-tx on full[s]); empty[s] needs one arrive from each of the 8
  consumer warps (lane 0 of each, PipelineTmaAsync.consumer_release) after the warpgroup's wgmma reading stage s
  has completed (a wait_group retiring that GEMM's commit group precedes every release).
- Named barrier 1 (256 consumer threads), two uses, both at CTA-uniform points:
  (a) after the consumers overwrite shared memory with generic stores (rows of sQ at query positions >= lengths[b];
  rows of a V stage at key positions >= lengths[b]) each writer issues fence.proxy.async.shared::cta and then the
  barrier, so the following wgmma (async proxy) sees the zeros. The 256 threads split the elements (each written
  once), and the barrier also orders the zeroing before either warpgroup's GEMM on that buffer.
  (b) per-tile bias tables where W is too large for the CTA's (below): non-free key tile number k fills a
  per-tile table k % 2 and then passes the barrier before anyone reads it; a thread starts fill k only after
  passing the barrier of fill k - 1, which no consumer reaches before finishing its reads of table k % 2 (fill
  k - 2): one barrier per non-free tile, none on free tiles.
- Table pipe (mbarriers, PipelineAsync, 2 stages from the 96 table fillers to the 256 consumer threads): the CTA's
  table over every distance a tile's band tiles see (where it fits: ``CTA_TABLE`` / 2 entries, causal min(W, L) <=
  3712, non-causal <= 1791) lives in the half of sT of the tile's parity. Each filler acquires it (every consumer
  has released the table of two tiles back), fills its entries (``_tiles.FILL_BATCH`` loads in flight) and commits;
  a consumer waits on it before its first read (its first non-free key tile) and releases it after the tile. No
  barrier at a tile's start: warpgroup 0 starts its next tile while warpgroup 1 finishes its last turn.
- Named barriers 2 and 3 (ping-pong scheduler, 256 threads each): barrier 2 + w is warpgroup w's turn. A turn =
  bar.sync(2 + w) (own 128 threads + the other warpgroup's 128 arrivals), issue the turn's GEMMs, commit,
  bar.arrive(3 - w) (hand the turn over), then wait_group. Both warpgroups take the same number of turns per tile
  (n + 1, none where n = 0; tile counts are CTA-uniform), and the turns go on across the CTA's tiles. Warpgroup 1
  arrives once on barrier 2 before its first turn (warpgroup 0 goes first) and warpgroup 0 syncs once more on
  barrier 2 after its last turn of its last tile, so barrier 2 sees T + 1 syncs and T + 1 arrivals and barrier 3 T
  of each: nothing is left pending at exit. A warpgroup cannot arrive twice on one barrier phase: between two
  hand-overs it must pass a sync that needs the other warpgroup's hand-over, which comes after that warpgroup's sync
  on the phase in question (turns that start and end within each tile would break this at a tile's end). The
  barrier-1 points (tables, zeroing) sit between turns in the same order in both warpgroups, so neither waits at
  barrier 1 for a turn the other cannot take.
- Epilogue: O goes from registers to global memory (each thread's column pairs as 4-byte stores, rows < L;
  ``_tiles.store_accumulator``): sQ is the next tile's by then.
- wgmma: warpgroup.fence() before every GEMM whose register operands (accumulator, A) were written by ordinary
  instructions; a wait_group retiring a GEMM's group before any register or buffer of that GEMM is read,
  rewritten or released.

Rules: query rows >= lengths[b] store O = 0 exactly; keys >= lengths[b] are masked by a select (never by adding
-inf) and their V rows are zeroed in shared memory (TMA loads the real, possibly non-finite, data there; rows >= L
arrive as zeros from TMA's out-of-bounds fill); lengths[b] = 0 gives O = 0; the relu keeps NaN.
Bias and masks are applied only on tiles within W of the diagonal or crossing lengths[b] (``_tiles.keys_free``), and
masks only on the tiles among those that cross lengths[b] or (causal) the diagonal; the bias is read per element
from the shared table of log2-domain bias by distance (reading [H, W] from global memory per element instead made
ptxas spill at D = 128: 64 loads in flight on top of the S, O and A registers; filling a per-tile table with a
barrier on every band tile cost 12 % of the kernel at W = 512, 28 % at W = 2048).

Layout (all contiguous): Q, O [B, H, L, D]; K, V [B, Hkv, L, D] fp16/bf16; Bias [H, W], Tau [H] fp32; Lens [B]
int32; LSE [B, H, L] fp32 (read). B, H, Hkv, L, W are runtime values; D, dtype and causal are compiled in.
"""

from typing import NamedTuple

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
from cutlass._mlir.dialects import llvm
from cutlass.cute.nvgpu import cpasync, warpgroup

from ._kernel_key import KernelKey
from ._tiles import (DSL_DTYPES, LOG2E, ORDER_BARRIER, SCHEDULE_STAGES, TABLE_FILLERS, WG, HopperKernel, acc_mn_view,
                     accumulate_mma, claim_next_tile, compile_kernel, cta_table_extent, fake_rows, fill_tables_ahead,
                     load_row_block, persistent_dims, persistent_grid, publish_tile, query_block, receive_tile,
                     schedule_pipe, score_mmas, start_producer, store_accumulator, struct_bytes, sw128_atoms,
                     table_pipe, thread_roles, tile_class, tile_coords, tile_table, tma_pipeline, tma_views, turn_pass,
                     turn_wait)

KERNELS = ("fwd_sm90",)


class QkvLoads(NamedTuple):
    """Host-side set-up of Q, K and V loads (``LazyAttentionFwdSm90._qkv_loads``)."""
    sQ_layout: object
    sK_layout: object
    sV_layout: object
    tma_q: object
    tma_q_t: object
    tma_k: object
    tma_k_t: object
    tma_v: object
    tma_v_t: object


ARGS = {
    "fwd_sm90": [
        "q fp16/bf16 [B,H,L,D] contiguous",
        "k fp16/bf16 [B,Hkv,L,D] contiguous",
        "v fp16/bf16 [B,Hkv,L,D] contiguous",
        "bias fp32 [H,W] contiguous",
        "tau fp32 [H]",
        "lengths int32 [B] (L when no padding; values in [0, L])",
        "lse fp32 [B,H,L] (read: lse_sm90's, natural log)",
        "o fp16/bf16 [B,H,L,D] (written)",
        "counter int32 [1] (zero; the persistent CTAs' tile tickets, zero again at the end)",
        "ctas int (python scalar: CTAs to launch, the SM count)",
        "scale float (python scalar)",
    ]
}

BM = 128  # query rows per CTA (two consumer warpgroups of WM)
WM = 64  # query rows per consumer warpgroup
BN = 128  # keys per tile
STAGES = {64: 8, 128: 5}  # K/V ring depth per head dim (shared memory: Q + STAGES tiles of BN x D)
NUM_THREADS = 3 * WG
PRODUCER_REGS = 24
CONSUMER_REGS = 240
TABLE = 256  # entries of one bias-by-diagonal table (BM + BN - 1 used)
CTA_TABLE = 8192  # entries of the CTA's two tables (tile parities) over every distance a tile sees (where they fit)
CONSUMER_BARRIER = 1  # named barrier id of the 256 consumer threads (0 is __syncthreads)
PINGPONG = True  # the two consumer warpgroups take turns issuing wgmma
# programmatic dependent launch after lse_sm90 (which triggers it at its start): this kernel's CTAs start on the SMs
# lse_sm90's CTAs leave, load their first tiles and tables, and the consumers wait for lse_sm90's grid before any LSE
DEPENDENT_LAUNCH = True
# measurement switch (wrong results; docs/cute-backend.md): "no_exp" makes every exp2 of a tile a copy of its
# argument, "no_gemm" issues no wgmma (barriers, turns and waits unchanged), "loads_only" also skips the row work
# (what is left: the TMA loads, pipelines, turns and table fills), "half_loads" / "no_loads" skip every other K / V
# load or all of them (the stage keeps stale data; the producer completes its barrier's bytes itself); "no_tiles"
# runs no key tile at all (what is left: each tile's prologue and its O store of zeros); several joined by "+"; "" is
# the kernel. lse_sm90's row folds go through this module's _exp2 and _gemm_s: "no_exp" and "no_gemm" set here apply
# to it too, and so does "no_tiles"; "no_max" (lse_sm90 only) skips its free tiles' row max; "mask_free" (both
# kernels) folds every tile as a free one (no bias, no mask).
ABLATE = ""


def _x2(dtype) -> str:
    """The PTX type of a pair of ``dtype`` (bf16 or fp16)."""
    return "bf16x2" if dtype is cutlass.BFloat16 else "f16x2"


@cute.jit
def packed_relu(hi, lo, dtype) -> cutlass.Int32:
    """max(hi, 0), max(lo, 0) (fp32) rounded to ``dtype`` (bf16 / fp16) and packed, lo in the low half; NaN stays
    NaN (``cvt.rn.relu``)."""
    return cutlass.Int32(llvm.inline_asm(
        cutlass.Int32.mlir_type, [cutlass.Float32(hi).ir_value(), cutlass.Float32(lo).ir_value()],
        f"cvt.rn.relu.{_x2(dtype)}.f32 $0, $1, $2;", "=r,f,f", has_side_effects=False, is_align_stack=False,
        asm_dialect=llvm.AsmDialect.AD_ATT))


@cute.jit
def packed_min(a, b, dtype) -> cutlass.Int32:
    """The halfwise minimum of two packed pairs of ``dtype``; NaN if either is (``min.NaN``)."""
    return cutlass.Int32(llvm.inline_asm(
        cutlass.Int32.mlir_type, [cutlass.Int32(a).ir_value(), cutlass.Int32(b).ir_value()],
        f"min.NaN.{_x2(dtype)} $0, $1, $2;", "=r,r,r", has_side_effects=False, is_align_stack=False,
        asm_dialect=llvm.AsmDialect.AD_ATT))


class LazyAttentionFwdSm90(HopperKernel):
    STAGES = STAGES

    def key_tile(self) -> int:
        """Keys per score tile (the bias view of ``_scores`` is indexed by row - key + key_tile - 1)."""
        return BN

    # ------------------------------------------------------------------ host side
    @cute.jit
    def __call__(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mBias: cute.Tensor, mTau: cute.Tensor,
                 mLens: cute.Tensor, mLSE: cute.Tensor, mO: cute.Tensor, mCounter: cute.Tensor, ctas: cutlass.Int32,
                 scale: cutlass.Float32, stream):
        D = self.D
        dt = self.dtype
        # S = Q K^T per consumer warpgroup: A = its Q half (WM x D), B = K (BN x D)
        qk_mma, qk_rest = score_mmas(dt, WM, BN)
        # O += A V: A from registers (WM x BN per warpgroup), B = V^T (D x BN, D contiguous)
        pv_mma = accumulate_mma(dt, WM, D)

        sQ_layout, sK_layout, sV_layout, tma_q, tma_q_t, tma_k, tma_k_t, tma_v, tma_v_t = self._qkv_loads(mQ, mK, mV)

        @cute.struct
        class SharedStorage:
            tile_mbar: cute.struct.MemRange[cutlass.Int64, 2 * SCHEDULE_STAGES]  # the tile-index pipe
            tile: cute.struct.MemRange[cutlass.Int32, SCHEDULE_STAGES]
            table_mbar: cute.struct.MemRange[cutlass.Int64, 4]  # full[2], empty[2] of the two bias tables
            q_mbar: cute.struct.MemRange[cutlass.Int64, 2]  # full, empty of the 1-stage Q pipeline
            kv_mbar: cute.struct.MemRange[cutlass.Int64, 2 * self.stages]  # full[STAGES], empty[STAGES]
            sQ: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sQ_layout)], 1024]
            sKV: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sK_layout)], 1024]
            # bias by distance: the CTA's whole table, or (W too large for it) two per-tile buffers of TABLE
            sT: cute.struct.Align[cute.struct.MemRange[cutlass.Float32, max(CTA_TABLE, 2 * TABLE)], 16]

        L = mQ.shape[2]
        n_mblocks = (L + BM - 1) // BM
        self.kernel(qk_mma, qk_rest, pv_mma, tma_q, tma_q_t, tma_k, tma_k_t, tma_v, tma_v_t, mBias, mTau, mLens, mLSE,
                    mO, mCounter, scale, sQ_layout, sK_layout, sV_layout, SharedStorage).launch(
            grid=persistent_grid(ctas, n_mblocks, mQ.shape[1], mQ.shape[0]), block=[NUM_THREADS, 1, 1],
            smem=SharedStorage.size_in_bytes(), stream=stream, min_blocks_per_mp=1, use_pdl=DEPENDENT_LAUNCH)

    # ------------------------------------------------------------------ helpers
    def _qkv_smem(self, storage, sQ_layout, sK_layout, sV_layout):
        """(sQ, sK, sV) in ``storage`` (fields sQ, sKV): the Q halves and the K / V ring, a V stage being the same
        bytes as a K stage seen through V's layout."""
        sQ = storage.sQ.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)
        sK = storage.sKV.get_tensor(sK_layout.outer, swizzle=sK_layout.inner)
        return sQ, sK, cute.make_tensor(cute.recast_ptr(sK.iterator, sV_layout.inner), sV_layout.outer)

    def _qkv_loads(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor) -> QkvLoads:
        """The shared-memory layouts (Q as two halves [WM, D], the K / V ring of ``self.stages`` tiles) and the TMA
        atoms with their global views: (rows, D, head, batch) for Q and K, (D, keys, head, batch) for V."""
        D = self.D
        k_atom, mn_atom = sw128_atoms(self.dtype)
        sQ_layout = cute.tile_to_shape(k_atom, (WM, D, 2), order=(0, 1, 2))  # one half [WM, D] per warpgroup
        sK_layout = cute.tile_to_shape(k_atom, (BN, D, self.stages), order=(0, 1, 2))
        sV_layout = cute.tile_to_shape(mn_atom, (D, BN, self.stages), order=(1, 0, 2))
        q_t = cute.make_tensor(mQ.iterator, cute.select(mQ.layout, mode=[2, 3, 1, 0]))
        k_t = cute.make_tensor(mK.iterator, cute.select(mK.layout, mode=[2, 3, 1, 0]))
        v_t = cute.make_tensor(mV.iterator, cute.select(mV.layout, mode=[3, 2, 1, 0]))
        g2s = cpasync.CopyBulkTensorTileG2SOp()
        tma_q, tma_q_t = cpasync.make_tiled_tma_atom(g2s, q_t, cute.slice_(sQ_layout, (None, None, 0)), (WM, D))
        tma_k, tma_k_t = cpasync.make_tiled_tma_atom(g2s, k_t, cute.slice_(sK_layout, (None, None, 0)), (BN, D))
        tma_v, tma_v_t = cpasync.make_tiled_tma_atom(g2s, v_t, cute.slice_(sV_layout, (None, None, 0)), (D, BN))
        return QkvLoads(sQ_layout, sK_layout, sV_layout, tma_q, tma_q_t, tma_k, tma_k_t, tma_v, tma_v_t)

    def _exp2(self, x, fastmath=True):
        if cutlass.const_expr("no_exp" in ABLATE.split("+")):
            return x
        return cute.math.exp2(x, fastmath=fastmath)

    @cute.jit
    def _scores(self, acc_mn, tScS_mn, sT, m0, n0, lb, sc2, masked, span):
        """acc_mn (raw q.k) -> log2-domain scores with bias (from the table sT) and, where ``masked`` (the tile
        crosses lengths[b] or, causal, the diagonal), masks, in place. Masked entries are set to -inf by a select
        (never by adding -inf: a NaN product of a masked key must not reach its row). A tile that crosses lengths[b]
        (or any masked tile, not causal) may see distances past the table (keys or rows beyond lengths[b], far from
        the band): its indices are clamped to ``span`` (:class:`_tiles.TableSpan`), whose end entries hold bias 0; a
        causal tile before lengths[b] sees only the table's distances and takes the causal mask alone."""
        cut = n0 + self.key_tile() > lb
        if cutlass.const_expr(not self.causal):
            cut = True
        if not masked:
            for c in cutlass.range_constexpr(cute.size(acc_mn.shape[1])):
                j = tScS_mn[0, c][1]
                for r in cutlass.range_constexpr(cute.size(acc_mn.shape[0])):
                    acc_mn[r, c] = acc_mn[r, c] * sc2 + sT[tScS_mn[r, 0][0] - j + (self.key_tile() - 1)]
        elif not cut:
            for c in cutlass.range_constexpr(cute.size(acc_mn.shape[1])):
                j = tScS_mn[0, c][1]
                for r in cutlass.range_constexpr(cute.size(acc_mn.shape[0])):
                    i = tScS_mn[r, 0][0]
                    val = acc_mn[r, c] * sc2 + sT[i - j + (self.key_tile() - 1)]
                    acc_mn[r, c] = val if n0 + j <= m0 + i else -cutlass.Float32.inf
        else:
            for c in cutlass.range_constexpr(cute.size(acc_mn.shape[1])):
                j = tScS_mn[0, c][1]
                key_ok = n0 + j < lb
                for r in cutlass.range_constexpr(cute.size(acc_mn.shape[0])):
                    i = tScS_mn[r, 0][0]
                    val = acc_mn[r, c] * sc2 + sT[cutlass.min(cutlass.max(i - j + (self.key_tile() - 1), span.lo),
                                                           span.hi)]
                    ok = key_ok
                    if cutlass.const_expr(self.causal):
                        ok = key_ok and (n0 + j <= m0 + i)
                    acc_mn[r, c] = val if ok else -cutlass.Float32.inf

    @cute.jit
    def _gemm_s(self, qk_first, qk_rest, acc_S, tSrQ, tSrK, stage):
        """Issue acc_S = Q_wg K(stage)^T (no fence, commit or wait). qk_first overwrites the accumulator (k-block 0),
        qk_rest accumulates: two MMA objects whose ACCUMULATE field is set once, outside the loops (a set() inside a
        staged loop would escape its region)."""
        for k in cutlass.range_constexpr(cute.size(tSrQ.shape[2])):
            if cutlass.const_expr(not {"no_gemm", "loads_only"} & set(ABLATE.split("+"))):
                cute.gemm(qk_first if k == 0 else qk_rest, acc_S, tSrQ[None, None, k], tSrK[None, None, k, stage],
                          acc_S)

    @cute.jit
    def _gemm_pv(self, pv_mma, acc_O, tOrP, tOrV, stage, k_blocks: cutlass.Constexpr = None):
        """Issue acc_O += A V(stage) with A from registers (no fence, commit or wait); the first ``k_blocks`` key
        blocks of 16 only where given (A is 0 on the others)."""
        for k in cutlass.range_constexpr(cute.size(tOrP.shape[2]) if cutlass.const_expr(k_blocks is None)
                                         else k_blocks):
            if cutlass.const_expr(not {"no_gemm", "loads_only"} & set(ABLATE.split("+"))):
                cute.gemm(pv_mma, acc_O, tOrP[None, None, k], tOrV[None, None, k, stage], acc_O)

    @cute.jit
    def _issue_s(self, qk_first, qk_rest, acc_S, tSrQ, tSrK, stage, wg):
        """One ping-pong turn issuing acc_S = Q_wg K(stage)^T as its own wgmma group; returns without waiting."""
        warpgroup.fence()
        turn_wait(wg, PINGPONG)
        self._gemm_s(qk_first, qk_rest, acc_S, tSrQ, tSrK, stage)
        warpgroup.commit_group()
        turn_pass(wg, PINGPONG)

    @cute.jit
    def _tile(self, acc_mn, n0, sT, fills, ctid, m0, lb, W, mBias, h, tScS_mn, sc2, lse2, thr, cta, tbl_pipe,
              tbl_state):
        """A = relu(P + tau / i) of the tile at keys n0 in place (:meth:`_elastic_rows`); returns the updated count of
        per-tile fills. The bias of a non-free tile comes from the CTA's table or, where W is too large for it, a
        per-tile table filled here (``cta``: :class:`_tiles.CtaTable`)."""
        free, masked = tile_class(m0, n0, lb, W, BM, BN, self.causal)
        if cutlass.const_expr("mask_free" in ABLATE.split("+")):  # timing only: every tile folds as a free one
            free = True
        if not free:
            tbl_pipe.consumer_wait(tbl_state)  # the tile's table complete
        tbl, span, fills = tile_table(sT, cta, fills, not free, ctid, m0, n0, W, mBias, h, BM, BN, TABLE, self.causal,
                                      CONSUMER_BARRIER, 2 * WG)
        self._elastic_rows(acc_mn, free, masked, span, tScS_mn, tbl, m0, n0, lb, sc2, lse2, thr)
        return fills

    @cute.jit
    def _elastic_rows(self, acc_mn, free, masked, span, tScS_mn, tbl, m0, n0, lb, sc2, lse2, thr):
        """A tile's raw scores -> P + tau / i in place, P = exp2(S2 - lse2), masked entries 0 (by a select: a masked
        score, NaN included, never reaches them); :meth:`_to_a` applies the relu and caps P at 1 as it packs A."""
        if cutlass.const_expr("loads_only" in ABLATE.split("+")):
            return
        zero = cutlass.Float32(0.0)
        if free:
            self._shifted_rows(acc_mn, lse2, thr, sc2, True)
        elif not masked:
            self._scores(acc_mn, tScS_mn, tbl, m0, n0, lb, sc2, masked, span)
            self._shifted_rows(acc_mn, lse2, thr, sc2, False)
        elif self.causal and n0 + BN <= lb:
            self._diagonal_rows(acc_mn, tScS_mn, tbl, m0, n0, sc2, lse2, thr)
        else:
            self._scores(acc_mn, tScS_mn, tbl, m0, n0, lb, sc2, masked, span)
            for r in cutlass.range_constexpr(cute.size(acc_mn.shape[0])):
                for c in cutlass.range_constexpr(cute.size(acc_mn.shape[1])):
                    s2 = acc_mn[r, c]
                    y = self._exp2(s2 - lse2[r]) + thr[r]
                    acc_mn[r, c] = zero if s2 == -cutlass.Float32.inf else y

    @cute.jit
    def _diagonal_rows(self, acc_mn, tScS_mn, tbl, m0, n0, sc2, lse2, thr):
        """P + tau / i of the causal diagonal tile (n0 = m0; before lengths[b], so every index is inside the table),
        0 where masked: of the first warpgroup's rows (m0 .. m0 + WM - 1) keys n0 + WM .. follow every row (0 without
        exponentials) and the first WM keys need the mask; of the second warpgroup's the first WM keys precede every
        row and the others need it. Columns c < half are keys n0 .. n0 + WM - 1. A masked entry is 0 by one select (its score,
        NaN included, never reaches A)."""
        half = cute.size(acc_mn.shape[1]) // 2
        if tScS_mn[0, 0][0] < WM:  # this warpgroup's rows are the CTA's first WM
            self._diagonal_part(acc_mn, tScS_mn, tbl, m0, n0, sc2, lse2, thr, range(half), True)
            for r in cutlass.range_constexpr(cute.size(acc_mn.shape[0])):
                for c in cutlass.range_constexpr(half, cute.size(acc_mn.shape[1])):
                    acc_mn[r, c] = cutlass.Float32(0.0)
        else:
            self._diagonal_part(acc_mn, tScS_mn, tbl, m0, n0, sc2, lse2, thr, range(half), False)
            self._diagonal_part(acc_mn, tScS_mn, tbl, m0, n0, sc2, lse2, thr,
                                range(half, cute.size(acc_mn.shape[1])), True)

    @cute.jit
    def _diagonal_part(self, acc_mn, tScS_mn, tbl, m0, n0, sc2, lse2, thr, cols: cutlass.Constexpr,
                       mask: cutlass.Constexpr):
        """P + tau / i of the diagonal tile's columns ``cols``, 0 where the causal mask cuts (where ``mask``)."""
        zero = cutlass.Float32(0.0)
        for r in cutlass.range_constexpr(cute.size(acc_mn.shape[0])):
            i = tScS_mn[r, 0][0]
            for c in cutlass.range_constexpr(cols.start, cols.stop):
                j = tScS_mn[0, c][1]
                x = acc_mn[r, c] * sc2 + tbl[i - j + (BN - 1)] - lse2[r]
                a = self._exp2(x) + thr[r]
                if cutlass.const_expr(mask):
                    a = a if n0 + j <= m0 + i else zero
                acc_mn[r, c] = a

    @cute.jit
    def _row_constants(self, lse2, thr, cap, tau_h, tOcO_mn, m0, lb):
        """lse2 (holding each row's stored LSE) <- its log2 LSE, as the backward recovers it; thr <- tau / i; cap <-
        max(1 + tau / i, 0) as a packed pair of the 16-bit type (:meth:`_to_a`)."""
        for r in cutlass.range_constexpr(cute.size(lse2.shape[0])):
            lse2[r] = lse2[r] * LOG2E
            if cutlass.const_expr(self.causal):
                thr[r] = tau_h / cutlass.Float32(m0 + tOcO_mn[r, 0][0] + 1)
            else:
                thr[r] = tau_h / cutlass.Float32(lb)
            one = thr[r] + 1.0
            cap[r] = packed_relu(one, one, self.dtype)

    @cute.jit
    def _shifted_rows(self, acc_mn, lse2, thr, sc2, raw: cutlass.Constexpr):
        """Scores without masks (``raw``: q.k, scaled here) -> P + tau / i = exp2(S2 - lse2) + tau / i."""
        for r in cutlass.range_constexpr(cute.size(acc_mn.shape[0])):
            for c in cutlass.range_constexpr(cute.size(acc_mn.shape[1])):
                x = acc_mn[r, c] * sc2 - lse2[r] if cutlass.const_expr(raw) else acc_mn[r, c] - lse2[r]
                acc_mn[r, c] = self._exp2(x) + thr[r]

    @cute.jit
    def _to_a(self, acc_S, tOrP, cap):
        """The A operand of O += A V from acc_S's P + tau / i (fp32): A = min(relu(P + tau / i), cap) with cap =
        max(1 + tau / i, 0) per row, the relu in the packing conversion and the min on the packed pair, both keeping
        NaN. That is relu(min(P, 1) + tau / i) rounded to the 16-bit type, as SPEC's P = exp2(min(S2 - LSE2, 0))
        gives it: P <= 1 whatever the rounding (rounding to nearest is monotone, so capping before or after it is
        one value). Element pair (2k, 2k + 1) of the m64nN accumulator ((2, 2, N/8), 1, 1) is columns (c, c + 1) of
        the thread's row k % 2: one 32-bit register of A."""
        assert cute.size(acc_S.shape[1]) == 1 and cute.size(acc_S.shape[2]) == 1
        packed = cute.recast_tensor(tOrP, cutlass.Int32)
        for k in cutlass.range_constexpr(cute.size(packed)):
            packed[k] = packed_min(packed_relu(acc_S[2 * k + 1], acc_S[2 * k], self.dtype), cap[k % 2], self.dtype)

    @cute.jit
    def _load(self, kv_pipe, kv_state, tma, src, stages, count):
        """One K or V tile into ``stages``' stage of ``kv_state``, after acquiring it (the caller advances the
        state); under the "half_loads" / "no_loads" switches a skipped tile's bytes are completed on the stage's
        barrier instead (timing only)."""
        kv_pipe.producer_acquire(kv_state)
        dst = stages[None, kv_state.index]
        skip = False
        if cutlass.const_expr("no_loads" in ABLATE.split("+")):
            skip = True
        if cutlass.const_expr("half_loads" in ABLATE.split("+")):
            skip = count % 2 == 1
        if skip:
            bar = kv_pipe.producer_get_barrier(kv_state).toint()
            with cute.arch.elect_one():
                llvm.inline_asm(None, [bar.ir_value(), cutlass.Int32(BN * self.D * self.dtype.width // 8).ir_value()],
                                "mbarrier.complete_tx.shared::cta.b64 [$0], $1;", "r,r", has_side_effects=True,
                                is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT)
        else:
            cute.copy(tma, src, dst, tma_bar_ptr=kv_pipe.producer_get_barrier(kv_state))

    @cute.jit
    def _load_tile(self, q_pipe, kv_pipe, q_state, kv_state, count, tma_q, tma_q_t, tma_k, tma_k_t, tma_v, tma_v_t,
                   sQ, sK, sV, h, b, hk, mb, n_blocks):
        """The producer warp's loads of one tile: Q as two halves [WM, D] (once the consumers' last score GEMMs of
        the previous tile are done), then K and V in the consumers' order: K(0), then K(nb), V(nb - 1), then
        V(n - 1). Returns the advanced (q_state, kv_state, count of K / V loads), which the caller assigns: a state
        advanced in a called function and not handed back is not carried by the caller's loop."""
        D = self.D
        gQ = cute.local_tile(tma_q_t[None, None, h, b], (WM, D), (None, 0))  # (WM, D, query halves)
        gK = cute.local_tile(tma_k_t[None, None, hk, b], (BN, D), (None, 0))
        gV = cute.local_tile(tma_v_t[None, None, hk, b], (D, BN), (0, None))
        tQsQ, tQgQ = tma_views(tma_q, sQ, gQ)
        tKsK, tKgK = tma_views(tma_k, sK, gK)
        tVsV, tVgV = tma_views(tma_v, sV, gV)
        load_row_block(q_pipe, [(tma_q, tQgQ, tQsQ)], 2 * mb, 2, q_state)
        q_state.advance()
        for nb in cutlass.range(n_blocks, unroll=1):
            self._load(kv_pipe, kv_state, tma_k, tKgK[None, nb], tKsK, count)
            kv_state.advance()
            count += 1
            if nb > 0:
                self._load(kv_pipe, kv_state, tma_v, tVgV[None, nb - 1], tVsV, count)
                kv_state.advance()
                count += 1
        if n_blocks > 0:
            self._load(kv_pipe, kv_state, tma_v, tVgV[None, n_blocks - 1], tVsV, count)
            kv_state.advance()
        return q_state, kv_state, count

    @cute.jit
    def _zero_v_rows(self, sV, stage, n0, lb, L, ctid):
        """Zero the V rows of a stage at key positions >= lengths[b] (A is 0 there, but 0 * NaN is NaN); the 256
        consumer threads split the elements, then a proxy fence and barrier 1 put the zeros before any wgmma."""
        if n0 + BN > lb and lb < L:
            sVs = sV[None, None, stage]
            for i in cutlass.range(ctid, BN * self.D, 2 * WG, unroll=1):
                j = i // self.D
                if n0 + j >= lb:
                    sVs[i - j * self.D, j] = self.dtype(0.0)
            cute.arch.fence_proxy("async.shared", space="cta")
            cute.arch.barrier(barrier_id=CONSUMER_BARRIER, number_of_threads=2 * WG)

    @cute.jit
    def _forward_tiles(self, qk_mma: cute.TiledMma, qk_rest: cute.TiledMma, pv_mma: cute.TiledMma, sQ, sK, sV, sT,
                       sTile, tile_pipe, tbl_pipe, q_pipe, kv_pipe, mBias, mTau, mLens, mLSE, mO, scale, tidx, wg_idx,
                       H, Hkv, L, W, n_mblocks, total):
        """Consumer warpgroups 1 and 2 (64 query rows each): every tile of the CTA, from the tile pipe until an index
        >= ``total``: O = relu(P + tau / i) V from each row's LSE (``mLSE``), stored to ``mO``. The module
        docstring gives the synchronisation."""
        D = self.D
        dt = self.dtype
        qk_mma.set(warpgroup.Field.ACCUMULATE, False)
        qk_rest.set(warpgroup.Field.ACCUMULATE, True)
        pv_mma.set(warpgroup.Field.ACCUMULATE, True)  # acc_O starts from zeros
        ctid = tidx - WG  # 0 .. 255 over both consumer warpgroups
        wg = wg_idx - 1  # 0 or 1: this warpgroup's query half and ping-pong slot
        wtid = tidx % WG
        sc2 = scale * LOG2E

        thr_qk = qk_mma.get_slice(wtid)
        thr_pv = pv_mma.get_slice(wtid)
        tSrQ = thr_qk.make_fragment_A(thr_qk.partition_A(sQ[None, None, wg]))  # (MMA, MMA_M, MMA_K)
        tSrK = thr_qk.make_fragment_B(thr_qk.partition_B(sK))  # (MMA, MMA_N, MMA_K, STAGES)
        tOrV = thr_pv.make_fragment_B(thr_pv.partition_B(sV))  # (MMA, MMA_N, MMA_K, STAGES)
        acc_S = thr_qk.make_fragment_C(thr_qk.partition_shape_C((WM, BN)))
        acc_O = thr_pv.make_fragment_C(thr_pv.partition_shape_C((WM, D)))
        # the A operand of O += A V: same registers order as acc_S (for 16-bit types the accumulator of
        # m64nNk16 and the register A operand of m64nDk16 hold a thread's values in the same order, k-block
        # by k-block of 16 columns), so acc_S converts pair by pair (_to_a)
        tOrP = cute.make_rmem_tensor(thr_pv.partition_shape_A((WM, BN)), dt)

        # coordinates within the CTA's [BM, BN] / [BM, D] tiles (this warpgroup's rows: WM * wg + 0 .. WM - 1)
        cS = cute.local_tile(cute.make_identity_tensor((BM, BN)), (WM, BN), (wg, 0))
        cO = cute.local_tile(cute.make_identity_tensor((BM, D)), (WM, D), (wg, 0))
        tScS_mn = acc_mn_view(thr_qk.partition_C(cS))
        tOcO_mn = acc_mn_view(thr_pv.partition_C(cO))
        acc_S_mn = acc_mn_view(acc_S)
        acc_O_mn = acc_mn_view(acc_O)
        n_rows = cute.size(acc_S_mn.shape[0])

        lse2 = cute.make_rmem_tensor((n_rows,), cutlass.Float32)
        thr = cute.make_rmem_tensor((n_rows,), cutlass.Float32)
        cap = cute.make_rmem_tensor((n_rows,), cutlass.Int32)

        tile_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, SCHEDULE_STAGES)
        q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, 1)
        kv_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
        # bias tables filled so far: fill k writes buffer k % 2; a thread starts fill k only after the barrier
        # of fill k - 1, which every consumer reaches only after its reads of buffer k % 2 (tile of fill k - 2)
        fills = cutlass.Int32(0)
        tbl_read = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, 2)
        tile = receive_tile(tile_pipe, tile_state, sTile)
        tile_state.advance()
        if cutlass.const_expr(DEPENDENT_LAUNCH):  # lse_sm90's LSE complete and visible (its grid has ended)
            cute.arch.griddepcontrol_wait()
        if cutlass.const_expr(PINGPONG):
            if wg == 1:  # warpgroup 0 takes the first turn; the turns go on across the CTA's tiles
                cute.arch.barrier_arrive(barrier_id=ORDER_BARRIER, number_of_threads=2 * WG)
        while tile < total:
            bx, h, b, hk = tile_coords(tile, H, Hkv, n_mblocks)
            mb, m0, lb, n_seen = query_block(bx, L, mLens[b], BM, BN, self.causal)
            n_blocks = n_seen if m0 < lb else 0  # key tiles (none where every row is at or past lengths[b])
            if cutlass.const_expr("no_tiles" in ABLATE.split("+")):
                n_blocks = 0

            # ---------------- the CTA's bias table for this head, in the half of sT of the tile's parity (W too
            # large for it: per-tile tables, ``_tile``)
            sTk = cute.make_tensor(sT.iterator + tbl_read.index * (CTA_TABLE // 2),
                                   cute.make_layout(CTA_TABLE // 2))
            cta = cta_table_extent(W, L, BM, BN, self.causal, CTA_TABLE // 2)

            # ---------------- each row's LSE and its head's tau, loaded here and first used after the tile's first
            # score GEMM is issued (``_row_constants``): the loads' latency runs under the Q wait and that GEMM
            for r in cutlass.range_constexpr(n_rows):
                lse2[r] = mLSE[b, h, cutlass.min(m0 + tOcO_mn[r, 0][0], L - 1)]
            tau_h = mTau[h]

            # ---------------- Q: wait for its TMA; rows at positions >= lengths[b] become zeros
            q_pipe.consumer_wait(q_state)
            if m0 + BM > lb and lb < L:  # (rows >= L arrive as zeros: TMA's out-of-bounds fill)
                for i in cutlass.range(ctid, BM * D, 2 * WG, unroll=1):
                    r = i // D
                    if m0 + r >= lb:
                        sQ[r % WM, i - r * D, r // WM] = dt(0.0)
                cute.arch.fence_proxy("async.shared", space="cta")  # generic stores -> wgmma (async proxy)
                cute.arch.barrier(barrier_id=CONSUMER_BARRIER, number_of_threads=2 * WG)
            if n_blocks == 0:  # no score GEMM reads this Q
                q_pipe.consumer_release(q_state)

            # ---------------- O = relu(P + tau / i) V. One turn issues the score GEMM of tile nb and the
            # A V GEMM of tile nb - 1; tile nb's exponentials run under the latter. The producer's order matches:
            # K(0), then K(nb), V(nb - 1) for nb = 1 .. n - 1, then V(n - 1). Q is released to the producer (the
            # next tile's) once the last score GEMM completed.
            acc_O.fill(0.0)
            if n_blocks > 0:
                kv_pipe.consumer_wait(kv_state)  # K(0) landed
                self._issue_s(qk_mma, qk_rest, acc_S, tSrQ, tSrK, kv_state.index, wg)
                self._row_constants(lse2, thr, cap, tau_h, tOcO_mn, m0, lb)
                warpgroup.wait_group(0)
                kv_pipe.consumer_release(kv_state)
                if n_blocks == 1:
                    q_pipe.consumer_release(q_state)
                kv_state.advance()
                fills = self._tile(acc_S_mn, 0, sTk, fills, ctid, m0, lb, W, mBias, h, tScS_mn, sc2, lse2, thr,
                                   cta, tbl_pipe, tbl_read)
                self._to_a(acc_S, tOrP, cap)
            for nb in cutlass.range(1, n_blocks, unroll=1):
                n0 = nb * BN
                k_state = kv_state.clone()
                kv_state.advance()  # now V(nb - 1)
                kv_pipe.consumer_wait(k_state)  # K(nb) landed
                kv_pipe.consumer_wait(kv_state)  # V(nb - 1) landed
                self._zero_v_rows(sV, kv_state.index, n0 - BN, lb, L, ctid)
                warpgroup.fence()
                turn_wait(wg, PINGPONG)
                self._gemm_s(qk_mma, qk_rest, acc_S, tSrQ, tSrK, k_state.index)
                warpgroup.commit_group()
                self._gemm_pv(pv_mma, acc_O, tOrP, tOrV, kv_state.index)
                warpgroup.commit_group()
                turn_pass(wg, PINGPONG)
                warpgroup.wait_group(1)  # S of tile nb complete; A V of tile nb - 1 still running
                kv_pipe.consumer_release(k_state)
                if nb == n_blocks - 1:
                    q_pipe.consumer_release(q_state)
                fills = self._tile(acc_S_mn, n0, sTk, fills, ctid, m0, lb, W, mBias, h, tScS_mn, sc2, lse2,
                                   thr, cta, tbl_pipe, tbl_read)
                warpgroup.wait_group(0)  # A V of tile nb - 1 complete: its A registers and V(nb - 1) are free
                kv_pipe.consumer_release(kv_state)
                kv_state.advance()
                self._to_a(acc_S, tOrP, cap)
            if n_blocks > 0:
                kv_pipe.consumer_wait(kv_state)  # V(n - 1) landed
                self._zero_v_rows(sV, kv_state.index, (n_blocks - 1) * BN, lb, L, ctid)
                warpgroup.fence()
                turn_wait(wg, PINGPONG)
                # the diagonal tile of the first warpgroup's rows (``_diagonal_rows``): A is 0 on keys m0 + WM ..
                half_pv = wg == 0 and (n_blocks - 1) * BN == m0 and m0 + BN <= lb
                if cutlass.const_expr(not self.causal):
                    half_pv = False
                if half_pv:
                    self._gemm_pv(pv_mma, acc_O, tOrP, tOrV, kv_state.index, cute.size(tOrP.shape[2]) // 2)
                    warpgroup.commit_group()
                    turn_pass(wg, PINGPONG)
                    warpgroup.wait_group(0)
                else:
                    self._gemm_pv(pv_mma, acc_O, tOrP, tOrV, kv_state.index)
                    warpgroup.commit_group()
                    turn_pass(wg, PINGPONG)
                    warpgroup.wait_group(0)
                kv_pipe.consumer_release(kv_state)
                kv_state.advance()
            q_state.advance()
            tbl_pipe.consumer_release(tbl_read)  # this thread's last read of the tile's table done
            tbl_read.advance()

            # ---------------- epilogue: rows >= lengths[b] exactly zero; rows < L stored from registers
            for r in cutlass.range_constexpr(n_rows):
                m = m0 + tOcO_mn[r, 0][0]
                if m >= lb:
                    acc_O_mn[r, None] = cute.full_like(acc_O_mn[r, None].load(), 0.0)
            gO = cute.local_tile(mO[b, h, None, None], (WM, D), (2 * mb + wg, 0))
            store_accumulator(pv_mma, acc_O, gO, tOcO_mn, m0, L, wtid, dt)
            tile = receive_tile(tile_pipe, tile_state, sTile)
            tile_state.advance()
        if cutlass.const_expr(PINGPONG):
            if wg == 0:  # consume warpgroup 1's last hand-over, so no arrival is left on a barrier at exit
                cute.arch.barrier(barrier_id=ORDER_BARRIER, number_of_threads=2 * WG)

    # ------------------------------------------------------------------ kernel
    @cute.kernel
    def kernel(self, qk_mma: cute.TiledMma, qk_rest: cute.TiledMma, pv_mma: cute.TiledMma, tma_q: cute.CopyAtom,
               tma_q_t: cute.Tensor,
               tma_k: cute.CopyAtom, tma_k_t: cute.Tensor, tma_v: cute.CopyAtom, tma_v_t: cute.Tensor,
               mBias: cute.Tensor, mTau: cute.Tensor, mLens: cute.Tensor, mLSE: cute.Tensor, mO: cute.Tensor,
               mCounter: cute.Tensor, scale: cutlass.Float32, sQ_layout: cute.ComposedLayout,
               sK_layout: cute.ComposedLayout, sV_layout: cute.ComposedLayout, SharedStorage: cutlass.Constexpr):
        D = self.D
        dt = self.dtype
        tidx, warp_idx, wg_idx = thread_roles()
        L, H, B, Hkv, W, n_mblocks, total = persistent_dims(mO, tma_k_t, mBias, BM)

        storage = cutlass.memory.SmemAllocator().allocate(SharedStorage)
        sQ, sK, sV = self._qkv_smem(storage, sQ_layout, sK_layout, sV_layout)
        sT = storage.sT.get_tensor(cute.make_layout(max(CTA_TABLE, 2 * TABLE)))
        sTile = storage.tile.get_tensor(cute.make_layout(SCHEDULE_STAGES))

        # pipelines (every thread takes part in the mbarrier init and the CTA barrier create() ends with)
        tile_pipe = schedule_pipe(storage.tile_mbar.data_ptr(), 2 * WG + TABLE_FILLERS)
        tbl_pipe = table_pipe(storage.table_mbar.data_ptr(), 2 * WG, TABLE_FILLERS)
        q_pipe = tma_pipeline(storage.q_mbar.data_ptr(), 1, BM * D * dt.width // 8)
        kv_pipe = tma_pipeline(storage.kv_mbar.data_ptr(), self.stages, BN * D * dt.width // 8)

        if wg_idx == 0:
            # ============================ producer warpgroup: warp 0 claims the tiles and issues the TMA loads
            cute.arch.warpgroup_reg_dealloc(PRODUCER_REGS)
            if warp_idx == 0:
                cpasync.prefetch_descriptor(tma_q)
                cpasync.prefetch_descriptor(tma_k)
                cpasync.prefetch_descriptor(tma_v)
                tile, tile_state, q_state, kv_state = start_producer(tile_pipe, sTile, self.stages)
                count = cutlass.Int32(0)  # loads issued (the measurement switches skip by it)
                while tile < total:
                    bx, h, b, hk = tile_coords(tile, H, Hkv, n_mblocks)
                    mb, m0, lb, n_seen = query_block(bx, L, mLens[b], BM, BN, self.causal)
                    n_blocks = n_seen if m0 < lb else 0
                    if cutlass.const_expr("no_tiles" in ABLATE.split("+")):
                        n_blocks = 0
                    q_state, kv_state, count = self._load_tile(q_pipe, kv_pipe, q_state, kv_state, count, tma_q,
                                                               tma_q_t, tma_k, tma_k_t, tma_v, tma_v_t, sQ, sK, sV,
                                                               h, b, hk, mb, n_blocks)
                    tile = claim_next_tile(mCounter, total)
                    publish_tile(tile_pipe, tile_state, sTile, tile)
                    tile_state.advance()
            else:  # warps 1..3: each tile's bias table, a tile ahead of the consumers
                fill_tables_ahead(tile_pipe, tbl_pipe, sTile, sT, tidx - 32, total, H, Hkv, n_mblocks, W, L, mBias,
                                  BM, BN, self.causal, CTA_TABLE // 2)
        else:
            # ============================ consumer warpgroups 1, 2: 64 query rows each
            cute.arch.warpgroup_reg_alloc(CONSUMER_REGS)
            self._forward_tiles(qk_mma, qk_rest, pv_mma, sQ, sK, sV, sT, sTile, tile_pipe, tbl_pipe, q_pipe, kv_pipe,
                                mBias, mTau, mLens, mLSE, mO, scale, tidx, wg_idx, H, Hkv, L, W, n_mblocks, total)

def fake_args(key: KernelKey):
    """Fake tensors (B, H, Hkv, L, W runtime) and scalars in ARGS order, plus the env stream."""
    dt, D = DSL_DTYPES[key.dtype], key.head_dim
    B, H, Hkv, L, W = (cute.sym_int() for _ in range(5))
    return [fake_rows(dt, (B, H, L, D)), fake_rows(dt, (B, Hkv, L, D)), fake_rows(dt, (B, Hkv, L, D)),
            fake_rows(cutlass.Float32, (H, W), 4), fake_rows(cutlass.Float32, (H,), 4),
            fake_rows(cutlass.Int32, (B,), 4), fake_rows(cutlass.Float32, (B, H, L), 4), fake_rows(dt, (B, H, L, D)),
            fake_rows(cutlass.Int32, (1,), 4), cutlass.Int32(1), cutlass.Float32(1.0),
            cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)]


def shared_bytes(key: KernelKey) -> int:
    """Dynamic shared memory of one CTA (SharedStorage): the Q and KV pipelines' mbarriers (8 bytes each), Q [BM, D]
    and STAGES tiles [BN, D] (each 1024-byte aligned), the fp32 bias table of CTA_TABLE entries."""
    D, el, stages = key.head_dim, 2, STAGES[key.head_dim]
    return struct_bytes(((2 * SCHEDULE_STAGES * 8, 8), (SCHEDULE_STAGES * 4, 4), (4 * 8, 8), (2 * 8, 8),
                         (2 * stages * 8, 8), (BM * D * el, 1024), (BN * D * el * stages, 1024),
                         (max(CTA_TABLE, 2 * TABLE) * 4, 16)))


def compile(key: KernelKey, options: str = "--enable-tvm-ffi"):
    """The compiled TVM FFI function for ``key`` (``key.kernel`` must be ``"fwd_sm90"``)."""
    return compile_kernel(LazyAttentionFwdSm90, KERNELS, fake_args, key, options)
