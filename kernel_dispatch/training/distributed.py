"""torch.distributed set-up for torchrun: process group, device, DDP or FSDP2 wrapping, reductions.

Without torchrun (no WORLD_SIZE in the environment, or 1) everything is a no-op on one process.
Under torchrun: gloo on CPU, nccl on CUDA (one GPU per local rank).
"""
from __future__ import annotations

import gc
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from ..config import ConfigError


@dataclass(frozen=True)
class DistEnv:
    """This process's place: rank, world size, local rank and its device."""

    rank: int
    world: int
    local_rank: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world > 1


def setup(device: str) -> DistEnv:
    """Pick the device (``auto``, ``cpu`` or ``cuda``) and, under torchrun, join the process group."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank, local_rank = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    use_cuda = torch.cuda.is_available() if device == "auto" else device == "cuda"
    if use_cuda and not torch.cuda.is_available():
        raise ConfigError("train.device: 'cuda' was asked for but torch sees no CUDA device")
    if use_cuda:
        if local_rank >= torch.cuda.device_count():
            raise ConfigError(f"LOCAL_RANK {local_rank}: only {torch.cuda.device_count()} CUDA device(s)")
        torch.cuda.set_device(local_rank)
        dev = torch.device("cuda", local_rank)
    else:
        dev = torch.device("cpu")
    if world > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if use_cuda else "gloo", **({"device_id": dev} if use_cuda else {}))
    return DistEnv(rank, world, local_rank, dev)


def wrap(model: nn.Module, env: DistEnv, strategy: str) -> nn.Module:
    """DDP (``ddp``) or FSDP2 ``fully_shard`` per decoder block and at the root (``fsdp2``)."""
    if not env.distributed:
        return model
    if strategy == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(model, device_ids=[env.local_rank] if env.device.type == "cuda" else None)
    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError as e:
        raise ConfigError(f"train.dist: fsdp2 needs torch.distributed.fsdp.fully_shard (torch >= 2.6); "
                          f"this torch {torch.__version__} has none ({e})") from e
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    return model


def mean_over_ranks(value: float, env: DistEnv) -> float:
    """The mean of a Python float over all ranks (the value itself on one process)."""
    if not env.distributed:
        return value
    t = torch.tensor([value], dtype=torch.float64, device=env.device)
    dist.all_reduce(t)
    return t.item() / env.world


def sum_over_ranks(values: list[float], env: DistEnv) -> list[float]:
    """Element-wise sums of a list of floats over all ranks."""
    if not env.distributed:
        return values
    t = torch.tensor(values, dtype=torch.float64, device=env.device)
    dist.all_reduce(t)
    return t.tolist()


def gather_objects(obj, env: DistEnv) -> list:
    """[obj of rank 0, obj of rank 1, ...] on every rank."""
    if not env.distributed:
        return [obj]
    out = [None] * env.world
    dist.all_gather_object(out, obj)
    return out


def teardown(env: DistEnv) -> None:
    """Leave the process group (if this process joined one).

    The checkpoint's state-dict walk (torch.distributed.checkpoint.state_dict: a recursive closure over a set of
    visited modules) leaves a reference cycle that holds the DDP wrapper, whose reducer keeps the process group's
    backend alive; collected only at interpreter exit, that backend can abort the finished process ("terminate
    called without an active exception", SIGABRT). So the cycles are collected first, while the group exists."""
    if env.distributed and dist.is_initialized():
        gc.collect()
        dist.barrier()
        dist.destroy_process_group()
