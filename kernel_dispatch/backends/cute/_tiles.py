"""Pieces shared by the cute Hopper kernels (forward, dQ, dK/dV): the op classes' base and compile step, shared
memory sizes, the wgmma tiled MMAs, swizzle atoms, TMA pipelines and partitions they set up alike, thread roles, the
query block a CTA owns, the (rows, cols) view of a wgmma accumulator, the quad reduction and balanced sums, the
ping-pong turns, the bias tables (by distance: a tile's diagonals, or every distance a CTA sees, filled by the
consumers or a tile ahead by the producer warpgroup's spare warps), which tiles need no mask or bias, which rows see
exactly one key, the 16-byte vector copy of a warpgroup's tile and the store of a warpgroup's fp32 accumulator
through shared memory."""
from typing import NamedTuple

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass.cute.nvgpu import cpasync, warpgroup

WG = 128  # threads per warpgroup
LOG2E = 1.4426950408889634
ORDER_BARRIER = 2  # named barriers 2 (consumer warpgroup 0's turn) and 3 (warpgroup 1's turn)
DSL_DTYPES = {"float16": cutlass.Float16, "bfloat16": cutlass.BFloat16}


class HopperKernel:
    """Base of the kernels' op classes: head dim D, element type, mask, and the ring depth ``STAGES[D]`` (a class
    attribute of each kernel)."""
    STAGES: dict = {}

    def __init__(self, head_dim: int, dtype, causal: bool):
        self.D = head_dim
        self.dtype = dtype
        self.causal = causal
        self.stages = self.STAGES[head_dim]


def compile_kernel(op_class, kernels: tuple, fake_args, key, options: str):
    """``cute.compile`` of ``op_class`` for ``key`` (one of ``kernels``) on the fake arguments ``fake_args(key)``."""
    if key.kernel not in kernels:
        raise ValueError(f"unknown kernel {key.kernel!r}; this module has {kernels}")
    op = op_class(key.head_dim, DSL_DTYPES[key.dtype], key.causal)
    return cute.compile(op, *fake_args(key), options=options)


def fake_rows(dtype, shape, align: int = 16):
    """A fake compact row-major tensor for ``cute.compile`` (sizes may be ``cute.sym_int()``)."""
    return cute.runtime.make_fake_compact_tensor(dtype, shape, stride_order=tuple(range(len(shape) - 1, -1, -1)),
                                                 assumed_align=align)


def struct_bytes(fields) -> int:
    """Size of a shared-memory struct of ``fields`` ((bytes, alignment) in order): each field at its alignment, the
    whole a multiple of the largest alignment."""
    off, largest = 0, 1
    for size, align in fields:
        off = -(-off // align) * align + size
        largest = max(largest, align)
    return -(-off // largest) * largest


def thread_roles():
    """(thread index, warp index, warpgroup index) of this thread, the last two warp-uniform."""
    tidx, _, _ = cute.arch.thread_idx()
    return (tidx, cute.arch.make_warp_uniform(cute.arch.warp_idx()),
            cute.arch.make_warp_uniform(tidx // WG))


def grid_dims(n_blocks, heads, batch):
    """The launch grid of a kernel over (block, head, batch): heads fastest, then blocks, then the batch (read back by
    :func:`grid_block`)."""
    return [heads, n_blocks, batch]


def grid_block():
    """(block, head, batch) of this CTA in a :func:`grid_dims` grid. The GPU starts CTAs about in grid order, so all
    heads of a batch entry run block by block: block 0 (a causal kernel's longest) of every head first. Ordered head
    by head instead, a causal grid ends on the last head's longest blocks while the other SMs idle (B=4, H=16,
    L=4096: 2-4 % of each kernel, docs/cute-backend.md). The three indices are special registers, which ptxas reads
    again where it needs them (index arithmetic here would hold registers the consumers need)."""
    h, blk, b = cute.arch.block_idx()
    return blk, h, b


def query_grid_block(heads, kv_heads):
    """(block, head, batch, kv head) of a query-major CTA in a :func:`grid_dims` grid over query heads: head h reads
    kv head h // (heads // kv_heads) (GQA)."""
    bx, h, b = grid_block()
    return bx, h, b, h // (heads // kv_heads)


SCHEDULE_STAGES = 2  # slots of a persistent CTA's tile-index pipe
FILL_BATCH = 4  # bias-table entries a thread loads at once


TABLE_FILLERS = 3 * 32  # threads of a persistent forward kernel's table fillers: its producer warpgroup's warps 1..3


def table_pipe(barrier_storage, threads: int, fillers: int):
    """A persistent CTA's two bias tables (one per tile parity) as a pipe from its ``fillers`` table-filling threads
    to its ``threads`` consumer threads: each filler writes its entries of tile k's table after ``producer_acquire``
    (every consumer has released tile k - 2's), then ``producer_commit``; a consumer reads after ``consumer_wait``
    (every entry written) and calls ``consumer_release`` after the tile's last read. The fillers are either the
    consumers themselves at the tile's start, or (``TABLE_FILLERS``, :func:`fill_tables_ahead`) the producer
    warpgroup's spare warps a tile ahead, so that no consumer waits for the table's global loads."""
    return pipeline.PipelineAsync.create(
        barrier_storage=barrier_storage, num_stages=2,
        producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, fillers),
        consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, threads))


def schedule_pipe(barrier_storage, consumer_threads: int):
    """The pipe (``SCHEDULE_STAGES`` mbarrier pairs at ``barrier_storage``) carrying a persistent CTA's next tile
    index from its producer warp to its ``consumer_threads`` consumer threads (each arrives once per slot)."""
    return pipeline.PipelineAsync.create(
        barrier_storage=barrier_storage, num_stages=SCHEDULE_STAGES,
        producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, 1),
        consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, consumer_threads))


