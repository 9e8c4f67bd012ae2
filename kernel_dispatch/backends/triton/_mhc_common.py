"""Pieces shared by the Triton mHC kernels: config classes, input checks, the GEMM products and the
per-token Sinkhorn.

Sinkhorn tiles are [BT, n, n] fp32 in [in, out] layout (axis 1 = input stream i, axis 2 = output
stream o), as SPEC section 2 writes C[i, o].
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._autotune import INTERPRETED
from ._interpret import INTERPRET

N_STREAMS = (1, 2, 4, 8)
X_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
X_KINDS = {torch.bfloat16: 0, torch.float16: 1, torch.float32: 2}  # x's dtype -> GEMM scheme (see below)


def config_table(configs) -> dict:
    """{(x_kind, n): configs(x_kind, n)} over every x dtype (X_KINDS) and stream count: a kernel's configs when
    its best tiles depend on the dtype of its ``x_ptr`` argument (x [T, n, D]) and on n."""
    return {(kind, n): configs(kind, n) for kind in X_KINDS.values() for n in N_STREAMS}


def launch_class(args: dict) -> tuple[int, int]:
    """The config class (x_kind, n) of a launch whose ``x_ptr`` is x [T, n, D]."""
    x = args["x_ptr"]
    return X_KINDS[x.dtype], x.shape[1]


def check_streams(name: str, x: torch.Tensor) -> tuple[int, int, int]:
    """(T, n, D) of a [T, n, D] tensor, or ValueError/TypeError naming ``name``."""
    if x.dim() != 3:
        raise ValueError(f"{name}: expected [T, n, D], got shape {list(x.shape)}")
    T, n, D = x.shape
    if n not in N_STREAMS:
        raise ValueError(f"{name}: n = {n} not supported by the triton mHC kernels (n in {N_STREAMS})")
    if x.dtype not in X_DTYPES:
        raise TypeError(f"{name}: dtype {x.dtype} not supported by the triton mHC kernels (fp16, bf16, fp32)")
    if x.device.type != "cuda" and not INTERPRET:
        raise ValueError(f"{name}: expected a CUDA tensor (or TRITON_INTERPRET=1), got device {x.device}")
    return T, n, D


def empty(*shape: int, dtype: torch.dtype, device) -> torch.Tensor:
    """Every buffer the mHC launchers allocate (tests poison these with NaN to prove each element is written)."""
    return torch.empty(*shape, dtype=dtype, device=device)


def f32(t: torch.Tensor) -> torch.Tensor:
    """``t`` as contiguous fp32 (a no-op for contiguous fp32)."""
    return t.to(torch.float32).contiguous()


def narrow_strides(t: torch.Tensor) -> torch.Tensor:
    """``t`` itself unless an offset within one token could overflow int32 (then a contiguous copy)."""
    if any(abs(s) * (n - 1) >= 2 ** 31 for s, n in zip(t.stride()[1:], t.shape[1:])):
        return t.contiguous()
    return t


def pow2_at_least(v: int, lo: int) -> int:
    return max(lo, triton.next_power_of_2(v))


@triton.jit
def dot16(a, b, acc):
    """acc + a @ b for 16-bit operands, fp32 accumulation.

    The interpreter (triton 3.9) multiplies bf16 tiles as their raw uint16 bits, so there the
    product runs on exact fp32 copies instead.
    """
    if INTERPRETED:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    return tl.dot(a, b, acc)


@triton.jit
def split_bf16(a):
    """(hi, lo) bf16 with a = hi + lo to about 2^-17 relative; a fp32 (for fp16 values, exactly)."""
    hi = a.to(tl.bfloat16)
    return hi, (a - hi.to(tl.float32)).to(tl.bfloat16)


# The GEMMs keep about 17 bits of every fp32 operand (plain TF32 keeps 11, which moves mhc_pre's
# dalpha beyond its tolerance on small batches). X_KIND says how the activations x are stored:
# 0 bf16 (exact in bf16: products with the bf16 hi and lo pieces of the fp32 operand), 1 fp16
# (split exactly into bf16 hi + lo: the three leading products), 2 fp32 (TF32x3). The kernels
# (_mhc_pre_fwd, _mhc_pre_bwd_grad) lay the pieces side by side so one tensor-core product covers them.


@triton.jit
def softmax_eps(logits, EPS):
    """softmax over the output-stream axis (2) plus EPS; [BT, n, n] fp32."""
    e = tl.exp(logits - tl.max(logits, 2)[:, :, None])
    return e / tl.sum(e, 2)[:, :, None] + EPS


@triton.jit
def norm_in(c, EPS):
    """c / (sum over input streams + EPS): SPEC's normalisation over dim -2."""
    return c / (tl.sum(c, 1)[:, None, :] + EPS)


@triton.jit
def norm_out(c, EPS):
    """c / (sum over output streams + EPS): SPEC's normalisation over dim -1."""
    return c / (tl.sum(c, 2)[:, :, None] + EPS)


@triton.jit
def norm_in_bwd(dy, c, EPS):
    """Gradient of :func:`norm_in` at its input ``c`` given ``dy``."""
    den = tl.sum(c, 1)[:, None, :] + EPS
    return (dy - tl.sum(dy * (c / den), 1)[:, None, :]) / den


@triton.jit
def norm_out_bwd(dy, c, EPS):
    """Gradient of :func:`norm_out` at its input ``c`` given ``dy``."""
    den = tl.sum(c, 2)[:, :, None] + EPS
    return (dy - tl.sum(dy * (c / den), 2)[:, :, None]) / den


@triton.jit
def sinkhorn(logits, ITERS, EPS):
    """h_res of SPEC section 2 from the res logits [BT, n, n] fp32."""
    c = norm_in(softmax_eps(logits, EPS), EPS)
    for _ in range(ITERS - 1):
        c = norm_in(norm_out(c, EPS), EPS)
    return c


@triton.jit
def sinkhorn_bwd(logits, dc, ITERS, EPS, scr, STEP: tl.constexpr):
    """d logits [BT, n, n] of :func:`sinkhorn` given dc, through every iteration exactly.

    ``scr``: [BT, n, n] pointers to slot 0 of this block's fp32 scratch, slots STEP elements
    apart, 2 * ITERS - 1 slots: the input of every normalisation, stored going forward and read
    back in reverse by the same threads.
    """
    c = softmax_eps(logits, EPS)
    tl.store(scr, c)
    c = norm_in(c, EPS)
    for k in range(ITERS - 1):
        tl.store(scr + (2 * k + 1) * STEP, c)
        c = norm_out(c, EPS)
        tl.store(scr + (2 * k + 2) * STEP, c)
        c = norm_in(c, EPS)
    tl.debug_barrier()
    for j in range(ITERS - 1):
        k = ITERS - 2 - j
        dc = norm_in_bwd(dc, tl.load(scr + (2 * k + 2) * STEP), EPS)
        dc = norm_out_bwd(dc, tl.load(scr + (2 * k + 1) * STEP), EPS)
    dc = norm_in_bwd(dc, tl.load(scr), EPS)
    e = tl.exp(logits - tl.max(logits, 2)[:, :, None])
    p = e / tl.sum(e, 2)[:, :, None]
    return p * (dc - tl.sum(dc * p, 2)[:, :, None])
