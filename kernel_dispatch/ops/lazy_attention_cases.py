"""Lazy attention test cases (shapes that break kernels) and their random inputs, for the equivalence matrix."""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from ..declaration import BadValues
from ..testing.matrix import Inputs, replacing


@dataclass(frozen=True)
class AttnCase:
    name: str
    B: int = 2
    H: int = 3
    Hkv: int = 3
    L: int = 48
    D: int = 32
    W: int = 8
    causal: bool = True
    lengths: tuple[int, ...] | None = None
    noncontig: bool = False
    tau: tuple[float, ...] | None = None  # per head; None: a mix of signs, never exactly -1
    scale: float | None = None  # None: the default 1 / sqrt(D)
    gpu_only: bool = False  # runs on a CUDA device only


_SMALL = (
    AttnCase("multihead"),
    AttnCase("len_not_block_multiple", L=37, W=5),
    AttnCase("len1_w_gt_l", L=1, W=4),
    AttnCase("w_gt_l", L=20, W=64),
    AttnCase("w_lt_l_multiblock", L=130, W=3, H=2, Hkv=2),
    AttnCase("gqa", H=4, Hkv=2, L=40),
    AttnCase("lengths", B=3, L=40, lengths=(40, 17, 1)),
    AttnCase("noncausal", L=33, W=6, causal=False),
    AttnCase("noncausal_gqa_lengths", B=2, H=4, Hkv=1, L=29, causal=False, lengths=(29, 11)),
    AttnCase("noncontig", noncontig=True, L=40),
    AttnCase("head_dim64", D=64, L=70, H=2, Hkv=2),
    AttnCase("tau_positive", tau=(0.3, 0.05, 1.0), L=24),
    AttnCase("tau_below_minus1", tau=(-1.5, -3.0, -1.2), L=24),
    AttnCase("negative_scale", scale=-0.2, L=40, W=12),
    # tau = -1 exactly (the usual initial value): rows with one visible key sit on the relu kink
    AttnCase("tau_minus1_one_key_rows", B=3, H=2, Hkv=1, L=24, D=64, tau=(-1.0, -1.0), lengths=(24, 1, 9)),
)
# On a GPU the small cases run again at the head dims the kernel backends ship: TileLang runs no other, and
# Triton's CUDA tile configs depend on the head dim.
KERNEL_HEAD_DIMS = (64, 128)
CASES = _SMALL + tuple(
    replace(c, name=f"{c.name}_d{D}", D=D, gpu_only=True) for c in _SMALL for D in KERNEL_HEAD_DIMS if D != c.D
) + (
    AttnCase("realistic_d128", B=2, H=16, Hkv=16, L=4096, D=128, W=512, gpu_only=True),
    AttnCase("realistic_gqa_lengths", B=2, H=16, Hkv=4, L=2048, D=64, W=256, lengths=(2048, 1500), gpu_only=True),
    AttnCase("realistic_noncausal_lengths", B=2, H=16, Hkv=16, L=2048, D=128, W=512, causal=False,
             lengths=(2048, 1501), gpu_only=True),
    AttnCase("realistic_noncontig", B=1, H=16, Hkv=16, L=2048, D=128, W=512, noncontig=True, gpu_only=True),
    AttnCase("realistic_tau_positive", B=1, H=16, Hkv=16, L=2048, D=64, W=512, tau=(0.3, 0.05, 1.0, 0.5) * 4,
             gpu_only=True),
    AttnCase("realistic_tau_below_minus1", B=1, H=16, Hkv=16, L=2048, D=128, W=512,
             tau=(-1.5, -3.0, -1.2, -1.0) * 4, gpu_only=True),
    AttnCase("realistic_w_gt_l", B=2, H=16, Hkv=16, L=1024, D=128, W=1536, gpu_only=True),
    # a bias longer than the TileLang kernels' distance table (DIST_TABLE = 1024): their per-element band path
    AttnCase("bias_beyond_table", B=1, H=2, Hkv=1, L=1400, D=64, W=1100, gpu_only=True),
    # non-causal distances beyond the cute kernels' CTA bias tables (min(W, L) <= 1791 fwd, 1663 lse, 3391 dQ): their
    # per-tile tables
    AttnCase("noncausal_bias_beyond_cta_table", B=1, H=2, Hkv=2, L=4096, D=64, W=4000, causal=False,
             gpu_only=True),
)


# Values the lengths check refuses, from the "lengths" case (B = 3, L = 40).
BAD_VALUES = (
    BadValues("above_L", "lengths", replacing("lengths", (41, 17, 1)), ("lengths", "[1, L] = [1, 40]", "max 41")),
    BadValues("zero", "lengths", replacing("lengths", (40, 0, 1)), ("lengths", "[1, L] = [1, 40]", "min 0")),
    BadValues("negative", "lengths", replacing("lengths", (40, 17, -3)), ("lengths", "min -3")),
)


def fused_qkv(inp: Inputs) -> Inputs:
    """q, k, v as the head slices of one [B, L, H + 2 Hkv, D] projection (a fused QKV layer: the three share their
    strides), everything else (dO) in the distinct layouts of :func:`kernel_dispatch.testing.layouts.relaid`."""
    from ..testing.layouts import relaid

    out = relaid(inp)
    q, k, v = (inp.tensors[n] for n in ("q", "k", "v"))
    H, Hkv = q.shape[1], k.shape[1]
    proj = torch.cat([t.transpose(1, 2) for t in (q, k, v)], dim=2)  # [B, L, H + 2 Hkv, D]
    fused = {"q": proj[:, :, :H], "k": proj[:, :, H:H + Hkv], "v": proj[:, :, H + Hkv:]}
    return Inputs({**out.tensors, **{n: t.transpose(1, 2) for n, t in fused.items()}}, out.kwargs, out.grads)


