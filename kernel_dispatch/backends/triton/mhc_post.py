"""mHC post on Triton (SPEC section 3): single streaming passes, forward and backward.

Same functions, signatures and outputs as ``kernel_dispatch/golden/mhc_post.py``: f [T, D] and
x [T, n, D] in fp16/bf16/fp32 with any strides, h_post [T, n] and h_res [T, n, n] ([in, out]).
fp32 math; out and dx in x's dtype, df in f's dtype, dh_post and dh_res in their inputs' dtypes.
Both kernels stream every byte once (forward 18 D bytes per token at bf16, backward 28 D). The
forward gives each program one token's block of columns; the backward gives each program a
whole token (all of D), so dh_post and dh_res need no cross-program reduction, and each thread
sums its own columns' products in registers until one block reduction at the end.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._autotune import autotune, launch, size_class
from ._mhc_common import check_streams, f32, narrow_strides
from ._mhc_common import empty as _empty

# BC: 16-byte vectors of D per program and chunk (BC * VEC elements); >= 32 * num_warps, so every
# thread owns whole vectors of all n streams and the stream sums stay inside the thread.
FWD_CONFIGS = [
    triton.Config({"BC": 64}, num_warps=2),
    triton.Config({"BC": 128}, num_warps=4),
    triton.Config({"BC": 256}, num_warps=4),
    triton.Config({"BC": 256}, num_warps=8),
    triton.Config({"BC": 512}, num_warps=8),
]
FWD_INTERPRET_CONFIG = triton.Config({"BC": 4}, num_warps=4)

BWD_CONFIGS = [
    triton.Config({"BC": 64}, num_warps=2),
    triton.Config({"BC": 128}, num_warps=2),
    triton.Config({"BC": 128}, num_warps=4),
    triton.Config({"BC": 256}, num_warps=4),
    triton.Config({"BC": 256}, num_warps=8),
]
BWD_INTERPRET_CONFIG = triton.Config({"BC": 4}, num_warps=4)


def vec(dtype: torch.dtype) -> int:
    """Elements of ``dtype`` in one 16-byte vector."""
    return 16 // torch.empty((), dtype=dtype).element_size()


@autotune(FWD_CONFIGS, FWD_INTERPRET_CONFIG, key=["N", "D", "T_CLASS"])
@triton.jit
def mhc_post_fwd_kernel(f_ptr, x_ptr, hp_ptr, hr_ptr, out_ptr, T, D, sft, sfd, sxt, sxi, sxd,
                        N: tl.constexpr, VEC: tl.constexpr, BC: tl.constexpr, T_CLASS):
    """Grid (T * column blocks,): one token's BC * VEC columns; out [T, N, D] contiguous.

    h_post [T, N], h_res [T, N, N] fp32 contiguous ([in, out]).
    """
    nb = tl.cdiv(D, BC * VEC)
    pid = tl.program_id(0)
    t = (pid // nb).to(tl.int64)
    si = tl.arange(0, N)[:, None, None]
    so = tl.arange(0, N)[None, :, None]
    d = (pid % nb) * (BC * VEC) + tl.arange(0, BC * VEC)[None, None, :]
    m = d < D
    fv = tl.load(f_ptr + t * sft + d * sfd, mask=m, other=0.0).to(tl.float32)
    xv = tl.load(x_ptr + t * sxt + si * sxi + d * sxd, mask=m, other=0.0).to(tl.float32)
    hp = tl.load(hp_ptr + t * N + tl.arange(0, N))[None, :, None]
    hr = tl.load(hr_ptr + t * (N * N) + tl.arange(0, N)[:, None] * N + tl.arange(0, N)[None, :])[:, :, None]
    out = hp * fv + tl.sum(hr * xv, 0, keep_dims=True)
    tl.store(out_ptr + t * (N * D) + so * D + d, out.to(out_ptr.dtype.element_ty), mask=m)


@autotune(BWD_CONFIGS, BWD_INTERPRET_CONFIG, key=["N", "D", "T_CLASS"])
@triton.jit
def mhc_post_bwd_kernel(g_ptr, f_ptr, x_ptr, hp_ptr, hr_ptr, df_ptr, dx_ptr, dhp_ptr, dhr_ptr, T, D,
                        sgt, sgo, sgd, sft, sfd, sxt, sxi, sxd,
                        N: tl.constexpr, VEC: tl.constexpr, BC: tl.constexpr, T_CLASS):
    """Grid (T,): one token, all of D in chunks of BC * VEC. g [T, N, D] strided.

    Writes df [T, D], dx [T, N, D], dh_post [T, N], dh_res [T, N, N] (contiguous). Each thread
    keeps the N + N * N products f * g_o and x_i * g_o summed over its own columns; one
    fixed-order reduction over the threads at the end makes dh_post and dh_res deterministic.
    """
    t = tl.program_id(0).to(tl.int64)
    si = tl.arange(0, N)[:, None, None]
    so = tl.arange(0, N)[None, :, None]
    cols = tl.arange(0, BC * VEC)[None, None, :]
    hp = tl.load(hp_ptr + t * N + tl.arange(0, N))[None, :, None]
    hr = tl.load(hr_ptr + t * (N * N) + tl.arange(0, N)[:, None] * N + tl.arange(0, N)[None, :])[:, :, None]
    acc_p = tl.zeros([1, N, BC], tl.float32)
    acc_r = tl.zeros([N, N, BC], tl.float32)
    for d0 in range(0, D, BC * VEC):
        d = d0 + cols
        m = d < D
        gv = tl.load(g_ptr + t * sgt + so * sgo + d * sgd, mask=m, other=0.0).to(tl.float32)
        xv = tl.load(x_ptr + t * sxt + si * sxi + d * sxd, mask=m, other=0.0).to(tl.float32)
        fv = tl.load(f_ptr + t * sft + d * sfd, mask=m, other=0.0).to(tl.float32)
        df = tl.sum(hp * gv, 1, keep_dims=True)
        tl.store(df_ptr + t * D + d, df.to(df_ptr.dtype.element_ty), mask=m)
        dx = tl.sum(hr * gv, 1, keep_dims=True)
        tl.store(dx_ptr + t * (N * D) + si * D + d, dx.to(dx_ptr.dtype.element_ty), mask=m)
        acc_p += tl.sum(tl.reshape(fv * gv, [1, N, BC, VEC]), 3)
        acc_r += tl.sum(tl.reshape(xv * gv, [N, N, BC, VEC]), 3)
    tl.store(dhp_ptr + t * N + so, tl.sum(acc_p, 2, keep_dims=True))
    tl.store(dhr_ptr + t * (N * N) + si * N + so, tl.sum(acc_r, 2, keep_dims=True))


def _check(f, x, h_post, h_res) -> tuple[int, int, int]:
    T, n, D = check_streams("x", x)
    for name, t, shape in (("f", f, (T, D)), ("h_post", h_post, (T, n)), ("h_res", h_res, (T, n, n))):
        if tuple(t.shape) != shape:
            raise ValueError(f"{name}: expected shape {list(shape)}, got {list(t.shape)}")
    if f.dtype != x.dtype:
        raise TypeError(f"f: expected x's dtype {x.dtype}, got {f.dtype}")
    return T, n, D


def forward(f, x, h_post, h_res):
    """out [T, n, D] = h_post[o] * f[d] + sum_i h_res[i, o] * x[i, d], in x's dtype, contiguous."""
    T, n, D = _check(f, x, h_post, h_res)
    f, x = narrow_strides(f), narrow_strides(x)
    out = _empty(T, n, D, dtype=x.dtype, device=x.device)
    launch(mhc_post_fwd_kernel, lambda meta: (T * triton.cdiv(D, meta["BC"] * meta["VEC"]),),
           f, x, f32(h_post), f32(h_res), out, T, D, *f.stride(), *x.stride(), N=n, VEC=vec(x.dtype),
           T_CLASS=size_class(T))
    return out


def backward(g, f, x, h_post, h_res):
    """(df [T, D], dx [T, n, D], dh_post [T, n], dh_res [T, n, n]) for upstream g [T, n, D] (any strides)."""
    T, n, D = _check(f, x, h_post, h_res)
    if tuple(g.shape) != (T, n, D):
        raise ValueError(f"g: expected shape {[T, n, D]}, got {list(g.shape)}")
    g, f, x = narrow_strides(g), narrow_strides(f), narrow_strides(x)
    dev, f32t = x.device, torch.float32
    df = _empty(T, D, dtype=f.dtype, device=dev)
    dx = _empty(T, n, D, dtype=x.dtype, device=dev)
    dh_post = _empty(T, n, dtype=f32t, device=dev)
    dh_res = _empty(T, n, n, dtype=f32t, device=dev)
    launch(mhc_post_bwd_kernel, (T,), g, f, x, f32(h_post), f32(h_res), df, dx, dh_post, dh_res, T, D,
           *g.stride(), *f.stride(), *x.stride(), N=n, VEC=vec(x.dtype), T_CLASS=size_class(T))
    return df, dx, dh_post.to(h_post.dtype), dh_res.to(h_res.dtype)
