"""The byte-level corpus and resumable, rank-sharded batch samplers.

Tokens are the file's bytes (vocabulary 256). The last ``val_fraction`` of the file is held out.
Training windows start on a grid of ``seq_len`` bytes shifted by a random offset each epoch and
are shuffled per epoch; rank r of w takes every w-th window of the shuffled order, so each rank
reads its own shard. The sampler's position (epoch, index) is its whole state.

Packed (``data.pack``): the documents are the chapters (a heading line "Chapter 12" / "CHAPTER XII"
starts one; text before the first heading is a document too). Each epoch cuts every document into
pieces of at most ``seq_len`` bytes on a grid shifted by a random offset, shuffles the pieces, and
packs them one after another into each step's ``batch_size * seq_len`` tokens (the last piece cut to
fit), with the boundaries as ``cu_seqlens``: no token attends across one. A document's last byte has
no target (:data:`IGNORE`): the byte after it belongs to another document.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import NamedTuple

import torch
from torch import Tensor

from ..config import ConfigError

_REPO = Path(__file__).resolve().parents[2]


class ByteCorpus:
    """The text as uint8 tensors ``train`` and ``val`` (1-D)."""

    def __init__(self, path: str | Path, val_fraction: float, seq_len: int):
        path = Path(path)
        if not path.is_file() and not path.is_absolute() and (_REPO / path).is_file():
            path = _REPO / path  # a relative path names a file of this repository when not found here
        if not path.is_file():
            raise ConfigError(f"data.path: no such file {str(path)!r}")
        raw = path.read_bytes()
        data = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
        split = int(len(data) * (1.0 - val_fraction))
        self.train, self.val = data[:split], data[split:]
        starts = chapter_starts(raw)  # documents: int64 start offsets within each split
        self.train_docs = starts[starts < split]
        self.val_docs = torch.cat([torch.zeros(1, dtype=torch.long), starts[starts > split] - split])
        for name, part in (("training", self.train), ("validation", self.val)):
            if len(part) < 2 * (seq_len + 1):
                raise ConfigError(f"data.path: the {name} split of {str(path)!r} has {len(part)} bytes, "
                                  f"too few for data.seq_len = {seq_len}")


def windows(data: Tensor, starts: Tensor, seq_len: int) -> tuple[Tensor, Tensor]:
    """Inputs and next-byte targets, both [len(starts), seq_len] int64."""
    idx = starts[:, None] + torch.arange(seq_len + 1)[None, :]
    chunk = data[idx].long()
    return chunk[:, :-1], chunk[:, 1:]


class ShardedSampler:
    """Batches [batch_size, seq_len] of training windows for one rank, reproducible from its state."""

    def __init__(self, data: Tensor, seq_len: int, batch_size: int, seed: int, rank: int = 0, world: int = 1):
        self.data, self.seq_len, self.batch_size = data, seq_len, batch_size
        self.seed, self.rank, self.world = seed, rank, world
        self.epoch, self.index = 0, 0
        self._order: Tensor | None = None

    def _shard(self) -> Tensor:
        if self._order is None:
            g = torch.Generator().manual_seed(self.seed * 100003 + self.epoch)
            offset = int(torch.randint(0, self.seq_len, (1,), generator=g))
            starts = torch.arange(offset, len(self.data) - self.seq_len, self.seq_len)
            self._order = starts[torch.randperm(len(starts), generator=g)][self.rank::self.world]
            if len(self._order) < self.batch_size:
                raise ConfigError(f"train.batch_size: {self.batch_size} exceeds the {len(self._order)} windows "
                                  f"of one rank's shard")
        return self._order

    def next_batch(self) -> tuple[Tensor, Tensor]:
        """(inputs, targets) [batch_size, seq_len] int64; advances the position."""
        order = self._shard()
        if self.index + self.batch_size > len(order):
            self.epoch, self.index, self._order = self.epoch + 1, 0, None
            order = self._shard()
        starts = order[self.index:self.index + self.batch_size]
        self.index += self.batch_size
        return windows(self.data, starts, self.seq_len)

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "index": self.index, "world": self.world}

    def load_state_dict(self, state: dict) -> None:
        if state["world"] != self.world:
            raise ConfigError(f"--resume: the checkpoint was written by {state['world']} ranks, this run has "
                              f"{self.world}; the data position cannot be continued exactly")
        self.epoch, self.index, self._order = state["epoch"], state["index"], None


def eval_batches(data: Tensor, seq_len: int, batch_size: int, n_batches: int, rank: int = 0,
                 world: int = 1) -> list[tuple[Tensor, Tensor]]:
    """This rank's share of ``n_batches`` fixed validation batches, evenly spaced over ``data``."""
    total = n_batches * batch_size
    starts = torch.linspace(0, len(data) - seq_len - 1, total).long()
    mine = [b for b in range(n_batches) if b % world == rank]
    return [windows(data, starts[b * batch_size:(b + 1) * batch_size], seq_len) for b in mine]