def persistent_grid(ctas, n_blocks, heads, batch):
    """The launch grid of a persistent kernel: ``ctas`` CTAs (the SM count) or fewer where there are fewer tiles."""
    return [cutlass.min(ctas, n_blocks * heads * batch), 1, 1]


class PersistentDims(NamedTuple):
    """The runtime sizes a persistent kernel's roles share: sequence length, heads, batch, kv heads, bias length,
    query blocks of BM rows per head and tiles in all (blocks x heads x batch)."""
    L: cutlass.Int32
    H: cutlass.Int32
    B: cutlass.Int32
    Hkv: cutlass.Int32
    W: cutlass.Int32
    n_mblocks: cutlass.Int32
    total: cutlass.Int32


def persistent_dims(rows, tma_k_t, mBias, BM: int) -> PersistentDims:
    """:class:`PersistentDims` from ``rows`` (a [B, H, L, ...] tensor), the K TMA view (kv heads in mode 2) and the
    [H, W] bias."""
    L, H, B = rows.shape[2], rows.shape[1], rows.shape[0]
    n_mblocks = (L + BM - 1) // BM
    return PersistentDims(L, H, B, tma_k_t.shape[2], mBias.shape[1], n_mblocks, n_mblocks * H * B)


@cute.jit
def publish_tile(pipe, state, sTile, tile):
    """Producer warp (every lane): the next tile index into slot ``state.index`` of ``sTile`` for the consumers
    (:func:`receive_tile`); the caller advances ``state``. An index >= the tile count ends the consumers' loop."""
    pipe.producer_acquire(state)
    with cute.arch.elect_one():
        sTile[state.index] = tile
        pipe.producer_commit(state)


@cute.jit
def start_producer(pipe, sTile, stages: cutlass.Constexpr):
    """Producer warp of a persistent kernel, before its tile loop: the CTA's first tile (its block index) published
    on the tile pipe, and the producer states (tile pipe, already past that tile; the Q pipeline of one stage; the
    K / V ring of ``stages``). Returns (tile, tile_state, q_state, kv_state); the loop advances the states itself."""
    tile_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, SCHEDULE_STAGES)
    q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, 1)
    kv_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, stages)
    tile, _, _ = cute.arch.block_idx()
    publish_tile(pipe, tile_state, sTile, tile)
    tile_state.advance()
    return tile, tile_state, q_state, kv_state


@cute.jit
def receive_tile(pipe, state, sTile):
    """Consumer thread: the tile index in slot ``state.index`` (:func:`publish_tile`); the caller advances."""
    pipe.consumer_wait(state)
    tile = sTile[state.index]
    pipe.consumer_release(state)
    return tile