LAYOUTS = {"fused_qkv": fused_qkv}


def noncontig(t: torch.Tensor) -> torch.Tensor:
    """The same values in a non-contiguous layout (last two dims stored transposed)."""
    return t.transpose(-1, -2).contiguous().transpose(-1, -2)


# Every visible score of a lazy attention test input keeps |P + tau/i| > KINK_MARGIN * P: at the relu kink
# the gradient jumps, and which side an fp32 evaluation lands on is decided by rounding. The exponent
# S - LSE evaluated in fp32 (|S|, |LSE| up to ~10 at L = 4096, a few roundings of unit 6e-8, the
# log2(e) scaling, exp2 approximations of relative error 2^-22) is off by at most ~1e-6, so P by a
# relative ~1e-6; the margin leaves a factor 10. Without it, an exactly rounded fp32 evaluation of the
# golden backend itself misses the fp32 gradient tolerance by up to 8x at L = 4096 (docs/gpu-verification.md).
# Rows with one visible key are exempt: their P is exactly 1 and every backend treats them exactly.
KINK_MARGIN = 1e-5


def kink_margins(q, k, bias, tau, lengths, causal: bool, scale: float | None = None):
    """Per batch b and head h, yields (b, h, rel, scored): rel [L, L] = |P + tau/i| / P in float64 (inf
    where P underflows), and the scores it speaks for: visible, in valid rows, rows with one visible key
    excluded (their P is exactly 1 in every backend). ``scale`` None: 1 / sqrt(D)."""
    B, H, L, D = q.shape
    groups = H // k.shape[1]
    dev = q.device
    m = torch.arange(L, device=dev)[:, None]
    n = torch.arange(L, device=dev)[None, :]
    W = bias.shape[1]
    dist = (m - n) if causal else (m - n).abs()
    near = (dist >= 0) & (dist < W)
    for b in range(B):
        lb = L if lengths is None else int(lengths[b])
        valid = (n < lb) & (m < lb) & ((n <= m) if causal else True)
        i = (m + 1).double() if causal else torch.full_like(m, lb, dtype=torch.float64)
        for h in range(H):
            s = (D ** -0.5 if scale is None else scale) * (q[b, h].double() @ k[b, h // groups].double().T)
            s = s + torch.where(near, bias[h].double()[dist.clamp(0, W - 1)], 0.0)
            p = torch.softmax(s.masked_fill(~valid, float("-inf")), -1).nan_to_num(0.0)
            yield b, h, (p + float(tau[h]) / i).abs() / p, valid & (i > 1)


def rows_near_kink(q, k, bias, tau, lengths, causal: bool,
                   scale: float | None = None) -> list[tuple[int, int, torch.Tensor]]:
    """(b, h, query rows) holding a visible score within KINK_MARGIN of the relu kink (float64)."""
    out = []
    for b, h, rel, scored in kink_margins(q, k, bias, tau, lengths, causal, scale):
        rows = (scored & (rel <= KINK_MARGIN)).any(1).nonzero().flatten()
        if len(rows):
            out.append((b, h, rows))
    return out


def away_from_kink(q, k, bias, tau, lengths, causal: bool, rnd, scale: float | None = None) -> None:
    """Redraw (in place, with ``rnd``) the query rows of ``q`` whose scores sit at the relu kink."""
    for _ in range(20):
        near = rows_near_kink(q, k, bias, tau, lengths, causal, scale)
        if not near:
            return
        for b, h, rows in near:
            q[b, h, rows] = rnd(len(rows), q.shape[-1])
    raise RuntimeError("lazy attention inputs: could not move every score away from the relu kink")


def random_tau(H: int, g: torch.Generator, device) -> torch.Tensor:
    """Per-head tau of mixed signs in [-1.3, 0.3), away from the ill-conditioned -1."""
    tau = (torch.rand(H, generator=g) * 1.6 - 1.3).to(device)
    return torch.where((tau + 1).abs() < 0.05, tau + 0.1, tau)


def make_inputs(case: AttnCase, dtype: torch.dtype, device: str = "cpu", seed: int = 0) -> Inputs:
    """Random inputs of ``case``: q, k, v in ``dtype``, bias and tau fp32, upstream gradient dO."""
    g = torch.Generator(device="cpu").manual_seed(seed)

    def rnd(*shape, scale=1.0, dt=dtype):
        return (scale * torch.randn(*shape, generator=g)).to(dt).to(device)

    c = case
    q, k, v = rnd(c.B, c.H, c.L, c.D), rnd(c.B, c.Hkv, c.L, c.D), rnd(c.B, c.Hkv, c.L, c.D)
    bias = rnd(c.H, c.W, scale=0.5, dt=torch.float32)
    tau = torch.tensor(c.tau, dtype=torch.float32, device=device) if c.tau is not None else random_tau(c.H, g, device)
    kwargs = {"causal": c.causal}
    if c.lengths is not None:
        kwargs["lengths"] = torch.tensor(c.lengths, dtype=torch.int64, device=device)
    if c.scale is not None:
        kwargs["scale"] = c.scale
    away_from_kink(q, k, bias, tau, kwargs.get("lengths"), c.causal, rnd, c.scale)
    do = rnd(c.B, c.H, c.L, c.D)
    if c.noncontig:
        q, k, v, do = noncontig(q), noncontig(k), noncontig(v), noncontig(do)
    return Inputs({"q": q, "k": k, "v": v, "bias": bias, "tau": tau}, kwargs, (do,))
