"""Speed of kernel-dispatch inside transformers models, on one GPU.

    python -m kernel_dispatch.integrations.transformers_bench            # both tables (GPU)
    python -m kernel_dispatch.integrations.transformers_bench --only mhc --json runs/hf_bench.json
    python -m kernel_dispatch.integrations.transformers_bench --smoke    # tiny CPU run of the same code

- mHC: forward+backward of a DeepSeek-V4 decoder-layer stack (``DeepseekV4Model``: embedding, the layers,
  the final hyper head) at hidden 4096, 4 streams, 4096 tokens, bf16 with the checkpoint's fp32 modules,
  transformers' eager mHC against ``use_kernel_mhc`` per backend. Attention is V4's own (eager); the experts
  are fewer than V4's 256 (16, 6 per token) so that the stack fits one card. The check column is the
  relative error of the stack's output against eager on the first step.
- Lazy attention: one training step (forward, backward, AdamW step) of a Llama-style model, SDPA against
  ``add_lazy_attention`` (window 512, tau -1) per backend.
Times are medians of CUDA-event runs (kernel_dispatch.benchmarks.timing, L2 flushed before each), the rows of a table
timed in alternation: every model of a table is in memory at once (the defaults take a few GiB each; a row that does
not fit reports its out-of-memory error, and --backends can name fewer).
"""
from __future__ import annotations

import argparse
import copy
import gc
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import torch

from ..benchmarks import report
from ..benchmarks.common import short_error
from ..benchmarks.timing import Settings, Timer
from ..testing.matrix import rel_err


@dataclass(frozen=True)
class MHCBench:
    """The DeepSeek-V4 stack: sizes of transformers' DeepseekV4Config."""

    hidden: int = 4096
    layers: int = 2
    tokens: int = 4096
    hc_mult: int = 4
    heads: int = 64
    head_dim: int = 512
    q_lora_rank: int = 1024
    o_lora_rank: int = 1024
    o_groups: int = 8
    experts: int = 16
    experts_per_token: int = 6
    moe_intermediate: int = 2048
    vocab: int = 1024


@dataclass(frozen=True)
class LlamaBench:
    """The Llama-style model: sizes of transformers' LlamaConfig, and the batch."""

    hidden: int = 2048
    layers: int = 8
    heads: int = 16
    kv_heads: int = 8
    intermediate: int = 5632
    vocab: int = 32000
    batch: int = 2
    seq: int = 4096
    window: int = 512


SMOKE_MHC = MHCBench(hidden=64, layers=2, tokens=16, heads=4, head_dim=32, q_lora_rank=32, o_lora_rank=32,
                     o_groups=2, experts=4, experts_per_token=2, moe_intermediate=32, vocab=128)
SMOKE_LLAMA = LlamaBench(hidden=64, layers=2, heads=4, kv_heads=2, intermediate=128, vocab=128, batch=2, seq=16,
                         window=8)


def _release() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _built(make: Callable[[], Callable[[], object]]) -> Callable[[], object] | Exception:
    """``make()``: a model's step; an exception while building it (out of memory, say) is returned instead."""
    try:
        return make()
    except Exception as e:  # noqa: BLE001 - recorded in the table, the sweep goes on
        _release()
        return e


def _rows(timer: Timer, steps: dict[str, Callable[[], object] | Exception],
          checks: dict[str, Callable[[], float]] | None = None) -> list[dict]:
    """Time the steps in alternation (``Timer.measure_interleaved``: under a power cap the clocks move between
    steps timed one after the other, so every step is timed across the same span), then run each one's check;
    an exception (out of memory, an unavailable backend) becomes its row's error."""
    ready = {name: step for name, step in steps.items() if not isinstance(step, Exception)}
    timed = {**{name: e for name, e in steps.items() if isinstance(e, Exception)},
             **(timer.measure_interleaved(ready) if ready else {})}
    rows = []
    for name in steps:
        t = timed[name]
        if isinstance(t, Exception):
            rows.append({"name": name, "error": short_error(t)})
            continue
        row = {"name": name, "ms": t["median_ms"], "q1_ms": t["q1_ms"], "q3_ms": t["q3_ms"], "reps": t["reps"],
               "peak_mib": t["peak_mib"], "first_call_s": t["first_call_s"]}
        try:
            if checks and name in checks:
                row["check_rel_err"] = checks[name]()
        except Exception as e:  # noqa: BLE001
            row = {"name": name, "error": short_error(e)}
        rows.append(row)
    return rows


