"""Memory of one training step with and without mHC recompute (train.mhc_recompute), on the config's device.

    python -m kernel_dispatch.training.memory --config configs/gpu-small.yaml --layers 12 [--block 0]
        [--steps 3] [--section.key=value ...]

Builds the config's model (``--layers`` overrides model.n_layers), runs ``--steps`` forward+backward
steps on the config's first training batch without and with recompute (same weights), and prints for
each: the bytes the forward leaves allocated (what autograd keeps for the backward, and the loss), the
peak over forward+backward above the memory held before the step (weights), and the step time; then
what recompute saved, what the memory model predicts (the streams x_l [tokens, n, dim] of all but the
first wrapper of each block), and whether the gradients are bitwise equal (CUDA: torch's deterministic algorithms
on, so that its own kernels do not differ between the two runs). CUDA: the caching allocator's counters; CPU: the
profiler's allocation records (no step time: the profiler dominates it).
"""
from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time

import torch

from ..config import ConfigError
from .config import load_run_config
from .data import ByteCorpus, PackedSampler, ShardedSampler
from .loop import _loss
from .model import LazyLM, recompute_block

MIB = 2.0 ** 20


def _cpu_step(model, x, y, cfg) -> tuple[int, int]:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        loss = _loss(model, x, y, cfg)
        torch.profiler.record_function("end of forward").__enter__().__exit__(None, None, None)
        loss.backward()
    events = sorted((e for e in prof.events()), key=lambda e: e.time_range.start)
    level, peak, kept = 0, 0, None
    for e in events:
        if e.name == "end of forward" and kept is None:
            kept = level
        level += e.self_cpu_memory_usage
        peak = max(peak, level)
    return kept, peak


def _cuda_step(model, x, y, cfg) -> tuple[int, int]:
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    loss = _loss(model, x, y, cfg)
    torch.cuda.synchronize()
    kept = torch.cuda.memory_allocated() - base
    loss.backward()
    torch.cuda.synchronize()
    return kept, torch.cuda.max_memory_allocated() - base


def measure(cfg, block: int, steps: int, device: torch.device, batch) -> dict:
    """{kept, peak (bytes), ms (median step time), grads} for a fresh model with recompute ``block`` (0: off)."""
    act_dtype = torch.bfloat16 if cfg.train.dtype == "bfloat16" else torch.float32
    torch.manual_seed(cfg.train.seed)
    model = LazyLM(cfg.model, act_dtype, block).to(device)
    x, y = (t.to(device) for t in batch)
    step = _cuda_step if device.type == "cuda" else _cpu_step
    kept = peak = 0
    times = []
    for i in range(steps):
        model.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        kept, peak = step(model, x, y, cfg)
        times.append(1e3 * (time.perf_counter() - t0))
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    return {"kept": kept, "peak": peak, "ms": statistics.median(times[1:] or times), "grads": grads}


def _first_batch(cfg):
    corpus = ByteCorpus(cfg.data.path, cfg.data.val_fraction, cfg.data.seq_len)
    if cfg.data.pack:
        return PackedSampler(corpus.train, corpus.train_docs, cfg.data.seq_len, cfg.train.batch_size,
                             cfg.train.seed).next_batch()
    return ShardedSampler(corpus.train, cfg.data.seq_len, cfg.train.batch_size, cfg.train.seed).next_batch()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     allow_abbrev=False)
    parser.add_argument("--config", help="YAML run config (default: the built-in defaults)")
    parser.add_argument("--layers", type=int, help="model.n_layers for this measurement")
    parser.add_argument("--block", type=int, default=0,
                        help="mHC wrappers per recompute block (default 0: sqrt(n * 2 n_layers / (n + 2)))")
    parser.add_argument("--steps", type=int, default=3, help="steps per setting; the last one is measured")
    args, overrides = parser.parse_known_args(argv)
    try:
        if args.layers is not None:
            overrides = overrides + [f"--model.n_layers={args.layers}"]
        cfg = load_run_config(args.config, overrides)
        if args.steps < 1 or args.block < 0:
            raise ConfigError(f"--steps: expected >= 1 and --block >= 0, got {args.steps} and {args.block}")
    except ConfigError as e:
        parser.exit(2, f"memory: error: {e}\n")
    want = cfg.train.device
    device = torch.device("cuda" if want == "cuda" or (want == "auto" and torch.cuda.is_available()) else "cpu")
    if device.type == "cuda":
        torch.set_float32_matmul_precision("high")
        # bitwise comparison: torch's own kernels deterministic too (embedding backward, cuBLAS workspaces)
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
    block = recompute_block(cfg.model, args.block)
    batch = _first_batch(cfg)
    off = measure(cfg, 0, args.steps, device, batch)
    on = measure(cfg, block, args.steps, device, batch)

    m, wrappers = cfg.model, 2 * cfg.model.n_layers
    tokens = batch[1].numel()
    stream_bytes = tokens * m.n_streams * m.dim * (2 if cfg.train.dtype == "bfloat16" else 4)
    dropped = wrappers - math.ceil(wrappers / block)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"model: {m.n_layers} layers ({wrappers} mHC wrappers), dim {m.dim}, n {m.n_streams}, {tokens} tokens "
          f"per step{' (packed)' if cfg.data.pack else ''}, {cfg.train.dtype}, {name}")
    print(f"{'mhc_recompute':<16}{'block':>6}{'kept after fwd MiB':>20}{'peak fwd+bwd MiB':>18}{'step ms':>10}")
    timed = device.type == "cuda"
    for label, b, r in (("off", "-", off), ("on", str(block), on)):
        ms = f"{r['ms']:.2f}" if timed else "-"
        print(f"{label:<16}{b:>6}{r['kept'] / MIB:>20.1f}{r['peak'] / MIB:>18.1f}{ms:>10}")
    saved = off["kept"] - on["kept"]
    print(f"saved: {saved / MIB:.1f} MiB after the forward ({100 * saved / max(off['kept'], 1):.0f}%), "
          f"{(off['peak'] - on['peak']) / MIB:.1f} MiB at the peak"
          + (f"; step time x{on['ms'] / off['ms']:.2f}" if timed else ""))
    print(f"memory model: {dropped} of {wrappers} stream tensors dropped = {dropped * stream_bytes / MIB:.1f} MiB "
          f"after the forward; the backward rebuilds up to {block - 1} of them at once "
          f"({(block - 1) * stream_bytes / MIB:.1f} MiB)")
    print(f"bytes kept after the forward: off {off['kept']}, on {on['kept']}, difference {off['kept'] - on['kept']}, "
          f"predicted {dropped * stream_bytes}")
    differ = [k for k in off["grads"] if not torch.equal(off["grads"][k], on["grads"][k])]
    print(f"gradients bitwise equal: {'yes' if not differ else 'NO'}")
    for k in differ[:5]:
        d = (off["grads"][k].float() - on["grads"][k].float()).abs().max().item()
        print(f"  {k}: max |difference| {d:.3e}")
    equal = not differ
    return 0 if equal else 1


if __name__ == "__main__":
    sys.exit(main())
