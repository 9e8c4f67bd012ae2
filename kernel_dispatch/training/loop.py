"""The training loop behind train.py: one process, or one rank of a torchrun job (DDP / FSDP2).

:func:`train` builds everything from a :class:`RunConfig`, prints (rank 0 only) a start line
naming the backend of every operator and where the choice came from, trains with a tqdm bar
(loss, tokens/s), evaluates at ``eval_interval``, checkpoints, and writes ``loss.png`` and
``summary.json`` into ``out_dir``. The learning rate is a function of the step and the data
position is part of the checkpoint, so ``resume`` continues exactly.
"""
from __future__ import annotations

import contextlib
import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from tqdm import tqdm

from ..config import ConfigError
from . import checkpoint, distributed
from .config import RunConfig, to_dict
from .data import IGNORE, ByteCorpus, PackedSampler, ShardedSampler, eval_batches, packed_eval_batches
from .graphed import GraphedStep
from .model import LazyLM, backend_line, recompute_block, resolve_backends
from .plot import loss_curve


@dataclass
class RunResult:
    """What a run leaves: the model (unwrapped; sharded under FSDP2), its loss history and summary."""

    model: nn.Module
    history: dict
    summary: dict


def lr_at(step: int, cfg: RunConfig) -> float:
    """Linear warm-up over ``warmup_steps``, then cosine decay from ``lr`` to ``min_lr`` at ``max_steps``."""
    tc = cfg.train
    if step < tc.warmup_steps:
        return tc.lr * (step + 1) / tc.warmup_steps
    span = max(1, tc.max_steps - tc.warmup_steps)
    progress = min(1.0, (step - tc.warmup_steps) / span)
    return tc.min_lr + 0.5 * (tc.lr - tc.min_lr) * (1.0 + math.cos(math.pi * progress))


def _autocast(cfg: RunConfig, device: torch.device):
    if cfg.train.dtype == "bfloat16":  # no weight-cast cache under CUDA-graph capture (PyTorch's graph rules)
        return torch.autocast(device.type, dtype=torch.bfloat16, cache_enabled=not cfg.train.cuda_graph)
    return contextlib.nullcontext()


def _loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor, cfg: RunConfig, reduction: str = "mean"):
    with _autocast(cfg, x.device):
        logits = model(x)
    return F.cross_entropy(logits.float().flatten(0, -2), y.flatten(), reduction=reduction, ignore_index=IGNORE)


def _check_cuda_graph(cfg: RunConfig, env: distributed.DistEnv) -> None:
    if cfg.train.cuda_graph and env.device.type != "cuda":
        raise ConfigError(f"train.cuda_graph: needs a CUDA device, got {env.device.type}")
    if cfg.train.cuda_graph and env.distributed:
        raise ConfigError("train.cuda_graph: one process only (DDP and FSDP2 communicate inside the step)")


@torch.no_grad()
def evaluate(model: nn.Module, batches: list, cfg: RunConfig, env: distributed.DistEnv) -> float:
    """Mean loss (nats per byte) over every rank's validation batches."""
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    for x, y in batches:
        total += _loss(model, x.to(env.device), y.to(env.device), cfg, reduction="sum").item()
        count += int((y != IGNORE).sum())
    model.train(was_training)
    total, count = distributed.sum_over_ranks([total, float(count)], env)
    return total / count


