"""Compile a Triton kernel for sm_90 without a GPU and report its shared memory.

Used by the compile-only tests (tests/test_triton_compile.py and the mHC ones) to prove every
shipped kernel configuration builds for an H100 and fits its shared memory. Triton compiles
for a named target (``GPUTarget("cuda", 90, 32)``) through ptxas shipped with triton, so no
device is needed; it must run WITHOUT ``TRITON_INTERPRET=1`` (tests run it in a subprocess).
"""
from __future__ import annotations

import re
from typing import Any, Iterable, Mapping

SM90_SHARED_BYTES = 232448  # the opt-in shared memory per block of sm_90


def compile_for_sm90(fn, signature: Mapping[str, str], constexprs: Mapping[str, Any], num_warps: int,
                     num_stages: int, *, divisible: Iterable[str] = ()) -> int:
    """Compile ``fn`` (a ``@triton.jit`` function) for sm_90 and return its shared memory in bytes.

    :func:`compile_sm90` with the same arguments returns the whole compiled kernel (PTX in ``asm["ptx"]``).

    Args:
        fn: the ``@triton.jit`` function.
        signature: ``{arg name: triton type}``, e.g. ``{"q_ptr": "*bf16", "L": "i32", "eps": "fp32"}``;
            constexpr arguments may be omitted here (they are typed ``"constexpr"`` automatically).
        constexprs: ``{arg name: value}`` for every ``tl.constexpr`` argument.
        num_warps, num_stages: the launch configuration to compile.
        divisible: integer arguments to compile as multiples of 16 (as triton specializes a
            launch whose sizes or strides are), besides every pointer, which is taken as 16-byte
            aligned like any torch allocation. Alignment enables the cp.async pipelining that
            uses most of the shared memory, so this is the realistic worst case.

    Returns:
        The shared memory the compiled kernel needs (``metadata.shared``, bytes). Raises whatever
        triton raises when the kernel does not compile (e.g. out of resources).
    """
    return int(compile_sm90(fn, signature, constexprs, num_warps, num_stages, divisible=divisible).metadata.shared)


def compile_sm90(fn, signature: Mapping[str, str], constexprs: Mapping[str, Any], num_warps: int, num_stages: int, *,
                 divisible: Iterable[str] = ()):
    """The triton ``CompiledKernel`` of ``fn`` for sm_90 (arguments as :func:`compile_for_sm90`)."""
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
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)


def small_async_copies(ptx: str) -> int:
    """How many 4-byte ``cp.async`` copies (one fp32 per thread into shared memory) a kernel's PTX issues."""
    return len(re.findall(r"cp\.async\.c[ag]\.shared\.global[^;]*, 0x4\b", ptx))
