"""Text generation from a checkpoint written by train.py: prefill, then decode with the KV cache.

    python generate.py --ckpt runs/tiny/ckpt.pt --prompt "It is a truth" --max-new-tokens 200
    python generate.py --ckpt runs/tiny/ckpt.pt --prompt "It is a truth" --prompt "Emma" --top-k 20 --seed 1
    python generate.py --ckpt runs/gpu-small/ckpt.pt --prompt "It is" --cuda-graph     # decode as one CUDA graph

The model is byte-level: a prompt is its UTF-8 bytes, the output streams as text. Each prompt is prefilled
alone into its row of the cache (prompts of different lengths batch together), then every row decodes one
token per step through ``kd.lazy_attention_with_kvcache``. Greedy by default (``--temperature 0``);
``--temperature`` > 0 samples, ``--top-k`` keeps the k most likely bytes. Prints tokens/s at the end.
"""
from __future__ import annotations

import argparse
import codecs
import contextlib
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import torch

from . import cuda_graphs, registry
from .config import ConfigError
from .training import config as tcfg
from .training.model import LazyLM


def load_model(ckpt: str | Path, device: torch.device | str = "cpu", dtype: str | None = None) -> LazyLM:
    """The model of a train.py checkpoint, in eval mode on ``device`` (activations in the run's dtype unless
    ``dtype`` names one: float32 or bfloat16)."""
    path = Path(ckpt)
    if not path.is_file():
        raise ConfigError(f"--ckpt: no checkpoint at {str(path)!r}")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise ConfigError(f"--ckpt: {path} is not a readable checkpoint ({type(e).__name__}: {e})") from None
    if not isinstance(state, dict) or "model" not in state or "config" not in state:
        raise ConfigError(f"--ckpt: {path} holds no model and config (not written by train.py?)")
    cfg = tcfg.from_mapping(state["config"], str(path))
    dtype = dtype or cfg.train.dtype
    act_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
    model = LazyLM(cfg.model, act_dtype)
    model.load_state_dict(state["model"])
    return model.to(device).eval()