def _optimizer(net: LazyLM, cfg: RunConfig) -> torch.optim.Optimizer:
    decay, no_decay = net.decay_parameters()
    tc = cfg.train
    groups = [{"params": decay, "weight_decay": tc.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=tc.lr, betas=(tc.beta1, tc.beta2))


def train(cfg: RunConfig, resume: str | None = None, config_name: str = "") -> RunResult:
    """Run the configured training (see the module docstring); ``resume``: a checkpoint path, dir or 'auto'."""
    env = distributed.setup(cfg.train.device)
    try:
        return _train(cfg, env, resume, config_name)
    finally:
        distributed.teardown(env)


def _train(cfg: RunConfig, env: distributed.DistEnv, resume: str | None, config_name: str) -> RunResult:
    t_start = time.perf_counter()
    tc, dev = cfg.train, env.device
    _check_cuda_graph(cfg, env)
    log = (lambda msg: tqdm.write(msg, file=sys.stdout)) if env.is_main else (lambda msg: None)
    act_dtype = torch.bfloat16 if tc.dtype == "bfloat16" else torch.float32
    if dev.type == "cuda":
        torch.set_float32_matmul_precision("high")
    if tc.threads:
        torch.set_num_threads(tc.threads)
    out_dir = Path(tc.out_dir)

    torch.manual_seed(tc.seed)
    corpus = ByteCorpus(cfg.data.path, cfg.data.val_fraction, cfg.data.seq_len)
    n_eval = -(-tc.eval_batches // env.world) * env.world  # equal count per rank (FSDP2 forwards are collective)
    if cfg.data.pack:
        sampler = PackedSampler(corpus.train, corpus.train_docs, cfg.data.seq_len, tc.batch_size, tc.seed,
                                env.rank, env.world)
        val = packed_eval_batches(corpus.val, corpus.val_docs, cfg.data.seq_len, tc.batch_size, n_eval, env.rank,
                                  env.world)
    else:
        sampler = ShardedSampler(corpus.train, cfg.data.seq_len, tc.batch_size, tc.seed, env.rank, env.world)
        val = eval_batches(corpus.val, cfg.data.seq_len, tc.batch_size, n_eval, env.rank, env.world)
    mhc_recompute = recompute_block(cfg.model, tc.mhc_recompute_block) if tc.mhc_recompute else 0
    net = LazyLM(cfg.model, act_dtype, mhc_recompute).to(dev)
    resolutions = resolve_backends(cfg.model, dev, act_dtype, packed=cfg.data.pack)
    n_params = sum(p.numel() for p in net.parameters())
    where = f"{env.world} ranks ({'DDP' if tc.dist == 'ddp' else 'FSDP2'})" if env.distributed else "1 process"
    data_line = f"{len(corpus.train):,} training bytes" + (
        f" packed from {len(corpus.train_docs)} chapters" if cfg.data.pack else "")
    recompute_line = f" | mHC recompute every {mhc_recompute} wrappers" if mhc_recompute else ""
    log(f"train: {config_name or 'config'} | {n_params:,} parameters | {dev.type} {tc.dtype} | {where} | "
        f"{data_line}{recompute_line}")
    log(backend_line(resolutions))

    model = distributed.wrap(net, env, tc.dist)
    optimizer = _optimizer(net, cfg)
    step_model = torch.compile(model) if tc.compile else model
    history: dict = {"train": [], "eval": []}
    step = 0
    if resume:
        path = checkpoint.resolve_path(resume, tc.out_dir)
        ckpt = checkpoint.load(path, model, optimizer, env)
        if ckpt["config"]["model"] != to_dict(cfg)["model"]:
            raise ConfigError(f"--resume: the model section of {path} differs from this config's")
        step, history = ckpt["step"], ckpt["history"]
        sampler.load_state_dict(ckpt["sampler"])
        log(f"resumed from {path} at step {step}")
    else:
        loss0 = evaluate(step_model, val, cfg, env)
        history["eval"].append([0, loss0])
        log(f"step 0: eval loss {loss0:.4f}")

    def save_checkpoint() -> None:
        checkpoint.save(out_dir / checkpoint.FILENAME, model, optimizer, env, step=step, history=history,
                        sampler=sampler.state_dict(), config=to_dict(cfg))

    tokens_per_step = tc.batch_size * cfg.data.seq_len * env.world
    timed_steps, timed_s, rate, first_step = 0, 0.0, 0.0, step
    bar = tqdm(total=tc.max_steps, initial=step, unit="step", dynamic_ncols=True,
               disable=not (env.is_main and tc.progress))
    model.train()
    graphed = None  # with train.cuda_graph: captured after this process's first (eager) step
    while step < tc.max_steps:
        t0 = time.perf_counter()
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, cfg)
        x, y = (t.to(dev, non_blocking=True) for t in sampler.next_batch())
        if graphed is not None:
            loss = graphed(x, y)
        else:
            loss = _loss(step_model, x, y, cfg)
            loss.backward()
            loss = loss.detach()  # a live autograd graph would keep the parameters' grad accumulators on this stream
        if tc.grad_clip > 0:
            nn.utils.clip_grad_norm_(model.parameters(), tc.grad_clip)
        optimizer.step()
        if graphed is None:  # the graph owns the gradient tensors: they stay
            optimizer.zero_grad(set_to_none=True)
            if tc.cuda_graph:
                graphed = GraphedStep(step_model, x, y, lambda m, a, b: _loss(m, a, b, cfg))
        step += 1
        loss_value = distributed.mean_over_ranks(loss.item(), env)
        history["train"].append([step, loss_value])
        dt = time.perf_counter() - t0
        if step > first_step + 1:  # this process's first step pays for compilation and warm-up
            timed_steps, timed_s = timed_steps + 1, timed_s + dt
        rate = tokens_per_step * timed_steps / timed_s if timed_s else tokens_per_step / dt
        bar.set_postfix(loss=f"{loss_value:.3f}", tok_s=f"{rate:,.0f}", refresh=False)
        bar.update(1)
        if step % tc.eval_interval == 0 or step == tc.max_steps:
            eval_loss = evaluate(step_model, val, cfg, env)
            history["eval"].append([step, eval_loss])
            log(f"step {step}: eval loss {eval_loss:.4f} (train {loss_value:.4f}, {rate:,.0f} tokens/s)")
        if (tc.ckpt_interval and step % tc.ckpt_interval == 0) or step == tc.max_steps:
            save_checkpoint()
    bar.close()

    summary = {
        "config": config_name, "steps": step, "world_size": env.world, "device": _device_name(dev),
        "dtype": tc.dtype, "dist": tc.dist if env.distributed else None, "compile": tc.compile,
        "cuda_graph": tc.cuda_graph, "pack": cfg.data.pack, "mhc_recompute": mhc_recompute,
        "backends": [str(r) for r in resolutions], "parameters": n_params,
        "initial_eval_loss": history["eval"][0][1] if history["eval"] else None,
        "final_eval_loss": history["eval"][-1][1] if history["eval"] else None,
        "tokens_per_s": rate, "wall_s": time.perf_counter() - t_start, "torch": torch.__version__,
    }
    if env.is_main:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        if tc.plot:
            try:
                png = loss_curve(history, out_dir / "loss.png", f"{config_name} ({summary['device']})")
                log(f"wrote {png}")
            except ImportError as e:  # a finished run must not fail for want of a plotting library
                log(f"no loss.png: {e}")
        first, last = summary["initial_eval_loss"], summary["final_eval_loss"]
        log(f"done: {step} steps, eval loss {first:.4f} -> {last:.4f}, {rate:,.0f} tokens/s, "
            f"{summary['wall_s']:.1f} s")
    return RunResult(net, history, summary)


def _device_name(dev: torch.device) -> str:
    return torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
