"""A small decoder-only byte-level language model built from kernel_dispatch.nn layers.

tokens [B, L] int64 -> embedding [B, L, dim] -> n mHC streams [B, L, n, dim] -> per layer
MHC(RMSNorm -> LazyAttention) and MHC(RMSNorm -> SwiGLU) -> mean of the streams -> RMSNorm ->
logits [B, L, vocab] (in the autocast dtype). The streams run in ``act_dtype`` (fp32 on CPU,
bf16 for bf16 runs). Packed documents (:class:`~kernel_dispatch.training.data.PackedTokens`) run
as [T, ...] with the documents' boundaries passed to every attention layer: logits [T, vocab].
"""
from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from .. import registry, which_backend
from ..mhc_recompute import StreamRecompute, optimal_block
from ..nn import (MHC, KVCache, LazyAttention, PackedDocuments, PreNorm, RMSNorm, SwiGLU, collapse_streams,
                  expand_streams)
from ..registry import Resolution
from .config import ModelConfig
from .data import PackedTokens


def mlp_hidden(cfg: ModelConfig) -> int:
    """The SwiGLU width: ``cfg.mlp_hidden`` or 8/3 * dim rounded up to a multiple of 8."""
    return cfg.mlp_hidden or 8 * math.ceil(8 * cfg.dim / 3 / 8)