def _deepseek_v4(s: MHCBench, device: torch.device, dtype: torch.dtype):
    from transformers import DeepseekV4Config, DeepseekV4Model

    config = DeepseekV4Config(
        vocab_size=s.vocab, hidden_size=s.hidden, num_hidden_layers=s.layers, hc_mult=s.hc_mult,
        num_attention_heads=s.heads, head_dim=s.head_dim, q_lora_rank=s.q_lora_rank, o_lora_rank=s.o_lora_rank,
        o_groups=s.o_groups, n_routed_experts=s.experts, num_experts_per_tok=s.experts_per_token,
        moe_intermediate_size=s.moe_intermediate, num_nextn_predict_layers=0)
    torch.manual_seed(0)
    with torch.device(device):
        model = DeepseekV4Model(config)
    model.to(dtype)
    for name, module in model.named_modules():  # what from_pretrained keeps in fp32
        if any(name.endswith(k) for k in model._keep_in_fp32_modules_strict):
            module.float()
    for name, table in model.named_buffers():  # hash routing: distinct experts per token, as a checkpoint has
        if name.endswith("gate.tid2eid"):
            table.copy_(torch.rand(table.shape[0], s.experts, device=device).argsort(1)[:, :table.shape[1]])
    return model


def bench_mhc(s: MHCBench, backends: tuple[str, ...], timer: Timer, device: torch.device,
              dtype: torch.dtype) -> list[dict]:
    from .transformers import use_kernel_mhc

    eager = _deepseek_v4(s, device, dtype)
    ids = torch.randint(0, s.vocab, (1, s.tokens), device=device)

    def step(model) -> Callable[[], torch.Tensor]:
        def run():
            model.zero_grad(set_to_none=True)
            out = model(input_ids=ids).last_hidden_state
            out.float().square().mean().backward()
            return out.detach()
        return run

    reference = step(eager)()
    steps: dict[str, Callable[[], object] | Exception] = {"eager mHC (transformers)": step(eager)}
    checks = {}
    for backend in backends:
        name = f"kernel mHC, {backend}"
        steps[name] = _built(lambda backend=backend: step(use_kernel_mhc(copy.deepcopy(eager), backend=backend)))
        if not isinstance(steps[name], Exception):
            checks[name] = lambda run=steps[name]: rel_err(run(), reference)
    rows = _rows(timer, steps, checks)
    del steps, checks
    _release()
    return rows


def _llama(s: LlamaBench, device: torch.device, dtype: torch.dtype):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(hidden_size=s.hidden, num_hidden_layers=s.layers, num_attention_heads=s.heads,
                         num_key_value_heads=s.kv_heads, intermediate_size=s.intermediate, vocab_size=s.vocab,
                         max_position_embeddings=max(s.seq, 2048), attn_implementation="sdpa")
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(config)
    return model.to(dtype).train()


def bench_llama(s: LlamaBench, backends: tuple[str, ...], timer: Timer, device: torch.device,
                dtype: torch.dtype) -> list[dict]:
    from .transformers import add_lazy_attention

    ids = torch.randint(0, s.vocab, (s.batch, s.seq), device=device)

    def step(model) -> Callable[[], None]:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-5, foreach=True)

        def run():
            opt.zero_grad(set_to_none=True)
            model(input_ids=ids, labels=ids, use_cache=False).loss.backward()
            opt.step()
        return run

    def model_step(backend: str) -> Callable[[], None]:
        model = _llama(s, device, dtype)
        if backend != "sdpa":
            add_lazy_attention(model, window=s.window, tau_init=-1.0, backend=backend)
        return step(model)

    steps = {"SDPA (transformers)" if backend == "sdpa" else f"lazy attention, {backend}":
             _built(lambda backend=backend: model_step(backend)) for backend in ("sdpa",) + backends}
    rows = _rows(timer, steps)
    del steps
    _release()
    return rows


