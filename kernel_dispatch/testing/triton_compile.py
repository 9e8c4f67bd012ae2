"""Compile every shipped Triton kernel configuration for a GPU target without a GPU.

Triton compiles for a named target (``GPUTarget("cuda", 90, 32)``) through the ptxas it ships, so no device is
needed; it must run WITHOUT ``TRITON_INTERPRET=1`` (the tests run it in a subprocess). A spec (a dict: id, fn,
signature, constexprs, num_warps, num_stages, divisible) is one (kernel, config) typed as a contiguous launch
specializes it: unit strides the constant 1, pointers 16-byte aligned, sizes and other strides multiples of 16;
its "group" names the launch class the autotuner picks among (the same kernel, dtypes and sizes, any config).
Alignment enables the cp.async pipelining that uses most of the shared memory, so this is the realistic worst
case. :func:`lazy_attention_specs`, :func:`mhc_pre_specs` and :func:`mhc_post_specs` list them.
"""
from __future__ import annotations

import re
from typing import Any, Iterable, Iterator, Mapping

import torch

SM90_SHARED_BYTES = 232448  # the opt-in shared memory per block of sm_90
# the opt-in shared memory per block of each architecture the compile tests build for (A100: sm_80; RTX 30xx, A10:
# sm_86; L4, L40, RTX 40xx: sm_89; H100, H200: sm_90; RTX 50xx: sm_120)
SHARED_BYTES = {80: 166912, 86: 101376, 89: 101376, 90: SM90_SHARED_BYTES, 120: 101376}

_TL_DTYPE = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}


def compile_sm90(fn, signature: Mapping[str, str], constexprs: Mapping[str, Any], num_warps: int, num_stages: int, *,
                 divisible: Iterable[str] = (), arch: int = 90):
    """The triton ``CompiledKernel`` of ``fn`` for sm_``arch`` (default 90; PTX in ``asm["ptx"]``, shared memory in
    bytes in ``metadata.shared``). Raises whatever triton raises when the kernel does not compile.

    Args:
        fn: the ``@triton.jit`` function.
        signature: ``{arg name: triton type}``, e.g. ``{"q_ptr": "*bf16", "L": "i32", "eps": "fp32"}``;
            constexpr arguments may be omitted here (they are typed ``"constexpr"`` automatically).
        constexprs: ``{arg name: value}`` for every ``tl.constexpr`` argument.
        num_warps, num_stages: the launch configuration to compile.
        divisible: integer arguments to compile as multiples of 16 (as triton specializes a launch whose sizes or
            strides are), besides every pointer, which is taken as 16-byte aligned like any torch allocation.
    """
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import ASTSource

    sig = dict(signature)
    for name in fn.arg_names:
        if name in constexprs:
            sig[name] = "constexpr"
        elif name not in sig:
            raise ValueError(f"signature: no type for argument {name!r} of {fn.__name__}")
    unknown = set(sig) - set(fn.arg_names)
    if unknown:
        raise ValueError(f"signature: {sorted(unknown)} are not arguments of {fn.__name__}")
    sig = {name: sig[name] for name in fn.arg_names}
    divisible = set(divisible)
    unknown = divisible - {n for n, t in sig.items() if t in ("i32", "i64", "u32", "u64")}
    if unknown:
        raise ValueError(f"divisible: {sorted(unknown)} are not integer arguments of {fn.__name__}")
    attrs = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(fn.arg_names)
             if sig[name].startswith("*") or name in divisible}
    src = ASTSource(fn, sig, constexprs=dict(constexprs), attrs=attrs)
    options = {"num_warps": int(num_warps), "num_stages": int(num_stages), "enable_fp_fusion": True}
    if getattr(fn, "debug", None):  # what a launch passes for @triton.jit(debug=True): device asserts compiled in
        options["debug"] = True
    return triton.compile(src, target=GPUTarget("cuda", int(arch), 32), options=options)


def compile_spec(spec: Mapping[str, Any], arch: int = 90):
    """:func:`compile_sm90` of one spec (a dict as the specs functions yield) for sm_``arch``."""
    return compile_sm90(spec["fn"], spec["signature"], spec["constexprs"], spec["num_warps"], spec["num_stages"],
                        divisible=spec["divisible"], arch=arch)


def sass(cubin: bytes) -> str:
    """The SASS of a compiled kernel's ``cubin``, disassembled by the cuobjdump that triton ships."""
    import os
    import subprocess
    import tempfile

    import triton

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([tool, "-sass", f.name], capture_output=True, text=True, check=True).stdout


