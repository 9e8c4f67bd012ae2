"""Packed-document test cases (boundaries that break kernels) and their random inputs, for the matrix."""
from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from ..declaration import BadValues
from ..testing.matrix import Inputs, replacing
from .lazy_attention_cases import away_from_kink, random_tau


@dataclass(frozen=True)
class VarlenCase:
    name: str
    docs: tuple[int, ...] = (21, 27)  # document lengths, in order; 0 is an empty document
    H: int = 3
    Hkv: int = 3
    D: int = 32
    W: int = 8
    causal: bool = True
    tau: tuple[float, ...] | None = None  # per head; None: a mix of signs, never exactly -1
    gpu_only: bool = False  # runs on a CUDA device only

    @property
    def T(self) -> int:
        return sum(self.docs)


def _drawn(n: int, lo: int, hi: int, seed: int, total: int | None = None) -> tuple[int, ...]:
    """n document lengths in [lo, hi] from a fixed seed; with ``total``, drawn until they fill it exactly."""
    rng = random.Random(seed)
    if total is None:
        return tuple(rng.randint(lo, hi) for _ in range(n))
    out: list[int] = []
    while sum(out) < total:
        out.append(min(rng.randint(lo, hi), total - sum(out)))
    return tuple(out)


CASES = (
    VarlenCase("one_document", docs=(37,)),
    VarlenCase("empty_one_short_long", docs=(0, 1, 5, 150, 0, 23, 0), W=6),
    VarlenCase("boundary_inside_tile", docs=(13, 19, 8, 33)),
    VarlenCase("hundreds_of_documents", docs=_drawn(240, 0, 3, seed=1), H=2, Hkv=1, D=16),
    VarlenCase("w_gt_document", docs=(10, 20, 3), W=64),
    VarlenCase("gqa_noncausal", docs=(17, 0, 29, 1), H=4, Hkv=2, causal=False),
    VarlenCase("head_dim64", docs=(40, 31), H=2, Hkv=2, D=64),
    VarlenCase("tau_positive", docs=(9, 24), tau=(0.3, 0.05, 1.0)),
    VarlenCase("tau_below_minus1", docs=(9, 24), tau=(-1.5, -3.0, -1.2)),
    VarlenCase("realistic_d128", docs=_drawn(0, 64, 4096, seed=0, total=16384), H=16, Hkv=16, D=128, W=512,
               gpu_only=True),
    VarlenCase("realistic_gqa_noncausal", docs=(1000, 1, 2047, 700), H=16, Hkv=4, D=64, W=256, causal=False,
               gpu_only=True),
    # the kernel-breaking documents at a head dim every GPU backend takes (TileLang: 64 and 128): empty ones, one
    # token, each side of the 64- and 128-row tiles, then two hundred of 0..5 tokens
    VarlenCase("edges_d64", docs=(0, 1, 63, 64, 65, 0, 127, 128, 129) + _drawn(200, 0, 5, seed=2), H=2, Hkv=1, D=64,
               W=32, gpu_only=True),
)


# Boundaries the cu_seqlens and max_seqlen checks refuse, from "boundary_inside_tile" (documents 13, 19, 8, 33; T = 73).
BAD_VALUES = (
    BadValues("first_boundary_not_0", "boundary_inside_tile", replacing("cu_seqlens", (1, 13, 32, 40, 73)),
              ("cu_seqlens", "cu_seqlens[0] == 0", "got 1")),
    BadValues("decreasing", "boundary_inside_tile", replacing("cu_seqlens", (0, 13, 12, 40, 73)),
              ("cu_seqlens", "non-decreasing", "cu_seqlens[1] = 13 > cu_seqlens[2] = 12")),
    BadValues("last_boundary_not_T", "boundary_inside_tile", replacing("cu_seqlens", (0, 13, 32, 40, 72)),
              ("cu_seqlens", "T = q.shape[0] = 73", "got 72")),
    BadValues("max_seqlen_too_small", "boundary_inside_tile", replacing("max_seqlen", 20),
              ("max_seqlen", "smaller than the longest document (33 tokens)")),
)


def fused_qkv(inp: Inputs) -> Inputs:
    """q, k, v as the head slices of one [T, H + 2 Hkv, D] projection (a fused QKV layer), dO in the distinct
    layout of :func:`kernel_dispatch.testing.layouts.relaid`."""
    from ..testing.layouts import relaid

    out = relaid(inp)
    q, k, v = (inp.tensors[n] for n in ("q", "k", "v"))
    H, Hkv = q.shape[1], k.shape[1]
    proj = torch.cat([q, k, v], dim=1)
    fused = {"q": proj[:, :H], "k": proj[:, H:H + Hkv], "v": proj[:, H + Hkv:]}
    return Inputs({**out.tensors, **fused}, out.kwargs, out.grads)


LAYOUTS = {"fused_qkv": fused_qkv}


def cu_seqlens_of(docs, device="cpu") -> torch.Tensor:
    """[N + 1] int32 boundaries of documents of the given lengths."""
    out = [0]
    for n in docs:
        out.append(out[-1] + n)
    return torch.tensor(out, dtype=torch.int32, device=device)


def make_inputs(case: VarlenCase, dtype: torch.dtype, device: str = "cpu", seed: int = 0) -> Inputs:
    """Random packed inputs of ``case``: q [T, H, D], k, v [T, Hkv, D] in ``dtype``, bias, tau fp32, cu_seqlens."""
    g = torch.Generator(device="cpu").manual_seed(seed)

    def rnd(*shape, scale=1.0, dt=dtype):
        return (scale * torch.randn(*shape, generator=g)).to(dt).to(device)

    c = case
    q, k, v = rnd(c.T, c.H, c.D), rnd(c.T, c.Hkv, c.D), rnd(c.T, c.Hkv, c.D)
    bias = rnd(c.H, c.W, scale=0.5, dt=torch.float32)
    tau = torch.tensor(c.tau, dtype=torch.float32, device=device) if c.tau is not None else random_tau(c.H, g, device)
    cu = cu_seqlens_of(c.docs, device)
    for a, b in zip(cu[:-1].tolist(), cu[1:].tolist()):
        if b > a:  # each document as a [1, H, L, D] view of the packed tensors
            away_from_kink(q[a:b].transpose(0, 1)[None], k[a:b].transpose(0, 1)[None], bias, tau, None, c.causal, rnd)
    do = rnd(c.T, c.H, c.D)
    return Inputs({"q": q, "k": k, "v": v, "bias": bias, "tau": tau, "cu_seqlens": cu},
                  {"max_seqlen": max(max(c.docs), 1), "causal": c.causal}, (do,))