def _table(title: str, rows: list[dict], baseline: str) -> str:
    base = next((r["ms"] for r in rows if r["name"].startswith(baseline) and "ms" in r), None)
    lines = [f"## {title}", "", "| implementation | ms | +-% | speedup | peak MiB | check |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['name']} | not run: {r['error']} | | | | |")
            continue
        spread = 50 * (r["q3_ms"] - r["q1_ms"]) / r["ms"] if r["ms"] else 0.0
        ratio = f"{base / r['ms']:.2f}x" if base else ""
        check = f"rel err {r['check_rel_err']:.1e}" if "check_rel_err" in r else ""
        peak = "" if r["peak_mib"] is None else f"{r['peak_mib']:.0f}"
        lines.append(f"| {r['name']} | {r['ms']:.2f} | {spread:.1f} | {ratio} | {peak} | {check} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(prog="python -m kernel_dispatch.integrations.transformers_bench",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--smoke", action="store_true", help="tiny configs on the CPU with golden (seconds)")
    p.add_argument("--only", choices=("mhc", "llama"), help="run one of the two tables")
    p.add_argument("--backends", default=None, help="comma list for both tables (default on CUDA: tilelang,triton "
                   "for mHC, cute,tilelang,triton for lazy attention; golden with --smoke)")
    p.add_argument("--json", help="also write the rows and the environment to this file")
    args = p.parse_args(argv)
    from transformers import __version__ as transformers_version

    if args.smoke:
        device, dtype = torch.device("cpu"), torch.float32
        timer = Timer(device, Settings(warmup=0, min_reps=1, max_reps=2, budget_s=0.0, rounds=2))
        mhc, llama, defaults = SMOKE_MHC, SMOKE_LLAMA, {"mhc": ("golden",), "llama": ("golden",)}
    else:
        if not torch.cuda.is_available():
            p.error("no CUDA device: run with --smoke on a CPU")
        device, dtype = torch.device("cuda"), torch.bfloat16
        timer = Timer(device, Settings(warmup=2, min_reps=5, max_reps=20, budget_s=3.0))
        mhc, llama = MHCBench(), LlamaBench()
        defaults = {"mhc": ("tilelang", "triton"), "llama": ("cute", "tilelang", "triton")}
    chosen = tuple(b for b in args.backends.split(",") if b) if args.backends else None
    env = {**report.environment(device), "transformers": transformers_version}
    data: dict = {"env": env, "smoke": args.smoke, "dtype": str(dtype).replace("torch.", "")}
    out = [f"{env['card']}, torch {env['torch']}, transformers {env['transformers']}, triton {env['triton']}, "
           f"tilelang {env['tilelang']}, commit {env['git_commit']}, {data['dtype']}"]
    if args.only in (None, "mhc"):
        rows = bench_mhc(mhc, chosen or defaults["mhc"], timer, device, dtype)
        data["mhc"] = {"shape": asdict(mhc), "rows": rows}
        out.append(_table(f"DeepSeek-V4 stack, forward+backward: {mhc.layers} layers, hidden {mhc.hidden}, "
                          f"{mhc.hc_mult} streams, {mhc.tokens} tokens", data["mhc"]["rows"], "eager"))
    if args.only in (None, "llama"):
        rows = bench_llama(llama, chosen or defaults["llama"], timer, device, dtype)
        data["llama"] = {"shape": asdict(llama), "rows": rows}
        out.append(_table(f"Llama-style training step (forward, backward, AdamW): {llama.layers} layers, hidden "
                          f"{llama.hidden}, {llama.heads} heads of {llama.hidden // llama.heads}, batch "
                          f"{llama.batch} x {llama.seq}, W {llama.window}", data["llama"]["rows"], "SDPA"))
    print("\n\n".join(out))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(data, indent=1))
    return data


if __name__ == "__main__":
    main()
