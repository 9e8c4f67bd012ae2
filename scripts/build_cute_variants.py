"""Build measurement variants of the cute kernels on a CPU machine: each variant is a copy of a base store with one
kernel rebuilt after setting module attributes (a measurement switch such as ABLATE, a tile size, a stage count).

    python scripts/build_cute_variants.py OUT BASE_STORE NAME:KERNEL:MODULE.ATTR=VALUE[,MODULE.ATTR=VALUE...] ...

e.g. ``nodbias:dkdv_sm90:_lazy_attention_dkdv_sm90_kernel.ABLATE=no_dbias`` writes OUT/nodbias, the base store's
files with ``dkdv_sm90`` (bf16, causal, D = 128; ``D=64`` among the settings for the other head dim) rebuilt.
MODULE is relative to ``kernel_dispatch.backends.cute``. Variants build two at a time, each in its own process (the
DSL fixes its settings at import). Time them with ``scripts/gpu_time_cute_kernels.py``; their sidecars carry the
unchanged sources' hash, so the backend would load them too.
"""
import os
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


def build_one(out: Path, spec: str):
    """Compile one variant (this process only)."""
    dump = Path(tempfile.mkdtemp())
    os.environ.update(CUTE_DSL_ARCH="sm_90a", CUTE_DSL_KEEP="cubin,ir", CUTE_DSL_DUMP_DIR=str(dump))
    import importlib

    name, kernel, settings = spec.split(":", 2)
    head_dim = 128
    for item in filter(None, settings.split(",")):
        key, value = item.split("=", 1)
        if key == "D":
            head_dim = int(value)
            continue
        module, attr = key.rsplit(".", 1)
        mod = importlib.import_module("kernel_dispatch.backends.cute." + module)
        current = getattr(mod, attr)
        if isinstance(current, bool):
            value = value in ("1", "true", "True")
        elif not isinstance(current, str):
            value = type(current)(value)
        setattr(mod, attr, value)
    from kernel_dispatch.backends.cute import build
    from kernel_dispatch.backends.cute._kernel_key import KernelKey

    meta = build._compile_into(KernelKey(kernel, head_dim, "bfloat16", True), out / name, dump)
    print(f"{name}: {meta['name']} registers {meta['registers']}, stack {meta['stack_bytes']} B, "
          f"shared {meta['shared_bytes']} B", flush=True)


def main():
    if len(sys.argv) >= 3 and sys.argv[2].startswith("--one="):
        build_one(Path(sys.argv[1]), sys.argv[2][len("--one="):])
        return
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    out, base, specs = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3:]
    if not base.is_dir():
        sys.exit(f"BASE_STORE: expected a built kernel store directory, got {base}")
    for spec in specs:
        if spec.count(":") < 2:
            sys.exit(f"variant: expected NAME:KERNEL:SETTINGS, got {spec!r}")
        target = out / spec.split(":")[0]
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(base, target)

    def run(spec):
        return subprocess.run([sys.executable, __file__, str(out), "--one=" + spec], capture_output=True, text=True)

    with ThreadPoolExecutor(2) as pool:
        for spec, done in zip(specs, pool.map(run, specs)):
            print(done.stdout.strip() if done.returncode == 0 else f"{spec}: failed\n{done.stderr[-3000:]}")


if __name__ == "__main__":
    main()