@cute.jit
def claim_next_tile(mCounter, total):
    """Producer warp (every lane): the next tile of this persistent CTA, gridDim.x + a ticket from the counter
    ``mCounter`` [1] int32, zero at the launch (tiles run in index order as CTAs free up, like the hardware's own CTA
    scheduling of a :func:`grid_dims` grid). Every CTA claims once past its last tile, so the launch hands out the
    tickets 0 .. ``total`` - 1 (``total`` tiles, the grid min(SMs, total)); the CTA drawing the last sets the
    counter back to zero for the next launch on the stream, which needs no fill."""
    ticket = cutlass.Int32(0)
    if cute.arch.lane_idx() == 0:
        ticket = cute.arch.atomic_add(mCounter.iterator, cutlass.Int32(1))
        if ticket == total - 1:
            mCounter[0] = cutlass.Int32(0)
    ctas, _, _ = cute.arch.grid_dim()
    return cute.arch.shuffle_sync(ticket, 0) + ctas


@cute.jit
def tile_coords(tile, heads, kv_heads, n_blocks):
    """(block, head, batch, kv head) of tile index ``tile`` in :func:`grid_dims` order (heads fastest, then blocks,
    then the batch)."""
    h = tile % heads
    rest = tile // heads
    return rest % n_blocks, h, rest // n_blocks, h // (heads // kv_heads)


@cute.jit
def query_block(bx, rows, lens_b, BM: cutlass.Constexpr, BN: cutlass.Constexpr, causal: cutlass.Constexpr):
    """(query block mb, its first row m0, lb = min(lengths[b], rows), key tiles n) of the CTA with grid index
    ``bx`` over ``rows`` query rows: causal blocks run longest first and see keys below min(m0 + BM, lb)."""
    mb = bx
    if cutlass.const_expr(causal):
        mb = (rows + BM - 1) // BM - 1 - bx
    m0 = mb * BM
    lb = cutlass.min(lens_b, rows)
    key_end = lb
    if cutlass.const_expr(causal):
        key_end = cutlass.min(m0 + BM, lb)
    return mb, m0, lb, (key_end + BN - 1) // BN


def acc_mn_view(acc: cute.Tensor) -> cute.Tensor:
    """A wgmma accumulator fragment ((2, 2, N/8), MMA_M, MMA_N) viewed as (rows, cols) of this thread: mode 0's second
    sub-mode is the row (r, r + 8), the first and third the columns (c, c + 1; groups of 8)."""
    cm = cute.make_layout(acc.layout.shape)
    s0, d0 = cm.shape[0], cm.stride[0]
    mn = cute.make_layout(((s0[1], cm.shape[1]), (s0[0], s0[2], cm.shape[2])),
                          stride=((d0[1], cm.stride[1]), (d0[0], d0[2], cm.stride[2])))
    return cute.make_tensor(acc.iterator, cute.composition(acc.layout, mn))


def quad_reduce(val, op):
    """``op`` over the four lanes of a quad (the lanes holding one accumulator row)."""
    val = op(val, cute.arch.shuffle_sync_bfly(val, offset=2, mask=-1, mask_and_clamp=31))
    return op(val, cute.arch.shuffle_sync_bfly(val, offset=1, mask=-1, mask_and_clamp=31))


def score_mmas(dtype, rows: int, cols: int):
    """(first, rest): two one-warpgroup wgmma tiled MMAs for a [rows, cols] fp32 score tile, both operands K-major
    in shared memory; the kernel sets ACCUMULATE once on each (first overwrites at k-block 0, rest accumulates)."""
    k_major = cute.nvgpu.OperandMajorMode.K
    return tuple(sm90_utils.make_trivial_tiled_mma(dtype, dtype, k_major, k_major, cutlass.Float32, (1, 1, 1),
                                                   (rows, cols)) for _ in range(2))


def accumulate_mma(dtype, rows: int, D: int, a_in_registers: bool = True):
    """The one-warpgroup wgmma tiled MMA accumulating a [rows, D] fp32 tile: A K-major (from registers, or shared
    memory), B MN-major in shared memory (a K-major tile's bytes seen as its transpose)."""
    k_major, mn_major = cute.nvgpu.OperandMajorMode.K, cute.nvgpu.OperandMajorMode.MN
    source = (warpgroup.OperandSource.RMEM,) if a_in_registers else ()
    return sm90_utils.make_trivial_tiled_mma(dtype, dtype, k_major, mn_major, cutlass.Float32, (1, 1, 1), (rows, D),
                                             *source)


