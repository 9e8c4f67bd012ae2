"""The byte-level corpus and a resumable, rank-sharded batch sampler.

Tokens are the file's bytes (vocabulary 256). The last ``val_fraction`` of the file is held out.
Training windows start on a grid of ``seq_len`` bytes shifted by a random offset each epoch and
are shuffled per epoch; rank r of w takes every w-th window of the shuffled order, so each rank
reads its own shard. The sampler's position (epoch, index) is its whole state.
"""
from __future__ import annotations

from pathlib import Path

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
        try:
            raw = path.read_bytes()
        except OSError as e:
            raise ConfigError(f"data.path: cannot read {str(path)!r}: {e.strerror or e}") from None
        if not raw:
            raise ConfigError(f"data.path: {str(path)!r} is empty")
        data = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
        split = int(len(data) * (1.0 - val_fraction))
        self.train, self.val = data[:split], data[split:]
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
        # An epoch's grid starts at a random offset below seq_len; the largest offset leaves the fewest
        # windows, and rank world - 1 gets the fewest of them.
        fewest = len(range(seq_len - 1, len(data) - seq_len, seq_len)) // world
        if fewest < batch_size:
            raise ConfigError(f"train.batch_size: expected at most {fewest}, the windows of data.seq_len = {seq_len} "
                              f"bytes in one rank's shard of the {len(data):,} training bytes, got {batch_size}")

    def _shard(self) -> Tensor:
        if self._order is None:
            g = torch.Generator().manual_seed(self.seed * 100003 + self.epoch)
            offset = int(torch.randint(0, self.seq_len, (1,), generator=g))
            starts = torch.arange(offset, len(self.data) - self.seq_len, self.seq_len)
            self._order = starts[torch.randperm(len(starts), generator=g)][self.rank::self.world]
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
