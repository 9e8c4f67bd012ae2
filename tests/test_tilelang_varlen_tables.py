"""The device-built tables of the TileLang lazy_attention_varlen launchers, on the CPU (the kernels need a GPU).

- block_table: every (document, block) pair exactly once with the document's first token, length and the block's
  first position; rows past the blocks describe an empty document; the row count bounds the block count for
  empty, one-token, short and long documents and hundreds of them; descending positions with ``reverse``.
- inv_i: 1/i of every token (causal: its position in its document + 1; else its document's length), 0 past T.
"""
from __future__ import annotations

import random

import pytest
import torch

from kernel_dispatch.backends.tilelang.lazy_attention_varlen import block_table, inv_i
from kernel_dispatch.ops import lazy_attention_varlen_cases as cases

rng = random.Random(0)
DOCS = [(37,), (0, 1, 5, 150, 0, 23, 0), (128,), (128, 128, 1), (256, 0, 255, 257),
        tuple(rng.randint(0, 3) for _ in range(240)), tuple(rng.randint(0, 300) for _ in range(40)), (0, 0, 9)]


def _expected(docs, block):
    cu = [0]
    for n in docs:
        cu.append(cu[-1] + n)
    return {(cu[d], n, p) for d, n in enumerate(docs) for p in range(0, n, block)}


@pytest.mark.parametrize("reverse", [False, True], ids=["ascending", "reverse"])
@pytest.mark.parametrize("block", [64, 128, 256])
@pytest.mark.parametrize("docs", DOCS, ids=lambda d: f"{len(d)}docs-{sum(d)}tokens")
def test_block_table_lists_every_block_once(docs, block, reverse):
    cu = cases.cu_seqlens_of(docs)
    T = sum(docs)
    table = block_table(cu, T, block, max(max(docs), 1), reverse)
    assert table.dtype == torch.int32 and table.is_contiguous()
    assert table.shape == (len(docs) + -(-T // block), 3)
    rows = [tuple(r) for r in table.tolist()]
    live = [r for r in rows if r[1] > 0]
    assert len(live) == len(set(live)) and set(live) == _expected(docs, block)
    n = len(live)
    assert rows[n:] == [(0, 0, 0)] * (len(rows) - n), "rows past the blocks must describe an empty document"
    starts = [p for _, _, p in live]
    assert starts == sorted(starts, reverse=reverse), "blocks must run position by position"


def test_block_table_takes_a_larger_max_seqlen():
    docs = (5, 70, 0, 3)
    table = block_table(cases.cu_seqlens_of(docs), sum(docs), 64, 1000, reverse=True)
    assert {tuple(r) for r in table.tolist() if r[1] > 0} == _expected(docs, 64)


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "noncausal"])
def test_inv_i_per_token(causal):
    docs = (0, 1, 5, 0, 12, 3)
    T = sum(docs)
    got = inv_i(cases.cu_seqlens_of(docs), T, T + 3, causal)
    want = [1.0 / (m + 1 if causal else n) for n in docs for m in range(n)] + [0.0] * 3
    assert torch.equal(got, torch.tensor(want, dtype=torch.float32))