def sw128_atoms(dtype):
    """(K-major, MN-major) shared-memory layout atoms with the 128-byte swizzle (D * 16 bits is a multiple of 1024
    for D = 64 and 128)."""
    return (warpgroup.make_smem_layout_atom(warpgroup.SmemLayoutAtomKind.K_SW128, dtype),
            warpgroup.make_smem_layout_atom(warpgroup.SmemLayoutAtomKind.MN_SW128, dtype))


def tma_pipeline(barrier_storage, stages: int, tx_bytes, consumer_warps: int = 8):
    """A PipelineTmaAsync ring of ``stages``: one producer thread issues the TMA loads (``tx_bytes`` per stage);
    each stage is released by one arrive from each of the ``consumer_warps`` consumer warps. Every thread of the CTA
    must call it (mbarrier init, then the CTA barrier create() ends with)."""
    return pipeline.PipelineTmaAsync.create(
        barrier_storage=barrier_storage, num_stages=stages,
        producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, 1),
        consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, consumer_warps), tx_count=tx_bytes)


def load_row_block(pipe, sources, first, parts: int, state=None):
    """Producer side of a 1-stage ``pipe`` (``tma_pipeline``): the CTA's row block as ``parts`` row tiles of each
    (tma atom, global tiles, shared tiles) in ``sources`` (``tma_views``), global tiles first .. first + parts - 1
    into shared tiles 0 .. parts - 1, all completing the pipe's one barrier (its tx count is their sum). ``state``:
    the producer's pipeline state where the buffer is refilled (a persistent CTA; the caller advances it), else the
    first fill."""
    if state is None:
        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, 1)
    pipe.producer_acquire(state)
    for part in range(parts):  # unrolled while tracing
        for tma, gmem_tiles, smem_tiles in sources:
            cute.copy(tma, gmem_tiles[None, first + part], smem_tiles[None, part],
                      tma_bar_ptr=pipe.producer_get_barrier(state))


def tma_views(tma, smem, gmem, tile_modes: int = 2):
    """(shared, global) TMA partitions of a single-CTA copy: the first ``tile_modes`` modes of ``smem`` and ``gmem``
    are one tile, the rest index stages / tiles."""
    return cpasync.tma_partition(tma, 0, cute.make_layout(1), cute.group_modes(smem, 0, tile_modes),
                                 cute.group_modes(gmem, 0, tile_modes))


def pairwise_reduce(vals, op):
    """``op`` over a list of traced scalars as a balanced tree (log2(n) dependent steps instead of n), fixed order."""
    while len(vals) > 1:
        vals = [op(vals[i], vals[i + 1]) for i in range(0, len(vals) - 1, 2)] + vals[len(vals) - len(vals) % 2:]
    return vals[0]


def pairwise_sum(vals):
    """The sum of a list of traced scalars as a balanced tree (:func:`pairwise_reduce`)."""
    return pairwise_reduce(vals, lambda a, b: a + b)


@cute.jit
def turn_wait(wg, enabled: cutlass.Constexpr):
    """Ping-pong: wait until it is consumer warpgroup ``wg``'s turn to issue wgmma (bar.sync on its own barrier,
    256 = its 128 threads + the other warpgroup's 128 arrivals)."""
    if cutlass.const_expr(enabled):
        cute.arch.barrier(barrier_id=ORDER_BARRIER + wg, number_of_threads=2 * WG)


@cute.jit
def turn_pass(wg, enabled: cutlass.Constexpr):
    """Ping-pong: hand the turn to the other consumer warpgroup (bar.arrive on its barrier)."""
    if cutlass.const_expr(enabled):
        cute.arch.barrier_arrive(barrier_id=ORDER_BARRIER + 1 - wg, number_of_threads=2 * WG)


class TableSpan(NamedTuple):
    """The entries [lo, hi] of a bias table a tile's view may index (indices relative to the view)."""
    lo: cutlass.Int32
    hi: cutlass.Int32


@cute.jit
def bias_at(d, W, mBias, h, causal: cutlass.Constexpr):
    """The log2-domain bias at distance m - n = d (|m - n| non-causal): mBias[h, d] * log2 e, 0 outside [0, W)."""
    a = d
    if cutlass.const_expr(not causal):
        a = cutlass.max(a, -a)
    val = cutlass.Float32(0.0)
    if a >= 0 and a < W:
        val = mBias[h, a] * LOG2E
    return val


