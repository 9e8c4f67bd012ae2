"""Build the CuTe DSL backend's kernels for sm_90a into a kernel store (no GPU needed).

    python -m kernel_dispatch.backends.cute.build                     # every shipped kernel into the default store
    python -m kernel_dispatch.backends.cute.build --out DIR --tar .devcache/cute-kernels.tar.xz
    python -m kernel_dispatch.backends.cute.build --only fwd_d128     # names containing a fragment
    python -m kernel_dispatch.backends.cute.build --pack-runtime .devcache/cute-runtime.tar.xz --tvm-ffi-wheel W

Each kernel compiles in its own process (the DSL reads its dump settings once per process): ``CUTE_DSL_ARCH=sm_90a``,
fake tensors whose sizes are symbolic, ``--enable-tvm-ffi``; the object is linked with ``gcc -shared`` into
``<name>.so`` (it needs only ``libcute_dsl_runtime.so`` and ``tvm_ffi`` to run) and described by ``<name>.json``:
source hash, DSL version, compile seconds, registers per thread, shared memory (static from the cubin plus the
dynamic size the launch asks for), local memory (spills) and its wgmma instructions and waits on them (one wait per
wgmma: ptxas serialised them), read from the cubin with the cuobjdump triton ships.
``manifest.json`` gathers the sidecars. Needs the DSL: ``pip install 'kernel-dispatch[cute]'``.
"""
import argparse
import glob
import importlib
import io
import json
import multiprocessing
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from pathlib import Path

from ._kernel_key import ARCH, DTYPES, HEAD_DIMS, KernelKey
from ._store import KERNEL_MODULES, source_hash, store_dir

SM90_SHARED_BYTES = 232448  # the opt-in maximum per block on sm_90


def shipped_keys() -> list[KernelKey]:
    """Every kernel the backend ships: each kernel x head dim x dtype x causal setting."""
    return [KernelKey(k, d, dt, c) for k in KERNEL_MODULES for d in HEAD_DIMS for dt in DTYPES for c in (True, False)]


def cuobjdump() -> str:
    """The cuobjdump that triton ships (CUDA's binary utility; every machine with this package has it)."""
    import triton

    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")


def resource_usage(cubin: Path, ir: str, dynamic_bytes: int | None) -> dict:
    """Registers, shared memory and local memory of the one kernel in ``cubin``; the dynamic shared memory its
    launch asks for comes from the DSL's IR (``smem.config_smem_size``) where the launch fixes it there, else
    ``dynamic_bytes`` (the kernel module's own count: a launch sized by ``cute`` at compile time)."""
    usage = subprocess.run([cuobjdump(), "--dump-resource-usage", str(cubin)], capture_output=True, text=True,
                           check=True).stdout
    funcs = re.findall(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)", usage)
    dynamic = [int(x) for x in re.findall(r"smem\.config_smem_size = (\d+)", ir)] or [dynamic_bytes]
    if len(funcs) != 1 or len(dynamic) != 1 or dynamic[0] is None:
        raise RuntimeError(f"{cubin.name}: expected one kernel, cuobjdump lists {len(funcs)}, the IR "
                           f"{len(dynamic)}\n{usage}")
    reg, stack, static, local = map(int, funcs[0])
    return {"registers": reg, "stack_bytes": stack, "static_shared_bytes": static, "dynamic_shared_bytes": dynamic[0],
            "shared_bytes": static + dynamic[0], "local_bytes": local}


def wgmma_waits(cubin: Path) -> dict:
    """The wgmma instructions (SASS ``HGMMA``) of the one kernel in ``cubin`` and its waits on them
    (``WARPGROUP.DEPBAR``). Where ptxas cannot prove an overlap safe (an accumulator in flight across a loop's back
    edge or a merge of branches, or a warpgroup arrive it has to place in a divergent path) it serialises every wgmma
    of the kernel: one wait per HGMMA, and the GEMMs of a tile no longer overlap each other or the exponentials."""
    sass = subprocess.run([cuobjdump(), "-sass", str(cubin)], capture_output=True, text=True, check=True).stdout
    return {"wgmma": len(re.findall(r"\bHGMMA\.", sass)),
            "wgmma_waits": len(re.findall(r"\bWARPGROUP\.DEPBAR", sass))}


