"""Shapes that break kernels, input makers, and one runner that drives any backend the same way.

Every case makes fresh random inputs from its seed; the runner calls the public op with
``backend=`` and returns the named forward outputs and input gradients, so every backend
(and golden float64, the reference) goes through identical code.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

import kernel_dispatch as kd


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
    gpu_only: bool = False  # runs on a CUDA device only (realistic sizes, the small cases at kernel head dims)


@dataclass(frozen=True)
class MHCCase:
    name: str
    lead: tuple[int, ...] = (7,)
    n: int = 4
    D: int = 16
    gamma: bool = True
    noncontig: bool = False
    gpu_only: bool = False  # runs on a CUDA device only (realistic sizes, the feature sizes SPEC names)


_SMALL_ATTN_CASES = [
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
    # tau = -1 exactly (the usual initial value): rows with one visible key sit on the relu kink
    AttnCase("tau_minus1_one_key_rows", B=3, H=2, Hkv=1, L=24, D=64, tau=(-1.0, -1.0), lengths=(24, 1, 9)),
]
# On a GPU the small cases run again at the head dims the kernel backends ship: TileLang runs no other, and
# Triton's CUDA tile configs depend on the head dim.
KERNEL_HEAD_DIMS = (64, 128)
ATTN_CASES = _SMALL_ATTN_CASES + [
    replace(c, name=f"{c.name}_d{D}", D=D, gpu_only=True)
    for c in _SMALL_ATTN_CASES for D in KERNEL_HEAD_DIMS if D != c.D
] + [
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
]

MHC_CASES = [
    MHCCase("basic"),
    MHCCase("one_token", lead=(1,), D=8, gamma=False),
    MHCCase("lead_dims_no_gamma", lead=(2, 3), D=24, gamma=False),
    MHCCase("nD_above_block", lead=(33,), D=264),
    MHCCase("wide", lead=(5,), D=520),
    MHCCase("two_streams", lead=(9,), n=2, D=40),
    MHCCase("noncontig", lead=(6,), D=32, noncontig=True),
    # the feature sizes SPEC names for the kernels (n = 4, D in {1280, 2560, 4096, 7168})
    MHCCase("d1280", lead=(96,), D=1280, gpu_only=True),
    MHCCase("d2560", lead=(64,), D=2560, gpu_only=True),
    MHCCase("d7168", lead=(40,), D=7168, gpu_only=True),
    MHCCase("d7168_noncontig_no_gamma", lead=(33,), D=7168, gamma=False, noncontig=True, gpu_only=True),
    MHCCase("realistic", lead=(16384,), D=4096, gpu_only=True),
]

CASES = {"lazy_attention": ATTN_CASES, "mhc_pre": MHC_CASES, "mhc_post": MHC_CASES}


def meta(op: str, case, dtype: torch.dtype, device: str) -> dict:
    """What the registry needs to decide whether a backend runs ``case`` of ``op`` (registry.why_not)."""
    if op == "lazy_attention":
        return {"device": device, "dtype": dtype, "head_dim": case.D, "gqa": case.H != case.Hkv,
                "lengths": case.lengths is not None, "causal": case.causal, "bias_length": case.W}
    return {"device": device, "dtype": dtype, "n": case.n, "D": case.D}
OUTPUT_NAMES = {"lazy_attention": ("o",), "mhc_pre": ("h_in", "h_post", "h_res"), "mhc_post": ("out",)}


@dataclass
class Inputs:
    """Inputs of one call: tensors (leaves), the non-tensor kwargs, and upstream gradients."""
    tensors: dict[str, torch.Tensor]
    kwargs: dict = field(default_factory=dict)
    grads: tuple[torch.Tensor, ...] = ()


def _noncontig(t: torch.Tensor) -> torch.Tensor:
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


def kink_margins(q, k, bias, tau, lengths, causal: bool):
    """Per batch b and head h, yields (b, h, rel, scored): rel [L, L] = |P + tau/i| / P in float64 (inf
    where P underflows), and the scores it speaks for: visible, in valid rows, rows with one visible key
    excluded (their P is exactly 1 in every backend)."""
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
            s = D ** -0.5 * (q[b, h].double() @ k[b, h // groups].double().T)
            s = s + torch.where(near, bias[h].double()[dist.clamp(0, W - 1)], 0.0)
            p = torch.softmax(s.masked_fill(~valid, float("-inf")), -1).nan_to_num(0.0)
            yield b, h, (p + float(tau[h]) / i).abs() / p, valid & (i > 1)


def _rows_near_kink(q, k, bias, tau, lengths, causal: bool) -> list[tuple[int, int, torch.Tensor]]:
    """(b, h, query rows) holding a visible score within KINK_MARGIN of the relu kink (float64)."""
    out = []
    for b, h, rel, scored in kink_margins(q, k, bias, tau, lengths, causal):
        rows = (scored & (rel <= KINK_MARGIN)).any(1).nonzero().flatten()
        if len(rows):
            out.append((b, h, rows))
    return out


def _away_from_kink(q, k, bias, tau, lengths, causal: bool, rnd) -> None:
    """Redraw (in place, with ``rnd``) the query rows of ``q`` whose scores sit at the relu kink."""
    for _ in range(20):
        near = _rows_near_kink(q, k, bias, tau, lengths, causal)
        if not near:
            return
        for b, h, rows in near:
            q[b, h, rows] = rnd(len(rows), q.shape[-1])
    raise RuntimeError("lazy attention inputs: could not move every score away from the relu kink")


def make_inputs(op: str, case, dtype: torch.dtype, device: str = "cpu", seed: int = 0) -> Inputs:
    """Random inputs of ``case`` with activations in ``dtype`` and parameters in fp32."""
    g = torch.Generator(device="cpu").manual_seed(seed)

    def rnd(*shape, scale=1.0, dt=dtype):
        return (scale * torch.randn(*shape, generator=g)).to(dt).to(device)

    if op == "lazy_attention":
        c = case
        q, k, v = rnd(c.B, c.H, c.L, c.D), rnd(c.B, c.Hkv, c.L, c.D), rnd(c.B, c.Hkv, c.L, c.D)
        bias = rnd(c.H, c.W, scale=0.5, dt=torch.float32)
        if c.tau is not None:
            tau = torch.tensor(c.tau, dtype=torch.float32, device=device)
        else:  # a mix of signs, away from the ill-conditioned -1
            tau = (torch.rand(c.H, generator=g) * 1.6 - 1.3).to(device)
            tau = torch.where((tau + 1).abs() < 0.05, tau + 0.1, tau)
        kwargs = {"causal": c.causal}
        if c.lengths is not None:
            kwargs["lengths"] = torch.tensor(c.lengths, dtype=torch.int64, device=device)
        _away_from_kink(q, k, bias, tau, kwargs.get("lengths"), c.causal, rnd)
        if c.noncontig:
            q, k, v = _noncontig(q), _noncontig(k), _noncontig(v)
        do = rnd(c.B, c.H, c.L, c.D)
        if c.noncontig:
            do = _noncontig(do)
        return Inputs({"q": q, "k": k, "v": v, "bias": bias, "tau": tau}, kwargs, (do,))
    c = case
    n, D = c.n, c.D
    M = n * n + 2 * n
    x = rnd(*c.lead, n, D)
    if c.noncontig:
        x = _noncontig(x)
    if op == "mhc_pre":
        t = {"x": x, "phi": rnd(M, n * D, scale=0.05, dt=torch.float32),
             "alpha": torch.tensor([0.8, 1.2, 0.9], device=device) + 0.1 * rnd(3, dt=torch.float32),
             "bias": rnd(M, scale=0.3, dt=torch.float32)}
        if c.gamma:
            t["gamma"] = 1 + 0.1 * rnd(n * D, dt=torch.float32)
        grads = (rnd(*c.lead, D), rnd(*c.lead, n, dt=torch.float32), rnd(*c.lead, n, n, dt=torch.float32))
        return Inputs(t, {}, grads)
    f = rnd(*c.lead, D)
    h_post = 2 * torch.rand(*c.lead, n, generator=g).to(device)
    h_res = torch.softmax(rnd(*c.lead, n, n, dt=torch.float32), -1)
    gout = rnd(*c.lead, n, D)
    if c.noncontig:
        gout = _noncontig(gout)
    return Inputs({"f": f, "x": x, "h_post": h_post, "h_res": h_res}, {}, (gout,))


GRAD_NAMES = {
    "lazy_attention": {"q": "dq", "k": "dk", "v": "dv", "bias": "dbias", "tau": "dtau"},
    "mhc_pre": {"x": "dx", "phi": "dphi", "alpha": "dalpha", "bias": "dbias", "gamma": "dgamma"},
    "mhc_post": {"f": "df", "x": "dx", "h_post": "dh_post", "h_res": "dh_res"},
}


def upcast(inp: Inputs) -> Inputs:
    """The same values in float64 (the golden reference's inputs)."""
    t = {k: v.detach().double() for k, v in inp.tensors.items()}
    return Inputs(t, inp.kwargs, tuple(gr.double() for gr in inp.grads))


def poison_cuda_cache(nbytes: int = 1 << 30) -> None:
    """Leave 0xFF bytes (NaN in every float dtype) in the free blocks of torch's CUDA caching allocator, one
    large block and many small ones, so an output element a kernel never writes reads back as NaN whenever
    its buffer comes from those blocks."""
    big = torch.full((nbytes,), 0xFF, dtype=torch.uint8, device="cuda")
    small = [torch.full((1 << 19,), 0xFF, dtype=torch.uint8, device="cuda") for _ in range(64)]
    del big, small


def run(op: str, inp: Inputs, backend, backward: bool = True) -> dict[str, torch.Tensor]:
    """Call ``op`` through the public API with ``backend``; return outputs and input gradients by name."""
    leaves = {k: v.detach().clone().requires_grad_(backward) for k, v in inp.tensors.items()}
    # keep the caller's layout (clone of a non-contiguous tensor keeps its strides)
    fn = getattr(kd, op)
    outs = fn(*leaves.values(), **inp.kwargs, backend=backend) if op != "mhc_pre" else fn(
        leaves["x"], leaves["phi"], leaves["alpha"], leaves["bias"], leaves.get("gamma"), backend=backend)
    outs = outs if isinstance(outs, tuple) else (outs,)
    result = {name: o.detach() for name, o in zip(OUTPUT_NAMES[op], outs)}
    if backward:
        grads = torch.autograd.grad(outs, list(leaves.values()), inp.grads)
        for (name, _), gr in zip(leaves.items(), grads):
            result[GRAD_NAMES[op][name]] = gr
    return result