IGNORE = -100  # the target of a document's last token (F.cross_entropy's default ignore_index)
_HEADING = re.compile(rb"^chapter[ \t]+(?:\d+|[ivxlc]+)\.?[ \t]*\r?$", re.IGNORECASE | re.MULTILINE)


def chapter_starts(text: bytes) -> Tensor:
    """int64 byte offsets where documents start: 0 and the start of every chapter heading line."""
    found = [m.start() for m in _HEADING.finditer(text)]
    return torch.tensor([0] + [p for p in found if p > 0], dtype=torch.long)


class PackedTokens(NamedTuple):
    """One packed step's inputs: ``tokens`` [T] int64, ``cu_seqlens`` int32 [N + 1], ``max_seqlen`` (int)."""

    tokens: Tensor
    cu_seqlens: Tensor
    max_seqlen: int

    @property
    def device(self) -> torch.device:
        return self.tokens.device

    def to(self, device, non_blocking: bool = False) -> "PackedTokens":
        return PackedTokens(self.tokens.to(device, non_blocking=non_blocking),
                            self.cu_seqlens.to(device, non_blocking=non_blocking), self.max_seqlen)


class Pieces(NamedTuple):
    """Pieces of documents: ``start``, ``end`` (int64 offsets) and ``last`` (bool: the piece ends its document)."""

    start: Tensor
    end: Tensor
    last: Tensor


def cut_documents(doc_starts: Tensor, length: int, seq_len: int, offset: int = 0) -> Pieces:
    """Every document of a split of ``length`` bytes cut at its start + offset + k * seq_len (k >= 0)."""
    doc_ends = torch.cat([doc_starts[1:], torch.tensor([length])])
    starts, ends, last = [], [], []
    for s, e in zip(doc_starts.tolist(), doc_ends.tolist()):
        cuts = sorted({s, e, *range(s + offset, e, seq_len)})
        if len(cuts) < 2:
            continue
        starts += cuts[:-1]
        ends += cuts[1:]
        last += [False] * (len(cuts) - 2) + [True]
    return Pieces(torch.tensor(starts, dtype=torch.long), torch.tensor(ends, dtype=torch.long),
                  torch.tensor(last, dtype=torch.bool))


def pack_pieces(data: Tensor, pieces: Pieces, first: int, budget: int) -> tuple[PackedTokens, Tensor, int]:
    """Pieces ``first``, ``first + 1``, ... packed into ``budget`` tokens (the last one cut to fit).

    Returns (inputs, targets [budget] int64, the index of the next unused piece). The caller makes
    sure the pieces from ``first`` on hold at least ``budget`` tokens.
    """
    tokens, targets, lengths = [], [], []
    i, need = first, budget
    while need > 0:
        s, e = int(pieces.start[i]), int(pieces.end[i])
        n = min(e - s, need)
        idx = torch.arange(s, s + n)
        tgt = data[idx.clamp(max=len(data) - 2) + 1].long()
        if n == e - s and bool(pieces.last[i]):
            tgt[-1] = IGNORE
        tokens.append(data[idx].long())
        targets.append(tgt)
        lengths.append(n)
        need -= n
        i += 1
    cu = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    cu[1:] = torch.tensor(lengths).cumsum(0)
    return PackedTokens(torch.cat(tokens), cu, max(lengths)), torch.cat(targets), i


