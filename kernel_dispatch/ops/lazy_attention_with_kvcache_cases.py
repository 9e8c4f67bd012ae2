"""KV-cache test cases (decode, chunked prefill, verification; unequal rows) and their random inputs."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..declaration import BadValues
from ..testing.matrix import Inputs, replacing
from .lazy_attention_cases import KINK_MARGIN, random_tau


@dataclass(frozen=True)
class KVCacheCase:
    name: str
    cached: tuple[int, ...] = (37, 5)  # cache_seqlens per row (before any append)
    q_len: int = 1
    append: bool = True  # k, v given: n_b = cached + Lq; else the new keys are among the cached
    capacity: int = 128
    H: int = 4
    Hkv: int = 2
    D: int = 32
    W: int = 8
    tau: tuple[float, ...] | None = None
    gpu_only: bool = False  # runs on a CUDA device only

    def keys(self, b: int) -> int:
        return self.cached[b] + (self.q_len if self.append else 0)


CASES = (
    KVCacheCase("first_token", cached=(0,), capacity=4),
    KVCacheCase("decode_unequal_rows", cached=(37, 5, 100), capacity=104),
    KVCacheCase("decode_no_append", cached=(37, 64, 1), append=False, capacity=70),
    KVCacheCase("prefill_chunk_7", cached=(0, 20), q_len=7, capacity=40),
    KVCacheCase("verify_64", cached=(70,), q_len=64, capacity=200, H=2, Hkv=2, D=64),
    KVCacheCase("long_cache_8192", cached=(8191,), capacity=8192, H=2, Hkv=1, D=16, W=16),
    KVCacheCase("w_gt_cache", cached=(5, 3), q_len=2, W=64, capacity=9),
    KVCacheCase("tau_positive", cached=(11, 30), q_len=3, tau=(0.3, 0.05, 1.0, 0.6), capacity=40),
    KVCacheCase("tau_below_minus1", cached=(11, 30), q_len=3, tau=(-1.5, -3.0, -1.2, -1.0001), capacity=40),
    KVCacheCase("realistic_decode_b16", cached=tuple(range(4000, 4096 - 5, 6))[:16], capacity=4096, H=32, Hkv=8,
                D=128, W=512, gpu_only=True),
    KVCacheCase("realistic_decode_long", cached=(32767,), capacity=32768, H=32, Hkv=8, D=128, W=512, gpu_only=True),
    KVCacheCase("realistic_prefill_chunk", cached=(1000, 3000), q_len=128, capacity=4096, H=32, Hkv=8, D=64, W=256,
                gpu_only=True),
)


def _away_from_kink(q, k_cache, bias, tau, case: KVCacheCase, rnd) -> None:
    """Redraw the query rows (in place) with a visible score within KINK_MARGIN of the relu kink (float64)."""
    B, H, Lq, D = q.shape
    groups = H // case.Hkv
    W = bias.shape[1]
    for _ in range(20):
        moved = False
        for b in range(B):
            n_b = case.keys(b)
            p_pos = torch.arange(n_b - Lq, n_b, device=q.device)[:, None]  # absolute query positions
            dist = p_pos - torch.arange(n_b, device=q.device)[None, :]
            visible = dist >= 0
            band = torch.where((dist >= 0) & (dist < W), dist, 0)
            i = (p_pos + 1).double()
            for h in range(H):
                s = D ** -0.5 * (q[b, h].double() @ k_cache[b, h // groups, :n_b].double().T)
                s = s + torch.where((dist >= 0) & (dist < W), bias[h].double()[band], 0.0)
                p = torch.softmax(s.masked_fill(~visible, float("-inf")), -1)
                rel = (p + float(tau[h]) / i).abs() / p
                rows = ((rel <= KINK_MARGIN) & visible & (i > 1)).any(1).nonzero().flatten()
                if len(rows):
                    q[b, h, rows] = rnd(len(rows), D)
                    moved = True
        if not moved:
            return
    raise RuntimeError("kv-cache inputs: could not move every score away from the relu kink")


# Key counts the cache_seqlens check refuses: from "decode_unequal_rows" (cached 37, 5, 100 of S = 104, one new
# token appended) and "decode_no_append" (Lq = 1 query among the cached keys).
BAD_VALUES = (
    BadValues("negative", "decode_unequal_rows", replacing("cache_seqlens", (37, -1, 100)),
              ("cache_seqlens", "values >= 0", "min -1")),
    BadValues("beyond_capacity", "decode_unequal_rows", replacing("cache_seqlens", (37, 5, 104)),
              ("cache_seqlens", "104 cached tokens + 1 new", "capacity S = 104")),
    BadValues("fewer_keys_than_queries", "decode_no_append", replacing("cache_seqlens", (37, 0, 1)),
              ("cache_seqlens", "0 keys, fewer than the Lq = 1 queries")),
)


def make_inputs(case: KVCacheCase, dtype: torch.dtype, device: str = "cpu", seed: int = 0) -> Inputs:
    """q [B, H, Lq, D], the caches [B, Hkv, S, D] (random beyond the valid tokens too), cache_seqlens int32,
    bias and tau fp32, and with ``append`` the new k, v [B, Hkv, Lq, D]."""
    g = torch.Generator(device="cpu").manual_seed(seed)

    def rnd(*shape, scale=1.0, dt=dtype):
        return (scale * torch.randn(*shape, generator=g)).to(dt).to(device)

    c = case
    B = len(c.cached)
    q = rnd(B, c.H, c.q_len, c.D)
    k_cache, v_cache = rnd(B, c.Hkv, c.capacity, c.D), rnd(B, c.Hkv, c.capacity, c.D)
    bias = rnd(c.H, c.W, scale=0.5, dt=torch.float32)
    tau = torch.tensor(c.tau, dtype=torch.float32, device=device) if c.tau is not None else random_tau(c.H, g, device)
    t = {"q": q, "k_cache": k_cache, "v_cache": v_cache, "bias": bias, "tau": tau,
         "cache_seqlens": torch.tensor(c.cached, dtype=torch.int32, device=device)}
    if c.append:
        k, v = rnd(B, c.Hkv, c.q_len, c.D), rnd(B, c.Hkv, c.q_len, c.D)
        for b, n in enumerate(c.cached):  # the kink check sees the keys the call will see
            k_cache[b, :, n:n + c.q_len] = k[b]
        t.update(k=k, v=v)
    _away_from_kink(q, k_cache, bias, tau, c, rnd)
    return Inputs(t)
