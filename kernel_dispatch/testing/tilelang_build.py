"""Lowering every shipped TileLang kernel to CUDA source without a GPU (sm_90a).

:func:`shipped_kernels` names each kernel factory call the launchers make (lazy attention at head dims 64 and
128, fp16 and bf16, causal or not, with the launcher's tile configs; the mHC kernels at a few feature sizes) and
:func:`cuda_source` lowers one through TileLang's own pipeline (the pass configs of ``_build.compile_kernel``),
without nvcc: the source equals ``compile_kernel(prim).get_kernel_source()``.
"""
from __future__ import annotations

from typing import Callable, Iterator

MHC_HP = (20, 2.0, 1e-6, 1e-6, 1e-6)  # sinkhorn_iters, post_mult, norm_eps, pre_eps, sinkhorn_eps (the defaults)
MHC_SMS = 132                         # multiprocessors of an H100 SXM (sizes the dx kernel's token splits)
MHC_DS = (264, 1280, 4096)            # feature sizes: a masked tail, and two benchmarked shapes


def cuda_source(prim_func, target: dict | None = None) -> str:
    """The CUDA source TileLang generates for ``prim_func`` (a ``T.prim_func``) and ``target`` (default sm_90a)."""
    from ..backends.tilelang._build import PASS_CONFIGS, SM90A, import_tilelang

    tilelang = import_tilelang()
    import tvm

    tgt = tvm.target.Target(dict(target or SM90A))
    with tvm.transform.PassContext(opt_level=3, config=dict(PASS_CONFIGS)), tgt:
        return tilelang.lower(prim_func, target=tgt).kernel_source


def shipped_kernels() -> Iterator[tuple[str, Callable, tuple]]:
    """(id, factory, args) of every shipped TileLang kernel; ``factory(*args)`` is its ``T.prim_func``."""
    import torch

    from ..backends.tilelang import lazy_attention as la
    from ..backends.tilelang import mhc_post, mhc_pre

    for D in la.HEAD_DIMS:
        for dtype in la.DTYPES.values():
            for name, factory in la.FACTORIES.items():
                for causal in ((True,) if name == "row_dot" else (True, False)):  # row_dot has no mask
                    yield (f"attn-{name}-{dtype}-d{D}-{'causal' if causal else 'full'}", factory,
                           (D, dtype, causal, la.CONFIGS[D][name]))
    seen = set()
    for D in MHC_DS:
        for dtype in (torch.bfloat16, torch.float16):
            dt = str(dtype).replace("torch.", "")
            specs = [(f"mhc_pre-{stage}", f, a) for stage, (f, a) in mhc_pre.kernel_specs(D, dtype, MHC_HP,
                                                                                         MHC_SMS).items()]
            specs += [(f"mhc_post-{kind}", f, a) for kind, (f, a) in zip(("fwd", "bwd"), mhc_post.kernel_specs(D, dtype))]
            for name, factory, args in specs:
                key = (factory.__wrapped__.__module__, args)
                if key not in seen:  # the weights kernels do not depend on x's dtype
                    seen.add(key)
                    yield f"{name}-{dt}-D{D}", factory, args
