"""Lazy attention's benchmark baselines: what a user would pick instead, run on the same inputs.

- ``sdpa_flash`` / ``sdpa_cudnn``: torch's scaled_dot_product_attention restricted to one backend,
  on plain causal attention of the same shape (no bias, no tau: a lower bound on the cost).
- ``flex``: FlexAttention with the distance bias as a score_mod and a causal block mask; it has no
  Elastic-Softmax (relu(P + tau/i) needs the final LSE before any output), so it is the biased
  softmax only.
- ``golden_compile``: torch.compile of the golden forward, with the backward that autograd and
  AOTAutograd derive from it (what a user gets by compiling the plain PyTorch operator).
"""
from __future__ import annotations

import functools
from typing import Callable

import torch
import torch.nn.functional as F

from ..benchmarks.baselines import NEEDS_CUDA, compiled, dynamic
from ..benchmarks.common import Candidate
from ..golden import lazy_attention as golden_attention

BASELINES = ("golden_compile", "sdpa_flash", "sdpa_cudnn", "flex")
NOTES = {
    "sdpa_flash": "torch SDPA, flash backend, plain causal attention of the same shape (no bias, no tau)",
    "sdpa_cudnn": "torch SDPA, cuDNN backend, the same plain causal attention",
    "flex": "FlexAttention with the distance bias as a score_mod and a causal block mask (plain softmax: "
            "the Elastic-Softmax relu(P + tau/i) needs the final LSE, which a score_mod cannot see); its backward "
            "takes the bias gradient too, which FlexAttention accumulates by atomic adds of every score into "
            "bias[h, distance]",
    "golden_compile": "torch.compile of the golden forward, backward derived by autograd (dense O(L^2) for "
                      "attention)",
}


def golden_compile(scale: float) -> Callable:
    """fn(q, k, v, bias, tau) -> O [B, H, L, D]: the compiled golden forward (causal, no lengths); B, L symbolic."""
    forward = compiled(golden_attention.forward)

    def fn(q, k, v, bias, tau):
        q, k, v = (dynamic(t, 0, 2) for t in (q, k, v))
        return forward(q, k, v, bias, tau, scale, None, True)[0]
    return fn


_SDPA = {"sdpa_flash": "FLASH_ATTENTION", "sdpa_cudnn": "CUDNN_ATTENTION"}


def sdpa(name: str, q, k, v, do, scale: float) -> Candidate:
    """SDPA restricted to one backend on q, k, v [B, H, L, D] (leaves that require grad), causal."""
    note = "plain causal attention, no bias/tau"
    if q.device.type != "cuda":
        return Candidate(name, reason=NEEDS_CUDA, note=note)
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = getattr(SDPBackend, _SDPA[name])

    def forward():
        with sdpa_kernel([backend]):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)

    return Candidate(name, forward=forward, fwd_bwd=lambda: torch.autograd.grad(forward(), (q, k, v), do), note=note)


@functools.cache
def _causal_block_mask(L: int, device: str):
    from torch.nn.attention.flex_attention import create_block_mask

    return create_block_mask(lambda b, h, q_idx, kv_idx: q_idx >= kv_idx, B=None, H=None, Q_LEN=L, KV_LEN=L,
                             device=device)


def distance_bias_score_mod(bias: torch.Tensor) -> Callable:
    """score_mod adding bias[h, q_idx - kv_idx] at causal distance < W (bias [H, W] fp32)."""
    W = bias.shape[1]

    def score_mod(score, b, h, q_idx, kv_idx):
        dist = q_idx - kv_idx
        near = (dist >= 0) & (dist < W)
        return score + torch.where(near, bias[h, dist.clamp(0, W - 1)], 0.0)

    return score_mod


# Tiles for FlexAttention where torch's defaults need more shared memory than the card has (torch 2.11 on an
# H100: forward at D=64 and backward at D=128 ask 245760 / 233472 of 232448 bytes); both head dims run with these.
FLEX_SMALL_TILES = {"BLOCK_M": 64, "BLOCK_N": 64, "num_stages": 2}
_flex_tiles: dict = {}  # head dim -> {"fwd": options, "fwd_bwd": options} once a default compile ran out of memory


def out_of_shared_memory(e: BaseException) -> bool:
    """Whether ``e`` is Inductor's failure to fit a Triton template into shared memory."""
    text = str(e)
    return "out of resource" in text or "No valid triton configs" in text


def with_smaller_tiles(run: Callable[[dict | None], object], key: tuple, cand: Candidate, what: str) -> Callable:
    """run(kernel_options) with torch's default tiles, or with FLEX_SMALL_TILES for good once they ran out of
    shared memory at ``key`` (head dim, direction); the candidate's note then says so."""
    def call():
        head_dim, direction = key
        options = _flex_tiles.get(head_dim, {}).get(direction)
        if options is None:
            try:
                return run(None)
            except Exception as e:
                if not out_of_shared_memory(e):
                    raise
                _flex_tiles.setdefault(head_dim, {})[direction] = options = dict(FLEX_SMALL_TILES)
        said = f"{what} with kernel_options {', '.join(f'{k}={v}' for k, v in options.items())}"
        if said not in cand.note:
            cand.note += f"; {said} (torch's default tiles exceed shared memory)"
        return run(options)
    return call


def flex(q, k, v, bias, do, scale: float) -> Candidate:
    """FlexAttention with the distance bias (a score_mod; its gradient is taken too) and a causal mask."""
    note = "bias as score_mod, no Elastic-Softmax"
    if q.device.type != "cuda":
        return Candidate("flex", reason=NEEDS_CUDA, note=note)
    from torch.nn.attention.flex_attention import flex_attention

    flex_compiled = compiled(flex_attention)
    mask = _causal_block_mask(q.shape[2], str(q.device))
    score_mod = distance_bias_score_mod(bias)

    def forward(options):
        return flex_compiled(*(dynamic(t, 0, 2) for t in (q, k, v)), score_mod=score_mod, block_mask=mask,
                             scale=scale, kernel_options=options)

    cand = Candidate("flex", note=note)
    D = q.shape[-1]
    cand.forward = with_smaller_tiles(forward, (D, "fwd"), cand, "fwd")
    cand.fwd_bwd = with_smaller_tiles(lambda o: torch.autograd.grad(forward(o), (q, k, v, bias), do), (D, "fwd_bwd"),
                                      cand, "fwd+bwd")
    return cand
