"""Lazy attention in Triton: launchers for the kernels in _lazy_attention_fwd / _lazy_attention_bwd.

Same functions, signatures, outputs and residuals as kernel_dispatch/golden/lazy_attention.py:
q [B, H, L, D]; k, v [B, Hkv, L, D] (fp16, bf16 or fp32, any strides); bias [H, W]; tau [H];
lengths [B] int or None. Head dims 16, 32, 64, 128. All scores, probabilities, thresholds
and accumulators are fp32; fp32 inputs use IEEE fp32 dots (no TF32).

On CUDA each kernel is autotuned over a small config set keyed on (head dim, causal, dtypes, the power-of-two
class of L: a short first call does not pick the tiles of long sequences);
winners are cached on disk by triton (``cache_results``, triton >= 3.4). KERNEL_DISPATCH_TRITON_ATTN_CONFIG=i
skips tuning and runs config i of each kernel (0: the default; for fast starts). Under the interpreter
(TRITON_INTERPRET=1) one small config runs, and tiles are upcast to fp32 after every load
(the interpreter's numpy has no bf16).
"""
from __future__ import annotations

import os

import torch
import triton

from ._autotune import disk_cache, size_class
from ._lazy_attention_bwd import lazy_attention_bwd_dkdv_kernel, lazy_attention_bwd_dq_kernel
from ._lazy_attention_fwd import LOG2E, bias_table, lazy_attention_fwd_kernel

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
HEAD_DIMS = (16, 32, 64, 128)
DTYPES = (torch.float16, torch.bfloat16, torch.float32)

# (BLOCK_M, BLOCK_N, num_warps, num_stages) per kernel, dtype class and head dim (up to 64, or 128); dq:
# (BLOCK, num_warps, num_stages). Entry i runs when CONFIG_ENV is i (the last one past the end). Chosen for few register
# spills on sm_90 (cuobjdump of the compile-only build), plus 4-warp ones the autotuner picked on an H100 (dQ and
# dK/dV at head dim 128: 2.94 vs 3.66 ms and 2.00 vs 2.30 ms); fp32 tiles take twice the shared memory, so
# fp32 gets smaller ones. The dq BLOCK (queries = keys) fixes the layout of the dbias partial sums:
# one per dtype class.
_FWD = {("half", 64): [(128, 64, 8, 2), (128, 128, 8, 2), (64, 64, 4, 3)],
        ("half", 128): [(128, 64, 8, 2), (128, 64, 8, 3), (64, 64, 4, 3)],
        ("fp32", 64): [(64, 32, 4, 2), (32, 32, 4, 2)], ("fp32", 128): [(64, 32, 4, 2), (32, 32, 4, 2)]}
_DQ = {("half", 64): [(64, 8, 2), (64, 4, 2), (64, 4, 3)],
       ("half", 128): [(64, 8, 2), (64, 8, 3), (64, 4, 2), (64, 4, 3)],
       ("fp32", 64): [(32, 4, 2)], ("fp32", 128): [(32, 4, 2)]}
_DKDV = {("half", 64): [(32, 128, 8, 2), (32, 64, 4, 2), (64, 64, 8, 2), (32, 64, 4, 3), (32, 128, 4, 2)],
         ("half", 128): [(32, 128, 8, 2), (16, 128, 8, 2), (32, 64, 8, 2), (32, 128, 4, 2), (32, 64, 4, 2)],
         ("fp32", 64): [(32, 64, 8, 2), (32, 32, 4, 2)], ("fp32", 128): [(32, 64, 8, 2), (32, 32, 4, 2)]}
_INTERPRET_CONFIGS = {"fwd": (32, 16, 1, 1), "dq": (16, 1, 1), "dkdv": (16, 32, 1, 1)}
assert len({c[0] for k, v in _DQ.items() if k[0] == "half" for c in v}) == 1, "one dq BLOCK per dtype class"
assert len({c[0] for k, v in _DQ.items() if k[0] == "fp32" for c in v}) == 1, "one dq BLOCK per dtype class"
CONFIG_ENV = "KERNEL_DISPATCH_TRITON_ATTN_CONFIG"  # unset: autotune; "i": always config i (no tuning)