def _compile_in_this_process(key: KernelKey, out: Path) -> dict:
    """Compile ``key`` (this process must not have compiled before: the DSL fixes its dump settings at import)."""
    dump = Path(tempfile.mkdtemp(prefix=f"{key.name}-"))
    try:
        return _compile_into(key, out, dump)
    finally:
        shutil.rmtree(dump, ignore_errors=True)


def export_shared_object(compiled, name: str, folder: Path) -> tuple[Path, Path]:
    """Export the TVM FFI function ``compiled`` (a ``cute.compile(..., options="--enable-tvm-ffi")`` result) as
    ``folder/<name>.o`` (entry point ``__tvm_ffi_<name>``) and link it with ``gcc -shared`` into
    ``folder/<name>.so``, which needs only ``libcute_dsl_runtime.so`` and ``tvm_ffi`` to run; (object, library)."""
    obj, lib = folder / f"{name}.o", folder / f"{name}.so"
    compiled.export_to_c(str(obj), function_name=name)
    subprocess.run(["gcc", "-shared", "-o", str(lib), str(obj)], check=True)
    return obj, lib


def _compile_into(key: KernelKey, out: Path, dump: Path) -> dict:
    os.environ.update(CUTE_DSL_ARCH=ARCH, CUTE_DSL_KEEP="cubin,ir", CUTE_DSL_DUMP_DIR=str(dump))
    import cutlass

    module = importlib.import_module(f"{__package__}.{KERNEL_MODULES[key.kernel]}")
    start = time.perf_counter()
    compiled = module.compile(key)
    seconds = time.perf_counter() - start
    _, lib = export_shared_object(compiled, key.name, dump)
    cubins = glob.glob(str(dump / "*.cubin"))
    irs = glob.glob(str(dump / "*_clean.mlir"))
    if len(cubins) != 1 or len(irs) != 1:
        raise RuntimeError(f"{key.name}: expected one cubin and one IR in {dump}, found {cubins}, {irs}")
    meta = {"name": key.name, "symbol": f"__tvm_ffi_{key.name}", "file": lib.name, "arch": ARCH,
            "kernel": key.kernel, "head_dim": key.head_dim, "dtype": key.dtype, "causal": key.causal,
            "args": module.ARGS[key.kernel], "source_hash": source_hash(key.kernel),
            "dsl": getattr(cutlass, "__version__", "unknown"), "compile_seconds": round(seconds, 2),
            "shared_object_bytes": lib.stat().st_size,
            **resource_usage(Path(cubins[0]), Path(irs[0]).read_text(), module.shared_bytes(key)),
            **wgmma_waits(Path(cubins[0]))}
    out.mkdir(parents=True, exist_ok=True)
    tmp_lib = out / f".{key.name}.so.{os.getpid()}"
    shutil.copyfile(lib, tmp_lib)
    os.replace(tmp_lib, out / lib.name)  # atomic: a concurrent loader sees the old file or the new one
    tmp_meta = out / f".{key.name}.json.{os.getpid()}"
    tmp_meta.write_text(json.dumps(meta, indent=1) + "\n")
    os.replace(tmp_meta, out / f"{key.name}.json")
    return meta


def _worker(args: tuple) -> tuple[str, dict | None, str | None]:
    key, out = args
    try:
        return key.name, _compile_in_this_process(key, out), None
    except Exception as e:
        return key.name, None, f"{type(e).__name__}: {e}"


def build_one(key: KernelKey, out: Path) -> dict:
    """Compile ``key`` into the store ``out`` in a child process (the JIT path); its sidecar."""
    cmd = [sys.executable, "-m", f"{__package__}.build", "--out", str(out), "--only", key.name, "--exact", "--quiet"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"cute: building {key.name} failed ({' '.join(cmd)}):\n{done.stdout}\n{done.stderr}")
    return json.loads((out / f"{key.name}.json").read_text())


def build(keys: list[KernelKey], out: Path, workers: int, quiet: bool = False) -> tuple[list[dict], dict[str, str]]:
    """Compile ``keys`` into ``out`` with ``workers`` processes (one fresh process per kernel); (sidecars, failures)."""
    from tqdm import tqdm

    out.mkdir(parents=True, exist_ok=True)
    built, failed = [], {}
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(max(1, workers), maxtasksperchild=1) as pool:
        jobs = pool.imap_unordered(_worker, [(k, out) for k in keys])
        for name, meta, error in tqdm(jobs, total=len(keys), desc="cute kernels", disable=quiet, unit="kernel"):
            if error:
                failed[name] = error
            else:
                built.append(meta)
    write_manifest(out)
    return built, failed