@cute.jit
def fill_bias_table(tbl, t, entries: cutlass.Constexpr, d_first, W, mBias, h, causal: cutlass.Constexpr):
    """Entry ``t`` (one per calling thread, t < entries) of a tile's bias table: :func:`bias_at` distance
    d_first + t; the masks are the caller's."""
    if t < entries:
        tbl[t] = bias_at(d_first + t, W, mBias, h, causal)


@cute.jit
def fill_distance_table(tbl, t0, step: cutlass.Constexpr, count, d_first, W, mBias, h, causal: cutlass.Constexpr):
    """Entries t0, t0 + step, ... below ``count`` of a table over distances: entry t = :func:`bias_at` distance
    d_first + t (one call per thread of a group of ``step``; the caller's barrier publishes it). ``FILL_BATCH`` loads
    are in flight at a time: a persistent CTA fills a table per tile, on its consumers' path."""
    for t in cutlass.range(t0, count, FILL_BATCH * step, unroll=1):
        vals = [bias_at(d_first + t + j * step, W, mBias, h, causal) for j in range(FILL_BATCH)]  # loads in flight
        for j in cutlass.range_constexpr(FILL_BATCH):
            if t + j * step < count:
                tbl[t + j * step] = vals[j]


class CtaTable(NamedTuple):
    """Where a CTA's bias comes from: ``whole``: its own table over the distances d_first .. d_first + entries - 1
    (every distance a band tile of the CTA sees, :func:`fill_cta_table`); otherwise per-tile tables."""
    whole: cutlass.Boolean
    d_first: cutlass.Int32
    entries: cutlass.Int32


@cute.jit
def cta_table_extent(W, L, BM: cutlass.Constexpr, BN: cutlass.Constexpr, causal: cutlass.Constexpr,
                     cap: cutlass.Constexpr) -> CtaTable:
    """The :class:`CtaTable` of a CTA whose [BM, BN] band tiles see the distances |d| < min(W, L) + BM + BN (causal
    d > -BN): its own table where that is at most ``cap`` entries (the end entries hold bias 0)."""
    w_eff = cutlass.min(W, L)
    d_first = -(w_eff + BM + BN)
    entries = 2 * (w_eff + BM + BN) + 1
    if cutlass.const_expr(causal):
        d_first = cutlass.Int32(-(BN - 1))
        entries = w_eff + BM + 2 * BN
    return CtaTable(entries <= cap, d_first, entries)


@cute.jit
def fill_cta_table(sT, t, threads: cutlass.Constexpr, W, L, mBias, h, BM: cutlass.Constexpr, BN: cutlass.Constexpr,
                   causal: cutlass.Constexpr, cap: cutlass.Constexpr) -> CtaTable:
    """Fill (thread ``t`` of ``threads``; the caller's barrier publishes it) the CTA's table over every distance its
    [BM, BN] band tiles see (:func:`cta_table_extent`), where it fits. A table filled once replaces one fill and
    barrier per band tile."""
    cta = cta_table_extent(W, L, BM, BN, causal, cap)
    if cta.whole:
        fill_distance_table(sT, t, threads, cta.entries, cta.d_first, W, mBias, h, causal)
    return cta


@cute.jit
def fill_tables_ahead(tile_pipe, tbl_pipe, sTile, sT, t, total, heads, kv_heads, n_blocks, W, L, mBias,
                      BM: cutlass.Constexpr, BN: cutlass.Constexpr, causal: cutlass.Constexpr, cap: cutlass.Constexpr):
    """The table fillers of a persistent forward kernel (thread ``t`` of ``TABLE_FILLERS``, the producer
    warpgroup's warps 1..3): they take every tile index from the tile pipe as the consumers do and fill the tile's
    CTA table (:func:`fill_cta_table`, ``cap`` entries) into the half of ``sT`` of the tile's parity, through the
    table pipe. The producer publishes a tile while the consumers still work on the one before, so the table's
    global loads run under that tile's GEMMs. Where the table does not fit (per-tile tables, the consumers' own),
    the stage is committed empty."""
    tile_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, SCHEDULE_STAGES)
    fill = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, 2)
    tile = receive_tile(tile_pipe, tile_state, sTile)
    tile_state.advance()
    while tile < total:
        _, h, _, _ = tile_coords(tile, heads, kv_heads, n_blocks)
        half = cute.make_tensor(sT.iterator + fill.index * cap, cute.make_layout(cap))
        tbl_pipe.producer_acquire(fill)
        fill_cta_table(half, t, TABLE_FILLERS, W, L, mBias, h, BM, BN, causal, cap)
        tbl_pipe.producer_commit(fill)
        fill.advance()
        tile = receive_tile(tile_pipe, tile_state, sTile)
        tile_state.advance()


