"""Checkpoints that resume a run exactly: model, optimizer, every rank's RNG states, data position.

One file, written by rank 0 atomically (into ``ckpt.pt.tmp``, flushed to disk with fsync, renamed
over ``ckpt.pt``, the directory fsynced), so a crash or kill during a save leaves the previous
checkpoint whole. It holds full
(unsharded) model and optimizer state dicts from ``torch.distributed.checkpoint.state_dict``, so
the same code serves one process, DDP and FSDP2. It loads with ``torch.load(weights_only=True)``:
every entry is a tensor or plain Python data.
"""
from __future__ import annotations

import os
import random
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                     get_optimizer_state_dict, set_model_state_dict,
                                                     set_optimizer_state_dict)

from ..config import ConfigError
from .distributed import DistEnv, gather_objects

FILENAME = "ckpt.pt"


def rng_state() -> dict:
    """This process's RNG states: torch CPU, every CUDA device, numpy and Python's random."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "numpy": {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "gauss": float(gauss)},
        "python": random.getstate(),
    }


def set_rng_state(state: dict) -> None:
    """Restore what :func:`rng_state` returned."""
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    n = state["numpy"]
    np.random.set_state((n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"]))
    random.setstate(state["python"])


def _options() -> StateDictOptions:
    return StateDictOptions(full_state_dict=True, cpu_offload=True)


def save(path: str | Path, model: nn.Module, optimizer: torch.optim.Optimizer, env: DistEnv, **extra) -> None:
    """Write the checkpoint (collective: every rank must call it; rank 0 writes).

    ``extra`` holds plain data to keep (step, sampler state, history, config).
    """
    model_state = get_model_state_dict(model, options=_options())
    optim_state = get_optimizer_state_dict(model, optimizer, options=_options())
    rngs = gather_objects(rng_state(), env)
    if not env.is_main:
        return
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as f:
            torch.save({"model": model_state, "optimizer": optim_state, "rng": rngs, **extra}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_directory(path.parent)


def _fsync_directory(directory: Path) -> None:
    """Make a rename in ``directory`` durable (POSIX; a no-op where directories cannot be opened)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def resolve_path(resume: str, out_dir: str) -> Path:
    """``auto`` -> out_dir/ckpt.pt; a directory -> its ckpt.pt; else the file itself."""
    path = Path(out_dir) / FILENAME if resume == "auto" else Path(resume)
    if path.is_dir():
        path = path / FILENAME
    if not path.is_file():
        raise ConfigError(f"--resume: no checkpoint at {str(path)!r}")
    return path


_KEYS = ("model", "optimizer", "rng", "step", "history", "sampler", "config")


def read(path: str | Path) -> dict:
    """The checkpoint at ``path`` as a mapping (CPU tensors); ConfigError in one line if it cannot be one."""
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - whatever torch.load raises, the file is not a readable checkpoint
        reason = " ".join(str(e).split()).split(". ")[0][:160] or type(e).__name__  # its first sentence
        raise ConfigError(f"--resume: {str(path)!r} is truncated or corrupted ({reason})") from None
    missing = [k for k in _KEYS if not isinstance(ckpt, dict) or k not in ckpt]
    if missing:
        raise ConfigError(f"--resume: {str(path)!r} is not a checkpoint of train.py (no {', '.join(missing)})")
    return ckpt


def model_differences(saved: dict, current: dict, prefix: str = "model") -> list[str]:
    """'key: checkpoint X, this run Y' for every key of two config sections that differs."""
    def show(section: dict, key: str) -> str:
        return repr(section[key]) if key in section else "(no such key)"

    return [f"{prefix}.{key}: checkpoint {show(saved, key)}, this run {show(current, key)}"
            for key in sorted(set(saved) | set(current)) if saved.get(key, _ABSENT) != current.get(key, _ABSENT)]


_ABSENT = object()


def load(path: str | Path, model: nn.Module, optimizer: torch.optim.Optimizer, env: DistEnv,
         config: dict) -> dict:
    """Restore model, optimizer and this rank's RNG states from ``path``; returns the whole checkpoint.

    ``config``: this run's config as a mapping (:func:`~.config.to_dict`); a checkpoint whose
    ``model`` section differs from it is refused, naming every key that differs.
    """
    ckpt = read(path)
    diffs = model_differences(ckpt["config"].get("model", {}), config["model"])
    if diffs:
        raise ConfigError(f"--resume: {str(path)!r} holds a different model: {'; '.join(diffs)}")
    if len(ckpt["rng"]) != env.world:
        raise ConfigError(f"--resume: {path} was written by {len(ckpt['rng'])} ranks, this run has {env.world}")
    try:
        set_model_state_dict(model, ckpt["model"], options=StateDictOptions(full_state_dict=True))
        set_optimizer_state_dict(model, optimizer, ckpt["optimizer"], options=StateDictOptions(full_state_dict=True))
    except (RuntimeError, KeyError, ValueError) as e:
        reason = " ".join(str(e).split())
        raise ConfigError(f"--resume: {str(path)!r} does not fit this model: {reason[:300]}") from None
    set_rng_state(ckpt["rng"][env.rank])
    return ckpt