def small_async_copies(ptx: str) -> int:
    """How many 4-byte ``cp.async`` copies (one fp32 per thread into shared memory) a kernel's PTX issues."""
    return len(re.findall(r"cp\.async\.c[ag]\.shared\.global[^;]*, 0x4\b", ptx))


def _jit_fn(kernel):
    """The ``@triton.jit`` function of a kernel, autotuned or not."""
    import triton

    return kernel.fn if isinstance(kernel, triton.runtime.Autotuner) else kernel


def lazy_attention_specs(head_dims=None, dtypes=None, causal=(True,), varlen=(False,)) -> Iterator[dict]:
    """Every shipped (kernel, config) of Triton lazy attention (default: every head dim and dtype, fixed length).

    ``varlen=(True,)`` gives the packed-document variants (lazy_attention_varlen: ``VARLEN`` on, cu_seqlens int32
    in ``Lens``, T not a multiple of 16); their ids hold ``-varlen``.
    """
    from ..backends.triton import lazy_attention as tk

    head_dims = tk.HEAD_DIMS if head_dims is None else head_dims
    dtypes = tk.DTYPES if dtypes is None else dtypes
    for vl in varlen:
        yield from _lazy_attention_specs(tk, head_dims, dtypes, causal, vl)


def _lazy_attention_specs(tk, head_dims, dtypes, causal, vl: bool) -> Iterator[dict]:
    for name, kernel in tk.KERNELS.items():
        fn = _jit_fn(kernel)
        for dt in dtypes:
            for d in head_dims:
                for c in tk.shipped_configs(name, d, dt):
                    for cz in causal:
                        sig, const, div = {}, {}, []
                        for arg in fn.arg_names:
                            if arg in ("Q", "K", "V", "DO", "O", "DQ", "DK", "DV"):
                                sig[arg] = "*" + _TL_DTYPE[dt]
                            elif arg == "Lens":
                                sig[arg] = "*i32" if vl else "*i64"
                            elif arg in ("Bias", "Tau", "LSE", "DELTA", "DTAU_PART", "DB_PART"):
                                sig[arg] = "*fp32"
                            elif arg in ("qk_scale", "sm_scale"):
                                sig[arg] = "fp32"
                            elif arg.endswith("d") and arg.startswith("stride") or arg in ("stride_bw", "stride_tau"):
                                const[arg] = 1
                            elif arg.startswith("stride") or arg in ("H", "HKV", "L", "W", "GROUPS", "NSEG",
                                                                      "SEG_OFF", "BH_OFF", "L_CLASS"):
                                sig[arg] = "i32"
                                if arg.startswith("stride") or (arg == "L" and not vl):
                                    div.append(arg)
                        const.update(c.kwargs)
                        const.update(CAUSAL=cz, HAS_LENS=not vl, VARLEN=vl, HEAD_DIM=d,
                                     PREC="ieee" if dt == torch.float32 else "tf32")
                        blocks = "x".join(str(v) for v in c.kwargs.values())
                        group = f"{name}-{_TL_DTYPE[dt]}-d{d}-{'causal' if cz else 'full'}" + ("-varlen" if vl else "")
                        yield {"id": f"{group}-{blocks}-w{c.num_warps}s{c.num_stages}", "group": group,
                               "fn": fn, "signature": sig, "constexprs": const, "num_warps": c.num_warps,
                               "num_stages": c.num_stages, "divisible": div}


_X_ARGS = {"x_ptr", "g_ptr", "h_in_ptr", "dx_ptr", "f_ptr", "out_ptr", "df_ptr"}  # in the activations' dtype
_UNIT_STRIDES = {"sxd", "sgd", "sfd"}
_DIVISIBLE = {"T", "D", "sxt", "sxi", "sgt", "sgo", "sft", "TPS", "total", "ND"}
_FLOATS = {"post_mult", "norm_eps", "pre_eps", "sk_eps"}


