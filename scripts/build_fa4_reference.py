"""Build FlashAttention-4's Hopper forward (plain causal softmax attention, bf16) on a CPU machine into shared
objects that ``scripts/gpu_time_fa4_reference.py`` times beside cuDNN and the cute backend: a measure of what a CuTe
DSL kernel reaches per pass on the same card. A reference only; nothing in the package loads it.

    pip install --no-deps --target /tmp/fa4 "flash-attn-4==4.0.0b36" quack-kernels einops
    PYTHONPATH=/tmp/fa4 python scripts/build_fa4_reference.py OUT [--D 128,64] [--narrow-v 16,32]

Writes ``OUT/fa4_fwd_sm90_d{D}.so`` and, for each narrow value width DV (head dim 128 only),
``OUT/fa4_fwd_sm90_d128_dv{DV}.so``: the same kernel with almost no A V work, its score GEMM and online softmax
alone. Each build runs in its own process (the DSL fixes its settings at import), under torch's fake tensors with
``FLASH_ATTENTION_ARCH=sm_90`` and ``CUTE_DSL_ARCH=sm_90a``; its TVM FFI function is exported and linked with
``gcc -shared``, as ``kernel_dispatch.backends.cute.build`` does with the backend's kernels.
"""
import argparse
import os
import subprocess
import sys
from pathlib import Path

B, H, L = 4, 16, 4096  # the fake tensors' sizes; the compiled function takes any (its layouts are dynamic)


def build_one(out: str, D: int, DV: int) -> str:
    """Compile FlashAttention-4's sm_90 forward for head dims (D, DV) in this process; the shared object's path."""
    os.environ.update(FLASH_ATTENTION_ARCH="sm_90", CUTE_DSL_ARCH="sm_90a", FLASH_ATTENTION_NUM_SMS="132")
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from flash_attn.cute import interface

    from kernel_dispatch.backends.cute.build import export_shared_object

    with FakeTensorMode():
        q = torch.empty(B, L, H, D, dtype=torch.bfloat16, device="cuda")
        v = torch.empty(B, L, H, DV, dtype=torch.bfloat16, device="cuda")
        interface._flash_attn_fwd(q, q, v, causal=True, return_lse=True)
    compiled = list(interface._flash_attn_fwd.compile_cache.cache.values())
    if len(compiled) != 1:
        raise RuntimeError(f"expected one compiled forward, the cache holds {len(compiled)}")
    name = f"fa4_fwd_sm90_d{D}" + (f"_dv{DV}" if DV != D else "")
    obj, lib = export_shared_object(compiled[0], name, Path(out))
    obj.unlink()
    return str(lib)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out")
    p.add_argument("--D", default="128,64", help="head dims")
    p.add_argument("--narrow-v", default="16,32", help="value widths of the score-pass builds (head dim 128)")
    p.add_argument("--one", help=argparse.SUPPRESS)  # D,DV: build in this process
    a = p.parse_args()
    if a.one:
        print(build_one(a.out, *(int(x) for x in a.one.split(","))), flush=True)
        return
    try:
        jobs = [(D, D) for D in (int(x) for x in a.D.split(","))]
        jobs += [(128, int(x)) for x in a.narrow_v.split(",") if x]
    except ValueError:
        p.error(f"--D and --narrow-v: expected comma lists of integers, got {a.D!r} and {a.narrow_v!r}")
    if any(d % 8 or not 8 <= d <= 256 for job in jobs for d in job):
        p.error("--D and --narrow-v: head dims must be multiples of 8 from 8 to 256 (FlashAttention-4's sm_90 range)")
    os.makedirs(a.out, exist_ok=True)
    for D, DV in jobs:
        done = subprocess.run([sys.executable, __file__, a.out, f"--one={D},{DV}"], capture_output=True, text=True)
        if done.returncode != 0:
            sys.exit(f"D={D}, DV={DV}: the build failed\n{done.stderr[-3000:]}")
        print(done.stdout.strip().splitlines()[-1], flush=True)


if __name__ == "__main__":
    main()
