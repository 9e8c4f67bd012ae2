"""mHC post on Triton (SPEC section 3): single streaming passes, forward and backward.

Same functions, signatures and outputs as ``kernel_dispatch/golden/mhc_post.py``: f [T, D] and
x [T, n, D] in fp16/bf16/fp32 with any strides, h_post [T, n] and h_res [T, n, n] ([in, out]).
fp32 math; out and dx in x's dtype, df in f's dtype, dh_post and dh_res in their inputs' dtypes.
The backward gives each program whole tokens (all of D), so dh_post and dh_res need no
cross-program reduction.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._mhc_common import autotune, check_streams, compile_spec, f32, narrow_strides
from ._mhc_common import empty as _empty

FWD_CONFIGS = [
    triton.Config({"BT": 1, "BD": 1024}, num_warps=4),
    triton.Config({"BT": 2, "BD": 512}, num_warps=4),
    triton.Config({"BT": 4, "BD": 256}, num_warps=4),
    triton.Config({"BT": 2, "BD": 1024}, num_warps=8),
    triton.Config({"BT": 4, "BD": 512}, num_warps=8),
    triton.Config({"BT": 8, "BD": 256}, num_warps=8),
]
FWD_INTERPRET_CONFIG = triton.Config({"BT": 4, "BD": 64}, num_warps=4)

BWD_CONFIGS = [
    triton.Config({"BT": 1, "BD": 512}, num_warps=4),
    triton.Config({"BT": 2, "BD": 256}, num_warps=4),
    triton.Config({"BT": 4, "BD": 128}, num_warps=4),
    triton.Config({"BT": 2, "BD": 512}, num_warps=8),
    triton.Config({"BT": 4, "BD": 256}, num_warps=8),
    triton.Config({"BT": 8, "BD": 128}, num_warps=8),
]
BWD_INTERPRET_CONFIG = triton.Config({"BT": 4, "BD": 64}, num_warps=4)


@autotune(FWD_CONFIGS, FWD_INTERPRET_CONFIG, key=["N", "D"])
@triton.jit
def mhc_post_fwd_kernel(f_ptr, x_ptr, hp_ptr, hr_ptr, out_ptr, T, D, sft, sfd, sxt, sxi, sxd,
                        N: tl.constexpr, BT: tl.constexpr, BD: tl.constexpr):
    """Grid (token blocks, column blocks); h_post [T, N], h_res [T, N, N] fp32 contiguous; out [T, N, D].

    Every tile is [BT, BD] in one layout; the N*N re-reads of the x tiles hit L1.
    """
    t = tl.program_id(0) * BT + tl.arange(0, BT)
    d = tl.program_id(1) * BD + tl.arange(0, BD)
    tmask = t < T
    t64 = t.to(tl.int64)
    mask = tmask[:, None] & (d < D)[None, :]
    fv = tl.load(f_ptr + t64[:, None] * sft + d[None, :] * sfd, mask=mask, other=0.0).to(tl.float32)
    for o in tl.static_range(N):
        out = tl.load(hp_ptr + t64 * N + o, mask=tmask, other=0.0)[:, None] * fv
        for i in tl.static_range(N):
            xi = tl.load(x_ptr + t64[:, None] * sxt + i * sxi + d[None, :] * sxd, mask=mask, other=0.0)
            out += tl.load(hr_ptr + t64 * (N * N) + i * N + o, mask=tmask, other=0.0)[:, None] * xi.to(tl.float32)
        tl.store(out_ptr + t64[:, None] * (N * D) + o * D + d[None, :], out.to(out_ptr.dtype.element_ty), mask=mask)


@autotune(BWD_CONFIGS, BWD_INTERPRET_CONFIG, key=["N", "D"])
@triton.jit
def mhc_post_bwd_kernel(g_ptr, f_ptr, x_ptr, hp_ptr, hr_ptr, df_ptr, dx_ptr, dhp_ptr, dhr_ptr, T, D,
                        sgt, sgo, sgd, sft, sfd, sxt, sxi, sxd,
                        N: tl.constexpr, BT: tl.constexpr, BD: tl.constexpr):
    """Grid (token blocks); g [T, N, D] strided. Writes df [T, D], dx [T, N, D], dh_post [T, N], dh_res [T, N, N].

    Every tile is [BT, BD] in one layout; the N*N re-reads of the g tiles hit L1.
    """
    t = tl.program_id(0) * BT + tl.arange(0, BT)
    tmask = t < T
    t64 = t.to(tl.int64)
    dd = tl.arange(0, BD)
    col_p = tl.arange(0, N)
    col_r = tl.arange(0, N * N)
    dhp = tl.zeros([BT, N], tl.float32)
    dhr = tl.zeros([BT, N * N], tl.float32)
    for d0 in range(0, D, BD):
        d = d0 + dd
        mask = tmask[:, None] & (d < D)[None, :]
        fv = tl.load(f_ptr + t64[:, None] * sft + d[None, :] * sfd, mask=mask, other=0.0).to(tl.float32)
        df = tl.zeros([BT, BD], tl.float32)
        for i in tl.static_range(N):
            xi = tl.load(x_ptr + t64[:, None] * sxt + i * sxi + d[None, :] * sxd, mask=mask, other=0.0).to(tl.float32)
            dxi = tl.zeros([BT, BD], tl.float32)
            for o in tl.static_range(N):
                go = tl.load(g_ptr + t64[:, None] * sgt + o * sgo + d[None, :] * sgd, mask=mask, other=0.0)
                go = go.to(tl.float32)
                dxi += tl.load(hr_ptr + t64 * (N * N) + i * N + o, mask=tmask, other=0.0)[:, None] * go
                dhr += tl.where(col_r[None, :] == i * N + o, tl.sum(xi * go, 1)[:, None], 0.0)
                if i == 0:
                    df += tl.load(hp_ptr + t64 * N + o, mask=tmask, other=0.0)[:, None] * go
                    dhp += tl.where(col_p[None, :] == o, tl.sum(fv * go, 1)[:, None], 0.0)
            tl.store(dx_ptr + t64[:, None] * (N * D) + i * D + d[None, :], dxi.to(dx_ptr.dtype.element_ty), mask=mask)
        tl.store(df_ptr + t64[:, None] * D + d[None, :], df.to(df_ptr.dtype.element_ty), mask=mask)
    tl.store(dhp_ptr + t64[:, None] * N + col_p[None, :], dhp, mask=tmask[:, None])
    tl.store(dhr_ptr + t64[:, None] * (N * N) + col_r[None, :], dhr, mask=tmask[:, None])


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
    mhc_post_fwd_kernel[lambda meta: (triton.cdiv(T, meta["BT"]), triton.cdiv(D, meta["BD"]))](
        f, x, f32(h_post), f32(h_res), out, T, D, *f.stride(), *x.stride(), N=n)
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
    mhc_post_bwd_kernel[lambda meta: (triton.cdiv(T, meta["BT"]),)](
        g, f, x, f32(h_post), f32(h_res), df, dx, dh_post, dh_res, T, D, *g.stride(), *f.stride(), *x.stride(), N=n)
    return df, dx, dh_post.to(h_post.dtype), dh_res.to(h_res.dtype)


def sm90_compile_specs(dtypes=(torch.bfloat16,), ns=(4,)):
    """Every shipped (kernel, config) of mHC post for x of ``dtypes`` and ``ns`` streams, as arguments of
    ``_compile_check.compile_for_sm90`` (see ``_mhc_common.compile_spec``)."""
    for dt in dtypes:
        for n in ns:
            for c in FWD_CONFIGS:
                yield compile_spec(mhc_post_fwd_kernel, "post_fwd", dt, n, dict(N=n), c)
            for c in BWD_CONFIGS:
                yield compile_spec(mhc_post_bwd_kernel, "post_bwd", dt, n, dict(N=n), c)