def _mhc_spec(kernel, name: str, x_dtype: torch.dtype, n: int, constexprs: dict, config=None,
              num_warps: int = 4, num_stages: int = 3) -> dict:
    """One mHC (kernel, config) as a spec; W planes are bf16 unless x is fp32."""
    fn = _jit_fn(kernel)
    const = dict(constexprs, **(config.kwargs if config is not None else {}))
    sig, div = {}, []
    for a in fn.arg_names:
        if a in const:
            continue
        if a in _UNIT_STRIDES:
            const[a] = 1
        elif a in _X_ARGS:
            sig[a] = "*" + _TL_DTYPE[x_dtype]
        elif a in ("w_ptr", "wlo_ptr"):
            sig[a] = "*fp32" if x_dtype == torch.float32 else "*bf16"
        elif a == "sq_ptr":  # the forward's per-split sums of squares
            sig[a] = "*fp64"
        elif a.endswith("_ptr"):
            sig[a] = "*fp32"
        elif a in _FLOATS:
            sig[a] = "fp32"
        else:
            sig[a] = "i32"
            if a in _DIVISIBLE:
                div.append(a)
    if config is not None:
        num_warps, num_stages = config.num_warps, config.num_stages
    tiles = "x".join(f"{k}{v}" for k, v in (config.kwargs.items() if config is not None else ()))
    group = f"{name}-{_TL_DTYPE[x_dtype]}-n{n}"
    return {"id": group + (f"-{tiles}" if tiles else "") + f"-w{num_warps}s{num_stages}", "group": group, "fn": fn,
            "signature": sig, "constexprs": const, "num_warps": num_warps, "num_stages": num_stages,
            "divisible": div}


def mhc_pre_specs(dtypes=(torch.bfloat16,), ns=(4,)) -> Iterator[dict]:
    """Every shipped (kernel, config) of Triton mHC pre for x of ``dtypes`` and ``ns`` streams."""
    from ..backends.triton import _mhc_pre_bwd as bwd
    from ..backends.triton import _mhc_pre_bwd_grad as grad
    from ..backends.triton import _mhc_pre_fwd as fwd
    from ..backends.triton import _mhc_pre_fwd_apply as apply
    from ..backends.triton._mhc_common import X_KINDS, pow2_at_least

    for dt in dtypes:
        kind = X_KINDS[dt]
        for n in ns:
            m = n * n + 2 * n
            mp = pow2_at_least(m, 16)
            ws = fwd.gemm_width(m, kind)
            wn = pow2_at_least(ws, 16)
            yield _mhc_spec(fwd.mhc_pre_weights_kernel, "weights", dt, n,
                            dict(HAS_GAMMA=True, SPLIT=kind != 2, BLOCK=fwd.WEIGHTS_BLOCK))
            yield _mhc_spec(fwd.mhc_pre_fwd_weights_kernel, "fwd_weights", dt, n,
                            dict(HAS_GAMMA=True, SPLIT=kind != 2, M=m, WS=ws, WN=wn, BK=fwd.FWD_WEIGHTS_BK))
            for c in fwd.gemm_configs(kind, n):
                yield _mhc_spec(fwd.mhc_pre_fwd_gemm_kernel, "fwd_gemm", dt, n, dict(X_KIND=kind, N=n, WS=ws, WN=wn), c)
            yield _mhc_spec(apply.mhc_pre_fwd_mix_kernel, "fwd_mix", dt, n,
                            dict(SPLIT=kind != 2, N=n, M=m, WS=ws, BT=apply.MIX_BT), num_warps=apply.MIX_WARPS)
            for c in apply.APPLY_CONFIGS:
                yield _mhc_spec(apply.mhc_pre_fwd_apply_kernel, "fwd_apply", dt, n, dict(N=n), c)
            gq_type = "*fp32" if kind == 2 else "*bf16"
            for c in bwd.TOKEN_CONFIGS:
                spec = _mhc_spec(bwd.mhc_pre_bwd_token_kernel, "token", dt, n,
                                 dict(X_KIND=kind, N=n, M=m, MP=mp, BT=bwd.BT_TOKEN), c)
                spec["signature"]["gq_ptr"] = gq_type
                yield spec
            for has_acc in (False, True):
                for c in grad.grad_configs(kind, n):
                    spec = _mhc_spec(grad.mhc_pre_bwd_grad_kernel, "grad-acc" if has_acc else "grad", dt, n,
                                     dict(X_KIND=kind, HAS_ACC=has_acc, N=n, M=m, MP=mp), c)
                    spec["signature"].update(gq_ptr=gq_type, acc_ptr=spec["signature"]["x_ptr"])
                    yield spec
            yield _mhc_spec(bwd.mhc_pre_bwd_param_kernel, "param", dt, n,
                            dict(HAS_GAMMA=True, M=m, MP=mp, BC=bwd.PARAM_BC), num_warps=bwd.PARAM_WARPS)


