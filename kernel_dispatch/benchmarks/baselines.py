"""What a user would pick instead of a kernel_dispatch backend, run on the same inputs.

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

from ..golden import lazy_attention as golden_attention
from ..golden import mhc_post as golden_post
from ..golden import mhc_pre as golden_pre
from .common import Candidate

ATTENTION = ("golden_compile", "sdpa_flash", "sdpa_cudnn", "flex")
MHC = ("golden_compile",)
NEEDS_CUDA = "needs a CUDA device"


@functools.cache
def _compiled(fn: Callable) -> Callable:
    # one compiled object per function for the whole run, so later shapes reuse its graphs
    return torch.compile(fn)


def _dynamic(t: torch.Tensor, *dims: int) -> torch.Tensor:
    # sizes that change along the sweep are symbolic, so one graph serves every point (a static
    # compile per shape would cost minutes of the run; n and the head dim stay static)
    for d in dims:
        torch._dynamo.maybe_mark_dynamic(t, d)
    return t


def golden_compile_attention(scale: float) -> Callable:
    """fn(q, k, v, bias, tau) -> O [B, H, L, D]: the compiled golden forward (causal, no lengths); B, L symbolic."""
    compiled = _compiled(golden_attention.forward)

    def fn(q, k, v, bias, tau):
        q, k, v = (_dynamic(t, 0, 2) for t in (q, k, v))
        return compiled(q, k, v, bias, tau, scale, None, True)[0]
    return fn


def _golden_block(x, phi, alpha, bias, gamma):
    h_in, h_post, h_res, _, _ = golden_pre.forward(x, phi, alpha, bias, gamma, 20, 2.0, 1e-6, 1e-6, 1e-6)
    return golden_post.forward(h_in, x, h_post, h_res)


def golden_compile_mhc() -> Callable:
    """fn(x, phi, alpha, bias, gamma) -> out [T, n, D]: compiled golden pre -> identity -> post; T, D symbolic."""
    compiled = _compiled(_golden_block)

    def fn(x, phi, alpha, bias, gamma):
        return compiled(_dynamic(x, 0, 2), _dynamic(phi, 1), alpha, bias, _dynamic(gamma, 0))
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

    compiled = _compiled(flex_attention)
    mask = _causal_block_mask(q.shape[2], str(q.device))
    score_mod = distance_bias_score_mod(bias)

    def forward(options):
        return compiled(*(_dynamic(t, 0, 2) for t in (q, k, v)), score_mod=score_mod, block_mask=mask, scale=scale,
                        kernel_options=options)

    cand = Candidate("flex", note=note)
    D = q.shape[-1]
    cand.forward = with_smaller_tiles(forward, (D, "fwd"), cand, "fwd")
    cand.fwd_bwd = with_smaller_tiles(lambda o: torch.autograd.grad(forward(o), (q, k, v, bias), do), (D, "fwd_bwd"),
                                      cand, "fwd+bwd")
    return cand