@cute.jit
def tile_table(sT, cta: CtaTable, fills, needed, t, m0, n0, W, mBias, h, BM: cutlass.Constexpr,
               BN: cutlass.Constexpr, table: cutlass.Constexpr, causal: cutlass.Constexpr, barrier_id,
               threads: cutlass.Constexpr):
    """(view, span, fills): the bias of tile [m0, m0 + BM) x [n0, n0 + BN) as a view of ``table`` entries whose
    entry e is distance m0 - n0 - (BN - 1) + e, the :class:`TableSpan` the view may index, and the updated count of
    per-tile fills. From the CTA's table where ``cta.whole``; otherwise a tile that ``needed`` one fills a per-tile
    table (:func:`tile_bias_table` on the first 2 * table entries of sT)."""
    toff = m0 - n0 - (BN - 1) - cta.d_first
    lo = -toff
    hi = cta.entries - 1 - toff
    if not cta.whole:
        _, fills = tile_bias_table(cute.make_tensor(sT.iterator, cute.make_layout((table, 2))), fills, needed, t,
                                   BM + BN - 1, m0 - n0 - (BN - 1), W, mBias, h, causal, barrier_id, threads)
        toff = ((fills + 1) % 2) * table
        lo = cutlass.Int32(0)
        hi = cutlass.Int32(table - 1)
    return cute.make_tensor(sT.iterator + toff, cute.make_layout(table)), TableSpan(lo, hi), fills


@cute.jit
def tile_bias_table(tables, fills, needed, t, entries: cutlass.Constexpr, d_first, W, mBias, h,
                    causal: cutlass.Constexpr, barrier_id, threads: cutlass.Constexpr):
    """This tile's bias table from the double buffer ``tables`` (entries, 2), and the updated count of fills. A tile
    that ``needed`` one fills buffer fills % 2 (entry ``t`` by this thread) and passes named barrier ``barrier_id``
    (``threads`` threads) before anyone reads it. A thread starts fill k only after fill k - 1's barrier, which no
    thread reaches before finishing its reads of buffer k % 2 (fill k - 2): one barrier per filled table."""
    tbl = tables[None, fills % 2]
    if needed:
        fill_bias_table(tbl, t, entries, d_first, W, mBias, h, causal)
        fills += 1
        cute.arch.barrier(barrier_id=barrier_id, number_of_threads=threads)
    return tbl, fills


@cute.jit
def keys_free(m0, n0, lb, W, BM: cutlass.Constexpr, BN: cutlass.Constexpr, causal: cutlass.Constexpr):
    """No key of the tile [m0, m0 + BM) x [n0, n0 + BN) is masked or biased for any of its queries: every key is
    below lengths[b] (``lb``) and every distance m - n is >= W (causal: every key in the past), or non-causal also
    every n - m >= W. Rows past ``lb`` are the caller's."""
    inside = n0 + BN <= lb
    below = n0 + BN - 1 <= m0 - W
    if cutlass.const_expr(causal):
        return inside and below
    else:
        above = n0 >= m0 + BM - 1 + W
        return inside and (below or above)


@cute.jit
def tile_class(m0, n0, lb, W, BM: cutlass.Constexpr, BN: cutlass.Constexpr, causal: cutlass.Constexpr):
    """(free, masked) of the tile [m0, m0 + BM) x [n0, n0 + BN): free as :func:`keys_free`; masked where some key
    is at or past lengths[b] (``lb``) or, causal, some key lies after the first row (the diagonal crosses it)."""
    masked = n0 + BN > lb
    if cutlass.const_expr(causal):
        masked = masked or n0 + BN - 1 > m0
    return keys_free(m0, n0, lb, W, BM, BN, causal), masked