def shipped_configs(kernel: str, head_dim: int, dtype: torch.dtype) -> list[triton.Config]:
    """The launch configs of ``kernel`` ("fwd", "dq" or "dkdv") for a head dim and input dtype on CUDA.

    The compile test (tests/test_triton_compile.py) builds every one of them for sm_90.
    """
    key = ("fp32" if dtype == torch.float32 else "half", 64 if head_dim <= 64 else 128)
    if kernel == "fwd":
        return [triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=w, num_stages=s) for m, n, w, s in _FWD[key]]
    if kernel == "dq":
        return [triton.Config({"BLOCK": b}, num_warps=w, num_stages=s) for b, w, s in _DQ[key]]
    if kernel == "dkdv":
        return [triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=w, num_stages=s) for m, n, w, s in _DKDV[key]]
    raise ValueError(f"kernel: expected 'fwd', 'dq' or 'dkdv', got {kernel!r}")


def _config_key(c: triton.Config) -> tuple:
    return tuple(sorted(c.kwargs.items())), c.num_warps, c.num_stages


def _autotuner(kernel: str, fn):
    configs, seen = [], set()
    for dt in (torch.bfloat16, torch.float32):
        for d in (64, 128):
            for c in shipped_configs(kernel, d, dt):
                if _config_key(c) not in seen:
                    seen.add(_config_key(c))
                    configs.append(c)

    def prune(configs, named_args, **kwargs):
        allowed = {_config_key(c) for c in shipped_configs(kernel, kwargs["HEAD_DIM"], named_args["Q"].dtype)}
        return [c for c in configs if _config_key(c) in allowed]

    cache = disk_cache()
    return triton.autotune(configs=configs, key=["HEAD_DIM", "CAUSAL", "L_CLASS"],
                           prune_configs_by={"early_config_prune": prune}, **cache)(fn)


_KERNELS = {"fwd": lazy_attention_fwd_kernel, "dq": lazy_attention_bwd_dq_kernel,
            "dkdv": lazy_attention_bwd_dkdv_kernel}
_TUNED = {} if INTERPRET else {name: _autotuner(name, fn) for name, fn in _KERNELS.items()}


def _launch(kernel: str, grid, args, head_dim: int, dtype: torch.dtype, **kwargs) -> None:
    """Run ``kernel``: one small config under the interpreter, else autotuned (or the config CONFIG_ENV names)."""
    if INTERPRET:
        c = _INTERPRET_CONFIGS[kernel]
        blocks = {"BLOCK": c[0]} if kernel == "dq" else {"BLOCK_M": c[0], "BLOCK_N": c[1]}
        _KERNELS[kernel][grid](*args, **kwargs, **blocks, num_warps=c[-2], num_stages=c[-1])
    elif os.environ.get(CONFIG_ENV, "") != "":
        configs = shipped_configs(kernel, head_dim, dtype)
        c = configs[min(int(os.environ[CONFIG_ENV]), len(configs) - 1)]
        _KERNELS[kernel][grid](*args, **kwargs, **c.kwargs, num_warps=c.num_warps, num_stages=c.num_stages)
    else:
        _TUNED[kernel][grid](*args, **kwargs)


def best_configs() -> dict:
    """The autotuner's winners so far: {kernel: {key: config string}} (empty under the interpreter)."""
    return {name: {str(k): str(c) for k, c in t.cache.items()} for name, t in _TUNED.items()}


def _empty(*shape, dtype, device) -> torch.Tensor:
    """Every kernel output buffer comes from here (a test fills them with NaN to prove full coverage)."""
    return torch.empty(*shape, dtype=dtype, device=device)


def _check(q, k, v, bias, tau, lengths) -> None:
    if q.dtype not in DTYPES:
        raise TypeError(f"q: triton lazy attention supports fp16, bf16 and fp32, got {q.dtype}")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise TypeError(f"k, v: expected q's dtype {q.dtype}, got {k.dtype} and {v.dtype}")
    if q.shape[-1] not in HEAD_DIMS:
        raise ValueError(f"q: head dim {q.shape[-1]} not in {HEAD_DIMS}")
    if q.device.type != "cuda" and not INTERPRET:
        raise ValueError(f"q: triton kernels need a CUDA tensor (or TRITON_INTERPRET=1), got device {q.device}")
    B, H, L, _ = q.shape
    if k.shape[0] != B or k.shape[2] != L or H % k.shape[1] or v.shape != k.shape:
        raise ValueError(f"k, v: expected [B, Hkv, L, D] with H % Hkv == 0, got {tuple(k.shape)}, {tuple(v.shape)}")
    if bias.dim() != 2 or bias.shape[0] != H:
        raise ValueError(f"bias: expected [H, W] = [{H}, W], got {tuple(bias.shape)}")
    if tau.shape != (H,):
        raise ValueError(f"tau: expected [H] = [{H}], got {tuple(tau.shape)}")
    if lengths is not None and lengths.shape != (B,):
        raise ValueError(f"lengths: expected [B] = [{B}], got {tuple(lengths.shape)}")