class DecoderBlock(nn.Module):
    """One transformer layer as two mHC-wrapped sublayers; [B, L, n, dim] -> [B, L, n, dim]."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        attn = LazyAttention(cfg.dim, cfg.n_heads, cfg.n_kv_heads, max_bias_length=cfg.max_bias_length,
                             rope_base=cfg.rope_base, tau_init=cfg.tau_init)
        mhc = dict(dim=cfg.dim, n_streams=cfg.n_streams, sinkhorn_iters=cfg.sinkhorn_iters,
                   alpha_init=cfg.mhc_alpha_init, res_diag=cfg.mhc_res_diag)
        self.attn = MHC(PreNorm(RMSNorm(cfg.dim), attn), **mhc)
        self.mlp = MHC(PreNorm(RMSNorm(cfg.dim), SwiGLU(cfg.dim, mlp_hidden(cfg))), **mhc)

    def forward(self, x: Tensor, documents: PackedDocuments | None = None,
                recompute: StreamRecompute | None = None, cache: KVCache | None = None) -> Tensor:
        """x [B, L, n, dim] -> [B, L, n, dim], or packed [T, n, dim] with ``documents``; with ``cache`` (this
        layer's) x holds each row's next tokens (inference)."""
        extra = {} if documents is None else {"documents": documents}
        if cache is not None:
            extra["cache"] = cache
        return self.mlp(self.attn(x, recompute=recompute, **extra), recompute=recompute)


class LazyLM(nn.Module):
    """The language model; ``forward(tokens [B, L] int64) -> logits [B, L, vocab_size]``.

    ``mhc_recompute`` > 0 rebuilds the mHC streams in the backward, keeping one per that many
    consecutive mHC wrappers (two per layer; see :mod:`kernel_dispatch.mhc_recompute`).
    """

    def __init__(self, cfg: ModelConfig, act_dtype: torch.dtype = torch.float32, mhc_recompute: int = 0):
        super().__init__()
        self.cfg, self.act_dtype, self.mhc_recompute = cfg, act_dtype, mhc_recompute
        self.embed = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.blocks = nn.ModuleList(DecoderBlock(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.dim)
        self.head = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        self._init_weights()

    def _init_weights(self) -> None:
        std = self.cfg.init_std
        for name, mod in self.named_modules():
            if isinstance(mod, (nn.Linear, nn.Embedding)):
                out_proj = name.endswith(".wo") or name.endswith(".w2")
                nn.init.normal_(mod.weight, std=std / math.sqrt(2 * self.cfg.n_layers) if out_proj else std)

    def new_cache(self, batch: int, capacity: int, device: torch.device | str | None = None) -> KVCache:
        """An empty :class:`KVCache` for ``batch`` rows of up to ``capacity`` tokens, in the activation dtype."""
        cfg = self.cfg
        device = self.embed.weight.device if device is None else device
        return KVCache(cfg.n_layers, batch, cfg.n_kv_heads, cfg.dim // cfg.n_heads, capacity, self.act_dtype, device)

    def forward(self, tokens: Tensor | PackedTokens, cache: KVCache | None = None) -> Tensor:
        """tokens [B, L] int64 -> logits [B, L, vocab_size]; PackedTokens ([T] tokens) -> logits [T, vocab_size].

        With ``cache`` (inference): tokens [B, Lq] are each row's next tokens after the ``cache.seqlens[b]`` it
        holds; they are appended to the cache, whose lengths the caller then advances (``cache.advance(Lq)``).
        """
        if cache is not None:
            x = expand_streams(self.embed(tokens).to(self.act_dtype), self.cfg.n_streams)
            for i, block in enumerate(self.blocks):
                x = block(x, cache=cache.layer(i))
            return self.head(self.norm(collapse_streams(x)))
        documents = None
        if isinstance(tokens, PackedTokens):
            documents = PackedDocuments.from_cu_seqlens(tokens.cu_seqlens, tokens.tokens.shape[0], tokens.max_seqlen)
            tokens = tokens.tokens
        x = expand_streams(self.embed(tokens).to(self.act_dtype), self.cfg.n_streams)
        recompute = StreamRecompute(self.mhc_recompute) if self.mhc_recompute else None
        for block in self.blocks:
            x = block(x, documents, recompute)
        return self.head(self.norm(collapse_streams(x)))

    def decay_parameters(self) -> tuple[list[nn.Parameter], list[nn.Parameter]]:
        """(weights of Linear and Embedding layers, everything else): the AdamW decay groups."""
        decay = {id(m.weight) for m in self.modules() if isinstance(m, (nn.Linear, nn.Embedding))}
        params = list(self.parameters())
        return [p for p in params if id(p) in decay], [p for p in params if id(p) not in decay]


def recompute_block(cfg: ModelConfig, block: int) -> int:
    """mHC wrappers per recompute block: ``block``, or for 0 the paper's optimum for this model's 2 * n_layers."""
    return block or optimal_block(cfg.n_streams, 2 * cfg.n_layers)


def resolve_backends(cfg: ModelConfig, device: torch.device, act_dtype: torch.dtype,
                     packed: bool = False) -> list[Resolution]:
    """The backend each operator of this model resolves to on ``device`` / ``act_dtype``, and its source.

    Probes :func:`kernel_dispatch.which_backend` with tensors shaped like the model's calls (attention
    over packed documents for ``packed``), so an explicit choice that cannot run raises here, before
    training starts.
    """
    hd, n = cfg.dim // cfg.n_heads, cfg.n_streams
    f32 = dict(device=device, dtype=torch.float32)
    q = torch.zeros(1, cfg.n_heads, 1, hd, device=device, dtype=act_dtype)
    kv = torch.zeros(1, cfg.n_kv_heads, 1, hd, device=device, dtype=act_dtype)
    x = torch.zeros(1, n, cfg.dim, device=device, dtype=act_dtype)
    M = n * n + 2 * n
    params = (torch.zeros(cfg.n_heads, cfg.max_bias_length, **f32), torch.zeros(cfg.n_heads, **f32))
    if packed:
        cu = torch.tensor([0, 1], dtype=torch.int32, device=device)
        attention = which_backend("lazy_attention_varlen", q[0].transpose(0, 1), kv[0].transpose(0, 1),
                                  kv[0].transpose(0, 1), *params, cu)
    else:
        attention = which_backend("lazy_attention", q, kv, kv, *params)
    return [
        attention,
        which_backend("mhc_pre", x, torch.zeros(M, n * cfg.dim, **f32), torch.zeros(3, **f32), torch.zeros(M, **f32),
                      torch.ones(n * cfg.dim, **f32)),
        which_backend("mhc_post", x[:, 0], x, torch.zeros(1, n, **f32), torch.zeros(1, n, n, **f32)),
    ]


def backend_line(resolutions: list[Resolution]) -> str:
    """'backends: lazy_attention=golden (auto, from YAML configs/tiny.yaml), ...'.

    Each entry names the backend of each direction ("triton fwd/golden bwd" when they differ),
    whether ``auto`` picked it, and where the choice came from.
    """
    parts = []
    for r in resolutions:
        pair = r.forward if r.forward == r.backward else f"{r.forward} fwd/{r.backward} bwd"
        (fwd, bwd), _ = registry.current_choice(r.op)
        how = "auto, " if fwd == bwd == "auto" else ("partly auto, " if "auto" in (fwd, bwd) else "")
        parts.append(f"{r.op}={pair} ({'auto' if r.source == 'auto' else how + 'from ' + r.source})")
    return "backends: " + ", ".join(parts)