@cute.jit
def one_key_row(m, lb, causal: cutlass.Constexpr):
    """Whether query row m sees exactly one key (i = 1: causal row 0, or lengths[b] == 1). Its P is exactly 1, but
    its score recomputed against the stored LSE can land an ulp above; at tau = -1 the row sits on the relu kink
    P + tau/i = 0, so the backward sets P = 1 there (a spurious Mk and dtau term otherwise)."""
    one = lb == 1
    if cutlass.const_expr(causal):
        one = m == 0 or lb == 1
    return one


def vector_copy(dtype):
    """A warpgroup's tiled copy of a [rows, cols] tile in 16-byte vectors: ``vector_lanes(dtype)`` consecutive threads
    cover one row of 64 columns (one row of a 128-byte swizzle atom), WG / vector_lanes rows at a time; a thread's
    partition is (vector, row repeat, 64-column repeat)."""
    elems = 128 // dtype.width
    lanes = vector_lanes(dtype)
    atom_vec = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), dtype, num_bits_per_copy=128)
    return cute.make_tiled_copy_tv(atom_vec, cute.make_layout((WG // lanes, lanes), stride=(lanes, 1)),
                                   cute.make_layout((1, elems)))


def vector_lanes(dtype) -> int:
    """Threads along one 64-column row of ``vector_copy(dtype)`` (consecutive threads, aligned within the warp)."""
    return 64 // (128 // dtype.width)


@cute.jit
def store_through_smem(tiled_mma, acc, sO, gO, row0, row_end, wtid, bar_id, dtype: cutlass.Constexpr,
                       rows: cutlass.Constexpr, cols_d: cutlass.Constexpr, reuse: cutlass.Constexpr):
    """A warpgroup's fp32 accumulator ``acc`` (of ``tiled_mma``, a [rows, cols_d] tile) -> ``dtype`` -> ``sO`` (its
    own swizzled [rows, cols_d] buffer, free) -> named barrier ``bar_id`` (the warpgroup's 128 threads) -> 16-byte
    copies into ``gO`` of the rows whose position row0 + r is below ``row_end``. With ``reuse`` it returns after a
    second barrier (the reads of sO done), so the caller may write sO again."""
    rO = cute.make_fragment_like(acc, dtype)
    rO.store(acc.load().to(dtype))
    s_copy = cute.make_tiled_copy_C(cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), dtype), tiled_mma)
    thr_s = s_copy.get_slice(wtid)
    cute.copy(s_copy, thr_s.retile(rO), thr_s.partition_D(sO))
    cute.arch.barrier(barrier_id=bar_id, number_of_threads=WG)
    gcopy = vector_copy(dtype)
    thr_o = gcopy.get_slice(wtid)
    tsO = thr_o.partition_S(sO)
    tgO = thr_o.partition_D(gO)
    tc = thr_o.partition_D(cute.make_identity_tensor((rows, cols_d)))
    tr = cute.make_fragment_like(tgO, dtype)
    cute.copy(gcopy, tsO, tr)
    for r in cutlass.range_constexpr(cute.size(tgO.shape[1])):
        if row0 + tc[0, r, 0][0] < row_end:
            cute.copy(gcopy, tr[None, r, None], tgO[None, r, None])
    if cutlass.const_expr(reuse):
        cute.arch.barrier(barrier_id=bar_id, number_of_threads=WG)


@cute.jit
def store_accumulator(tiled_mma, acc, gO, coords_mn, row0, row_end, wtid, dtype: cutlass.Constexpr):
    """A warpgroup's fp32 accumulator ``acc`` (of ``tiled_mma``) -> ``dtype`` -> straight from registers into its
    global tile ``gO`` (each thread's column pairs as 4-byte stores), the rows whose position row0 + r (r from
    ``coords_mn``, the (rows, cols) view of the tile's identity partition) is below ``row_end``. No shared memory:
    a persistent CTA refills its buffers with the next tile meanwhile."""
    rO = cute.make_fragment_like(acc, dtype)
    rO.store(acc.load().to(dtype))
    tOgO = tiled_mma.get_slice(wtid).partition_C(gO)
    rO_mn = acc_mn_view(rO)
    tOgO_mn = acc_mn_view(tOgO)
    for r in cutlass.range_constexpr(cute.size(rO_mn.shape[0])):
        if row0 + coords_mn[r, 0][0] < row_end:
            cute.autovec_copy(rO_mn[r, None], tOgO_mn[r, None])
