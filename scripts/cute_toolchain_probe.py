"""The prebuilt route of the planned CuTe DSL backend (issue: a fourth backend in CUTLASS's CuTe DSL), end to end on
one toy kernel: c = a + b over fp32 vectors of a runtime length.

    # CPU machine with the DSL (pip install "nvidia-cutlass-dsl[cu13]==4.8.1" apache-tvm-ffi==0.1.15.post2):
    python scripts/cute_toolchain_probe.py build .devcache/cute-probe      # sm_90a object, shared object, manifest
    python scripts/cute_toolchain_probe.py pack .devcache/cute-runtime.tar.xz --tvm-ffi-wheel WHEEL
    # GPU machine, no DSL: the runtime library and tvm_ffi from the pack, then
    python scripts/cute_toolchain_probe.py run .devcache/cute-probe --runtime DIR

``build`` compiles with ``CUTE_DSL_ARCH=sm_90a`` against fake tensors (no GPU), exports the TVM FFI entry
``__tvm_ffi_<name>`` to an object file, links it with ``gcc -shared`` and writes ``manifest.json`` (name, symbol, arch,
DSL version, compile seconds, bytes). ``run`` loads ``libcute_dsl_runtime.so`` with RTLD_GLOBAL, the shared object
through ``tvm_ffi.load_module``, calls it on torch CUDA tensors of three lengths (the length is a runtime value) and
compares with torch. ``pack`` writes the runtime library and the tvm_ffi wheel's files into one tarball to carry.
"""

import argparse
import ctypes
import json
import os
import sys
import time
from pathlib import Path

NAME = "kd_probe_vector_add"
ARCH = "sm_90a"
THREADS = 128


def build(out: Path) -> dict:
    """Compile the toy kernel for sm_90a without a GPU; write NAME.o, NAME.so and manifest.json into ``out``."""
    os.environ.setdefault("CUTE_DSL_ARCH", ARCH)
    import cutlass
    import cutlass.cute as cute

    from kernel_dispatch.backends.cute.build import export_shared_object

    @cute.kernel
    def vector_add_kernel(a: cute.Tensor, b: cute.Tensor, c: cute.Tensor, n: cutlass.Int32):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        i = bidx * THREADS + tidx
        if i < n:
            c[i] = a[i] + b[i]

    @cute.jit
    def vector_add(a: cute.Tensor, b: cute.Tensor, c: cute.Tensor, n: cutlass.Int32):
        vector_add_kernel(a, b, c, n).launch(grid=[(n + THREADS - 1) // THREADS, 1, 1], block=[THREADS, 1, 1])

    length = cute.sym_int()
    fake = [cute.runtime.make_fake_compact_tensor(cutlass.Float32, (length,), assumed_align=16) for _ in range(3)]
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    compiled = cute.compile(vector_add, *fake, cutlass.Int32(0), options="--enable-tvm-ffi")
    seconds = time.perf_counter() - start
    obj, lib = export_shared_object(compiled, NAME, out)
    manifest = {"kernels": [{"name": NAME, "symbol": f"__tvm_ffi_{NAME}", "file": lib.name, "arch": ARCH,
                             "args": ["a fp32 [n]", "b fp32 [n]", "c fp32 [n] (written)", "n int32"],
                             "compile_seconds": round(seconds, 2), "object_bytes": obj.stat().st_size,
                             "shared_object_bytes": lib.stat().st_size}],
                "dsl": getattr(cutlass, "__version__", "unknown")}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def pack(tar_path: Path, tvm_ffi_wheel: Path) -> None:
    """The backend's runtime pack (``python -m kernel_dispatch.backends.cute.build --pack-runtime``)."""
    from kernel_dispatch.backends.cute.build import pack_runtime

    pack_runtime(tar_path, tvm_ffi_wheel)


def run(out: Path, runtime: Path) -> None:
    """Load the prebuilt kernel without the DSL and check it against torch at three runtime lengths."""
    ctypes.CDLL(str(runtime / "lib" / "libcute_dsl_runtime.so"), mode=ctypes.RTLD_GLOBAL)
    # an installed tvm_ffi wins (TileLang 0.1.15 brings 0.1.12, which loads these objects): two versions in one
    # process do not mix (the packed 0.1.15 bindings resolved against TileLang's libtvm_ffi.so: undefined symbol)
    sys.path.append(str(runtime / "site"))
    import torch
    import tvm_ffi

    print(f"tvm_ffi {tvm_ffi.__version__} from {Path(tvm_ffi.__file__).parent}")

    assert "cutlass" not in sys.modules, "the prebuilt route must not import the DSL"
    manifest = json.loads((out / "manifest.json").read_text())
    entry = manifest["kernels"][0]
    fn = tvm_ffi.load_module(str(out / entry["file"]))[entry["name"]]
    for n in (1, 1000, 1 << 20):
        a, b = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
        c = torch.empty_like(a)
        fn(a, b, c, n)
        torch.cuda.synchronize()
        ok = torch.equal(c, a + b)
        print(f"{entry['name']} n={n}: {'equal to torch' if ok else 'DIFFERS from torch'}")
        if not ok:
            raise SystemExit(1)
    print(f"{torch.cuda.get_device_name()}, DSL {manifest['dsl']} build, no DSL import: {'cutlass' not in sys.modules}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="compile for sm_90a on this machine (the DSL installed, no GPU needed)")
    b.add_argument("out", type=Path)
    p = sub.add_parser("pack", help="the runtime library and tvm_ffi in one tarball for the GPU machine")
    p.add_argument("tar", type=Path)
    p.add_argument("--tvm-ffi-wheel", type=Path, required=True,
                   help="apache-tvm-ffi wheel for the GPU machine's Python (pip download --python-version 3.12 "
                        "--only-binary=:all: --no-deps apache-tvm-ffi==0.1.15.post2)")
    r = sub.add_parser("run", help="load and check the prebuilt kernel on a GPU without the DSL")
    r.add_argument("out", type=Path)
    r.add_argument("--runtime", type=Path, required=True, help="the unpacked tarball of `pack`")
    args = ap.parse_args()
    if args.cmd == "build":
        print(json.dumps(build(args.out), indent=1))
    elif args.cmd == "pack":
        pack(args.tar, args.tvm_ffi_wheel)
    else:
        run(args.out, args.runtime)


if __name__ == "__main__":
    main()