def write_manifest(out: Path) -> Path:
    """``manifest.json``: every sidecar in ``out``, by name."""
    import cutlass

    metas = {p.stem: json.loads(p.read_text()) for p in sorted(out.glob("kd_*.json"))}
    path = out / "manifest.json"
    path.write_text(json.dumps({"arch": ARCH, "dsl": getattr(cutlass, "__version__", "unknown"), "kernels": metas},
                               indent=1) + "\n")
    return path


def pack_runtime(tar_path: Path, tvm_ffi_wheel: Path | None) -> None:
    """One xz tarball for a GPU machine without the DSL: ``lib/libcute_dsl_runtime.so`` and, from
    ``tvm_ffi_wheel`` (a wheel for that machine's Python), ``site/tvm_ffi``; unpack it and point
    ``KERNEL_DISPATCH_CUTE_RUNTIME`` at the directory."""
    from ._store import runtime_library

    lib = runtime_library()
    if lib is None:
        raise SystemExit("build: libcute_dsl_runtime.so not found (pip install 'kernel-dispatch[cute]')")
    tar_path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(tar_path, "w:xz") as tar:
        tar.add(lib, arcname="lib/libcute_dsl_runtime.so")
        if tvm_ffi_wheel is not None:
            with zipfile.ZipFile(tvm_ffi_wheel) as wheel:
                for info in wheel.infolist():
                    if info.filename.startswith("tvm_ffi/") and not info.is_dir():
                        data = wheel.read(info)
                        entry = tarfile.TarInfo("site/" + info.filename)
                        entry.size, entry.mode = len(data), 0o755 if info.filename.endswith(".so") else 0o644
                        tar.addfile(entry, io.BytesIO(data))
    print(f"{tar_path}: {tar_path.stat().st_size / 2 ** 20:.1f} MiB")


def _table(metas: list[dict]) -> str:
    rows = ["| kernel | compile s | registers | shared bytes | local bytes |", "|---|---|---|---|---|"]
    rows += [f"| {m['name']} | {m['compile_seconds']} | {m['registers']} | {m['shared_bytes']} | {m['local_bytes']} |"
             for m in sorted(metas, key=lambda m: m["name"])]
    return "\n".join(rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None, help=f"the kernel store (default {store_dir()})")
    ap.add_argument("--only", default="", help="comma-separated fragments of kernel names to build")
    ap.add_argument("--exact", action="store_true", help="--only names whole kernels")
    ap.add_argument("--workers", type=int, default=max(1, min(8, os.cpu_count() or 1)))
    ap.add_argument("--tar", type=Path, default=None, help="also write the store as an xz tarball (to carry)")
    ap.add_argument("--quiet", action="store_true")
    ap.add_argument("--pack-runtime", type=Path, default=None, metavar="TAR",
                    help="write the runtime library (and --tvm-ffi-wheel's tvm_ffi) into TAR instead of building")
    ap.add_argument("--tvm-ffi-wheel", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.pack_runtime:
        pack_runtime(args.pack_runtime, args.tvm_ffi_wheel)
        return 0
    out = args.out or store_dir()
    frags = [f for f in args.only.split(",") if f]
    keys = [k for k in shipped_keys()
            if not frags or any((f == k.name) if args.exact else (f in k.name) for f in frags)]
    if not keys:
        raise SystemExit(f"build: no shipped kernel matches --only {args.only!r}")
    built, failed = build(keys, out, args.workers, args.quiet)
    if not args.quiet:
        print(_table(built))
    for name, error in sorted(failed.items()):
        print(f"FAILED {name}: {error}", file=sys.stderr)
    if args.tar:
        with tarfile.open(args.tar, "w:xz") as tar:
            for p in sorted(out.iterdir()):
                if p.suffix in (".so", ".json"):
                    tar.add(p, arcname=p.name)
        print(f"{args.tar}: {args.tar.stat().st_size / 2 ** 20:.1f} MiB")
    too_big = [m["name"] for m in built if m["shared_bytes"] > SM90_SHARED_BYTES or m["local_bytes"]]
    for name in too_big:
        print(f"OVER LIMITS {name}: shared memory above {SM90_SHARED_BYTES} bytes or local memory (spills)",
              file=sys.stderr)
    return 1 if failed or too_big else 0


if __name__ == "__main__":
    sys.exit(main())