SCRATCH_ELEMS = 1 << 26  # at most 256 MB of fp32 dbias partial sums per dq launch


def _bh_chunks(B: int, H: int, per_bh: int) -> list[tuple[int, int]]:
    """Ranges of the flat (b, h) index for the dq launches: whole batch elements, or head slices of one."""
    per = max(1, SCRATCH_ELEMS // per_bh)
    if per >= B * H:
        return [(0, B * H)]
    if per >= H:
        nb = per // H
        return [(b * H, min(B, b + nb) * H) for b in range(0, B, nb)]
    return [(b * H + h, b * H + min(H, h + per)) for b in range(B) for h in range(0, H, per)]


def _flags(q, lengths, causal) -> dict:
    return dict(CAUSAL=bool(causal), HAS_LENS=lengths is not None, HEAD_DIM=q.shape[-1], UPCAST=INTERPRET,
                PREC="ieee" if q.dtype == torch.float32 else "tf32", L_CLASS=size_class(q.shape[2]))


def _common(q, k, bias, tau, lengths, scale):
    """Shared launch arguments: the bias table, tau in fp32, the lengths pointer and the scalar sizes."""
    B, H, L, D = q.shape
    btab = bias_table(bias)
    tau32 = tau.float()
    lens = lengths if lengths is not None else tau32  # never read when HAS_LENS is False
    return B, H, k.shape[1], L, D, btab, tau32, lens, scale * LOG2E


def forward(q, k, v, bias, tau, scale: float, lengths, causal: bool):
    """O [B, H, L, D] (q's dtype, contiguous) and LSE [B, H, L] (fp32, natural log)."""
    _check(q, k, v, bias, tau, lengths)
    B, H, Hkv, L, D, btab, tau32, lens, qk_scale = _common(q, k, bias, tau, lengths, scale)
    o = _empty(B, H, L, D, dtype=q.dtype, device=q.device)
    lse = _empty(B, H, L, dtype=torch.float32, device=q.device)
    grid = lambda meta: (triton.cdiv(L, meta["BLOCK_M"]), B * H)  # noqa: E731
    args = (q, k, v, btab, tau32, lens, o, lse, *q.stride(), *k.stride(), *v.stride(), *o.stride(),
            *btab.stride(), tau32.stride(0), H, L, bias.shape[1], H // Hkv, qk_scale)
    _launch("fwd", grid, args, D, q.dtype, **_flags(q, lengths, causal))
    return o, lse


def backward(do, q, k, v, bias, tau, o, lse, scale: float, lengths, causal: bool):
    """(dq, dk, dv, dbias, dtau), contiguous, in the dtypes of (q, k, v, bias, tau).

    ``o`` [B, H, L, D] (any strides) is the forward's output: dO . O stands in for Delta in the dq kernel's fused
    sweep over far keys; Delta itself, sum_n P Mk dA, is summed exactly in the same kernel.
    """
    _check(q, k, v, bias, tau, lengths)
    if do.shape != q.shape:
        raise ValueError(f"do: expected the shape of q {tuple(q.shape)}, got {tuple(do.shape)}")
    if lse.shape != q.shape[:3]:
        raise ValueError(f"lse: expected [B, H, L] = {list(q.shape[:3])}, got {tuple(lse.shape)}")
    B, H, Hkv, L, D, btab, tau32, lens, qk_scale = _common(q, k, bias, tau, lengths, scale)
    do = do.to(q.dtype)
    o = o.to(q.dtype)
    lse = lse.float().contiguous()
    W = bias.shape[1]
    blk = _INTERPRET_CONFIGS["dq"][0] if INTERPRET else shipped_configs("dq", D, q.dtype)[0].kwargs["BLOCK"]
    n_blocks = triton.cdiv(L, blk)
    seg_half = triton.cdiv(min(W, L), blk)
    nseg, seg_off = (seg_half, 0) if causal else (2 * seg_half, seg_half)
    dev = q.device
    dq = _empty(B, H, L, D, dtype=q.dtype, device=dev)
    delta = _empty(B * H, L, dtype=torch.float32, device=dev)
    dtau_part = _empty(B * H, n_blocks, dtype=torch.float32, device=dev)
    flags = _flags(q, lengths, causal)
    common = (*q.stride(), *k.stride(), *v.stride(), *do.stride(), *btab.stride(), tau32.stride(0))
    seg_len = nseg * blk
    diag = torch.zeros(H, seg_len, dtype=torch.float32, device=dev)  # dS diagonal sums, d = index - seg_off * blk
    db_part = None
    for bh0, bh1 in _bh_chunks(B, H, n_blocks * seg_len):
        n = bh1 - bh0
        if db_part is None or db_part.shape[0] < n:
            db_part = torch.zeros(n, n_blocks, seg_len, dtype=torch.float32, device=dev)
        else:
            db_part.zero_()
        _launch("dq", (n_blocks, n), (q, k, v, btab, tau32, lens, do, o, lse, dq, delta, dtau_part, db_part,
                                      *q.stride(), *k.stride(), *v.stride(), *do.stride(), *o.stride(),
                                      *btab.stride(), tau32.stride(0), H, L, W, H // Hkv, qk_scale, scale, nseg,
                                      seg_off, bh0),
                D, q.dtype, **flags)
        part = db_part[:n].sum(1)  # [n, seg_len]
        if n % H == 0:
            diag += part.view(n // H, H, seg_len).sum(0)
        else:  # a slice of one batch element's heads
            diag[bh0 % H:bh0 % H + n] += part
    dk = _empty(B, Hkv, L, D, dtype=k.dtype, device=dev)
    dv = _empty(B, Hkv, L, D, dtype=v.dtype, device=dev)
    grid = lambda meta: (triton.cdiv(L, meta["BLOCK_N"]), B * Hkv)  # noqa: E731
    _launch("dkdv", grid, (q, k, v, btab, tau32, lens, do, lse, delta, dk, dv, *common, H, Hkv, L, W, H // Hkv,
                           qk_scale, scale), D, q.dtype, **flags)
    dtau = dtau_part.view(B, H, n_blocks).sum((0, 2))
    dbias = torch.zeros(H, W, dtype=torch.float32, device=dev)
    w_eff = min(W, L)
    zero = seg_off * blk
    dbias[:, :w_eff] = diag[:, zero:zero + w_eff]
    if not causal and w_eff > 1:
        dbias[:, 1:w_eff] += diag[:, zero - w_eff + 1:zero].flip(-1)
    return dq, dk, dv.to(v.dtype), dbias.to(bias.dtype), dtau.to(tau.dtype)


_TRITON_DTYPE = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}


def sm90_compile_specs(head_dims=HEAD_DIMS, dtypes=DTYPES, causal=(True,)):
    """Every shipped (kernel, config) as arguments of ``_compile_check.compile_for_sm90``.

    Yields dicts: id, fn, signature, constexprs, num_warps, num_stages, divisible. Typed as a
    contiguous launch specializes them: unit strides are the constant 1, pointers 16-byte
    aligned, other strides and L multiples of 16 (the shared-memory worst case).
    """
    for name, fn in _KERNELS.items():
        for dt in dtypes:
            for d in head_dims:
                for c in shipped_configs(name, d, dt):
                    for cz in causal:
                        sig, const, div = {}, {}, []
                        for arg in fn.arg_names:
                            if arg in ("Q", "K", "V", "DO", "O", "DQ", "DK", "DV"):
                                sig[arg] = "*" + _TRITON_DTYPE[dt]
                            elif arg == "Lens":
                                sig[arg] = "*i64"
                            elif arg in ("Bias", "Tau", "LSE", "DELTA", "DTAU_PART", "DB_PART"):
                                sig[arg] = "*fp32"
                            elif arg in ("qk_scale", "sm_scale"):
                                sig[arg] = "fp32"
                            elif arg.endswith("d") and arg.startswith("stride") or arg in ("stride_bw", "stride_tau"):
                                const[arg] = 1
                            elif arg.startswith("stride") or arg in ("H", "HKV", "L", "W", "GROUPS", "NSEG",
                                                                      "SEG_OFF", "BH_OFF", "L_CLASS"):
                                sig[arg] = "i32"
                                if arg.startswith("stride") or arg == "L":
                                    div.append(arg)
                        const.update(c.kwargs)
                        const.update(CAUSAL=cz, HAS_LENS=True, HEAD_DIM=d, UPCAST=False,
                                     PREC="ieee" if dt == torch.float32 else "tf32")
                        blocks = "x".join(str(v) for v in c.kwargs.values())
                        yield {"id": f"{name}-{_TRITON_DTYPE[dt]}-d{d}-{'causal' if cz else 'full'}-{blocks}"
                                     f"-w{c.num_warps}s{c.num_stages}",
                               "fn": fn, "signature": sig, "constexprs": const, "num_warps": c.num_warps,
                               "num_stages": c.num_stages, "divisible": div}
