"""Tile rules shared by the cute lazy attention kernels (forward and backward): register views of mma.sync
accumulators, the quad reduction across the four lanes that hold one row, which tiles need no mask or bias, and
which rows see exactly one key."""
import cutlass
import cutlass.cute as cute


def mn_view(acc: cute.Tensor) -> cute.Tensor:
    """An mma.sync accumulator fragment ((2, 2), MMA_M, MMA_N) viewed as (rows, cols) of this thread."""
    cm = cute.make_layout(acc.layout.shape)
    mn = cute.make_layout(((cm.shape[0][1], cm.shape[1]), (cm.shape[0][0], cm.shape[2])),
                          stride=((cm.stride[0][1], cm.stride[1]), (cm.stride[0][0], cm.stride[2])))
    return cute.make_tensor(acc.iterator, cute.composition(acc.layout, mn))


def quad_reduce(val, op):
    """``op`` over the four lanes of a quad (the lanes holding one accumulator row of an m16n8 tile)."""
    val = op(val, cute.arch.shuffle_sync_bfly(val, offset=2, mask=-1, mask_and_clamp=31))
    return op(val, cute.arch.shuffle_sync_bfly(val, offset=1, mask=-1, mask_and_clamp=31))


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
def one_key_row(m, lb, causal: cutlass.Constexpr):
    """Whether query row m sees exactly one key (i = 1: causal row 0, or lengths[b] == 1). Its P is exactly 1, but
    its score recomputed against the stored LSE can land an ulp above; at tau = -1 the row sits on the relu kink
    P + tau/i = 0, so the backward sets P = 1 there (a spurious Mk and dtau term otherwise)."""
    one = lb == 1
    if cutlass.const_expr(causal):
        one = m == 0 or lb == 1
    return one