class PackedSampler:
    """Packed steps of ``batch_size * seq_len`` tokens for one rank, reproducible from (epoch, index)."""

    def __init__(self, data: Tensor, doc_starts: Tensor, seq_len: int, batch_size: int, seed: int, rank: int = 0,
                 world: int = 1):
        self.data, self.doc_starts, self.seq_len, self.budget = data, doc_starts, seq_len, batch_size * seq_len
        self.seed, self.rank, self.world = seed, rank, world
        self.epoch, self.index = 0, 0
        self._pieces: Pieces | None = None
        self._tokens_from: Tensor | None = None  # [P + 1]: tokens in pieces index.. of the shard

    def _shard(self) -> Pieces:
        if self._pieces is None:
            g = torch.Generator().manual_seed(self.seed * 100003 + self.epoch)
            offset = int(torch.randint(0, self.seq_len, (1,), generator=g))
            pieces = cut_documents(self.doc_starts, len(self.data), self.seq_len, offset)
            order = torch.randperm(len(pieces.start), generator=g)[self.rank::self.world]
            self._pieces = Pieces(*(t[order] for t in pieces))
            lengths = self._pieces.end - self._pieces.start
            self._tokens_from = torch.cat([lengths.flip(0).cumsum(0).flip(0), torch.zeros(1, dtype=torch.long)])
            if int(self._tokens_from[0]) < self.budget:
                raise ConfigError(f"train.batch_size: a step of {self.budget} tokens exceeds the "
                                  f"{int(self._tokens_from[0])} tokens of one rank's shard")
        return self._pieces

    def next_batch(self) -> tuple[PackedTokens, Tensor]:
        """(inputs, targets [batch_size * seq_len] int64 with IGNORE at document ends); advances the position."""
        pieces = self._shard()
        if int(self._tokens_from[self.index]) < self.budget:
            self.epoch, self.index, self._pieces = self.epoch + 1, 0, None
            pieces = self._shard()
        inputs, targets, self.index = pack_pieces(self.data, pieces, self.index, self.budget)
        return inputs, targets

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "index": self.index, "world": self.world}

    def load_state_dict(self, state: dict) -> None:
        if state["world"] != self.world:
            raise ConfigError(f"--resume: the checkpoint was written by {state['world']} ranks, this run has "
                              f"{self.world}; the data position cannot be continued exactly")
        self.epoch, self.index, self._pieces = state["epoch"], state["index"], None


def packed_eval_batches(data: Tensor, doc_starts: Tensor, seq_len: int, batch_size: int, n_batches: int,
                        rank: int = 0, world: int = 1) -> list[tuple[PackedTokens, Tensor]]:
    """This rank's share of ``n_batches`` fixed packed validation steps, starting at evenly spaced pieces."""
    pieces = cut_documents(doc_starts, len(data), seq_len)
    budget = batch_size * seq_len
    lengths = pieces.end - pieces.start
    tokens_from = lengths.flip(0).cumsum(0).flip(0)
    if int(tokens_from[0]) < budget:
        raise ConfigError(f"data.val_fraction: the validation split ({len(data)} bytes) holds less than one "
                          f"step of {budget} tokens")
    last_start = int((tokens_from >= budget).nonzero().max())  # the last piece a full step can start at
    firsts = torch.linspace(0, last_start, n_batches).round().long().tolist()
    return [pack_pieces(data, pieces, firsts[b], budget)[:2] for b in range(n_batches) if b % world == rank]