@dataclass(frozen=True)
class Sampling:
    """temperature 0: greedy (argmax); else softmax(logits / temperature) over the ``top_k`` most likely (0: all)."""

    temperature: float = 0.0
    top_k: int = 0

    def __post_init__(self):
        if not self.temperature >= 0:
            raise ValueError(f"temperature: expected >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k: expected >= 0, got {self.top_k}")

    def __call__(self, logits: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
        """Next tokens [B] int64 from logits [B, vocab]."""
        logits = logits.float()
        if self.temperature == 0:
            return logits.argmax(-1)
        if self.top_k:
            kth = logits.topk(min(self.top_k, logits.shape[-1]), dim=-1).values[:, -1:]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        probs = torch.softmax(logits / self.temperature, dim=-1)
        return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def _autocast(model: LazyLM):
    """bf16 models run their projections under autocast (as train.py trains them); fp32 ones as they are. No weight
    cache: a captured decode step must not keep casts made during capture."""
    device = model.embed.weight.device
    if model.act_dtype == torch.bfloat16:
        return torch.autocast(device.type, dtype=torch.bfloat16, cache_enabled=False)
    return contextlib.nullcontext()


class DecodeStep:
    """One decode step of every row: tokens [B] -> logits [B, vocab]; the cache gains one token per row.

    With ``cuda_graph`` the model's forward is captured once (static token and logits buffers) and replayed;
    the lengths advance on the device outside the graph, so every replay sees the new positions.
    """

    def __init__(self, model: LazyLM, cache, cuda_graph: bool = False):
        self.model, self.cache, self.graph = model, cache, None
        if cuda_graph:
            if not cache.k.is_cuda:
                raise ConfigError("--cuda-graph: needs the model on a CUDA device")
            self.tokens = torch.zeros(cache.seqlens.shape[0], 1, dtype=torch.long, device=cache.k.device)
            # the warm-up runs append at each row's next position without counting it: the first real step
            # writes the same positions again
            self.graph, self.logits = cuda_graphs.capture(self._forward)

    def _forward(self) -> torch.Tensor:
        with _autocast(self.model):
            return self.model(self.tokens, self.cache)[:, -1]

    def __call__(self, tokens: torch.Tensor) -> torch.Tensor:
        if self.graph is None:
            with _autocast(self.model):
                logits = self.model(tokens[:, None], self.cache)[:, -1]
        else:
            self.tokens.copy_(tokens[:, None])
            self.graph.replay()
            logits = self.logits
        self.cache.advance(1)
        return logits


@torch.no_grad()
def generate(model: LazyLM, prompts: list[bytes], max_new_tokens: int, sampling: Sampling = Sampling(),
             seed: int | None = None, cuda_graph: bool = False) -> Iterator[torch.Tensor]:
    """Yield the next token of every row [B] int64, ``max_new_tokens`` times.

    prompts: one byte string per row (at least one byte each); each is prefilled alone into its row.
    """
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("prompts: expected at least one prompt, each at least one byte long")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens: expected >= 1, got {max_new_tokens}")
    device = model.embed.weight.device
    generator = None if seed is None else torch.Generator(device=device).manual_seed(seed)
    cache = model.new_cache(len(prompts), max(len(p) for p in prompts) + max_new_tokens)
    last = []
    for b, prompt in enumerate(prompts):
        rows = cache.rows(b, b + 1)
        tokens = torch.tensor(list(prompt), dtype=torch.long, device=device)[None]
        with _autocast(model):
            last.append(model(tokens, rows)[:, -1])
        rows.advance(len(prompt))
    logits = torch.cat(last)
    step = DecodeStep(model, cache, cuda_graph)
    for i in range(max_new_tokens):
        tokens = sampling(logits, generator)
        yield tokens
        if i + 1 < max_new_tokens:
            logits = step(tokens)


@torch.no_grad()
def greedy_without_cache(model: LazyLM, prompt: bytes, max_new_tokens: int) -> list[int]:
    """Greedy decoding that recomputes the whole forward at every step (the reference of the cached path)."""
    tokens = list(prompt)
    device = model.embed.weight.device
    for _ in range(max_new_tokens):
        with _autocast(model):
            logits = model(torch.tensor(tokens, dtype=torch.long, device=device)[None])[0, -1]
        tokens.append(int(logits.float().argmax()))
    return tokens[len(prompt):]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python generate.py", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n")[1])
    p.add_argument("--ckpt", required=True, help="a ckpt.pt written by train.py")
    p.add_argument("--prompt", action="append", required=True, help="a prompt (repeat for a batch)")
    p.add_argument("--max-new-tokens", type=int, default=200)
    p.add_argument("--temperature", type=float, default=0.0, help="0: greedy (default)")
    p.add_argument("--top-k", type=int, default=0, help="sample among the k most likely bytes (0: all)")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument("--dtype", choices=("float32", "bfloat16"), help="activations (default: the run's)")
    p.add_argument("--backend", help="a backend for every operator (else the usual selection)")
    p.add_argument("--cuda-graph", action="store_true", help="decode each step as one captured CUDA graph")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        if args.max_new_tokens < 1:
            raise ConfigError(f"--max-new-tokens: expected >= 1, got {args.max_new_tokens}")
        sampling = Sampling(args.temperature, args.top_k)
        device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto"
                              else args.device)
        if args.backend:
            registry.set_yaml_backend(args.backend, "--backend")
        model = load_model(args.ckpt, device, args.dtype)
    except (ConfigError, ValueError) as e:
        print(f"generate.py: error: {e}", file=sys.stderr)
        return 2
    prompts = [p.encode() for p in args.prompt]
    decoders = [codecs.getincrementaldecoder("utf-8")(errors="replace") for _ in prompts]
    texts = [p for p in args.prompt]
    stream = len(prompts) == 1
    if stream:
        print(args.prompt[0], end="", flush=True)
    t0, n = time.perf_counter(), 0
    for tokens in generate(model, prompts, args.max_new_tokens, sampling, args.seed, args.cuda_graph):
        for b, t in enumerate(tokens.tolist()):
            piece = decoders[b].decode(bytes([t]))
            texts[b] += piece
            if stream:
                print(piece, end="", flush=True)
        n += len(prompts)
    seconds = time.perf_counter() - t0
    if stream:
        print()
    else:
        for b, text in enumerate(texts):
            print(f"--- prompt {b}\n{text}")
    print(f"{n} tokens in {seconds:.2f} s: {n / seconds:.1f} tokens/s ({len(prompts)} row(s), "
          f"{'CUDA graph' if args.cuda_graph else 'eager'}, {device.type})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