def mhc_post_specs(dtypes=(torch.bfloat16,), ns=(4,)) -> Iterator[dict]:
    """Every shipped (kernel, config) of Triton mHC post for x of ``dtypes`` and ``ns`` streams."""
    from ..backends.triton import mhc_post

    for dt in dtypes:
        for n in ns:
            for c in mhc_post.FWD_CONFIGS:
                yield _mhc_spec(mhc_post.mhc_post_fwd_kernel, "post_fwd", dt, n, dict(N=n, VEC=mhc_post.vec(dt)), c)
            for c in mhc_post.BWD_CONFIGS:
                yield _mhc_spec(mhc_post.mhc_post_bwd_kernel, "post_bwd", dt, n, dict(N=n, VEC=mhc_post.vec(dt)), c)


_KV_DTYPE = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}
_KV_FP32_POINTERS = ("Bias", "Tau", "SCORES", "LSE_PART", "O_PART")


def kvcache_specs(head_dims=None, dtypes=None, rows=(4,)):
    """Every kernel variant the KV-cache launcher can run on CUDA, as arguments of :func:`compile_sm90`.

    Yields dicts: id, fn, signature, constexprs, num_warps, num_stages, divisible. ``rows``: the R = (H / Hkv) * Lq
    values whose tiles to build (1: decode without GQA; 4: decode with H / Hkv = 4; 256: Lq = 64). The out kernel is built with and
    without kept scores and with and without the direct store, the lse and fused kernels with and without kept
    scores; strides are typed as a contiguous launch
    specializes them (unit D strides constant, the others multiples of 16).
    """
    from ..backends.triton import lazy_attention_with_kvcache as kv

    head_dims = kv.HEAD_DIMS if head_dims is None else head_dims
    dtypes = kv.DTYPES if dtypes is None else dtypes
    kernels = {"lse": kv.kvcache_lse_kernel, "out": kv.kvcache_out_kernel, "reduce": kv.kvcache_reduce_kernel,
               "fused": kv.kvcache_fused_kernel}
    for dt in dtypes:
        for d in head_dims:
            for r in rows:
                key = "fp32" if dt == torch.float32 else "half"
                split_tiles = kv.tiles_for(dt, r, kv.TILES[key])
                fused_tiles = kv.tiles_for(dt, r, kv.ONE_SPLIT_TILES[key])
                variants = [("lse", dict(KEEP=k)) for k in (True, False)]
                variants += [("out", dict(KEEP=k, DIRECT=dr, NS_POW2=1 if dr else 128)) for k in (True, False)
                             for dr in (True, False)]
                variants += [("reduce", {})]
                variants += [("fused", dict(KEEP=k)) for k in (True, False)]
                for name, extra in variants:
                    fn = kernels[name]
                    t = fused_tiles if name == "fused" else split_tiles
                    sig, div = {}, []
                    for arg in fn.arg_names:
                        if arg in ("Q", "K", "V", "O"):
                            sig[arg] = "*" + _KV_DTYPE[dt]
                        elif arg in _KV_FP32_POINTERS:
                            sig[arg] = "*fp32"
                        elif arg == "Seqlens":
                            sig[arg] = "*i32"
                        elif arg == "qk_scale":
                            sig[arg] = "fp32"
                        elif arg in ("HEAD_DIM", "BLOCK_M", "BLOCK_N", "BLOCK_D", "SPLIT_BLOCK", "NS_POW2", "KEEP", "DIRECT", "UPCAST",
                                     "PREC", "EVICT"):
                            continue
                        else:
                            sig[arg] = "i32"
                            if arg.startswith("stride") and not arg.endswith("d"):
                                div.append(arg)
                    const = {k: v for k, v in kv.arg_constants(fn, d, dt, t, r).items() if k in fn.arg_names}
                    const.update({k: v for k, v in extra.items() if k in fn.arg_names})
                    const.update({a: 1 for a in fn.arg_names if a.startswith("stride") and a.endswith("d")})
                    for a in const:
                        sig.pop(a, None)
                    tag = "-".join(f"{k.lower()}{int(v)}" for k, v in sorted(extra.items()))
                    warps = t.num_warps
                    yield {"id": f"kvcache-{name}-{_KV_DTYPE[dt]}-d{d}-r{r}" + (f"-{tag}" if tag else ""),
                           "fn": fn, "signature": sig, "constexprs": const, "num_warps": warps,
                           "num_stages": t.num_stages if name != "reduce" else 3, "divisible": div}


