"""Generated code of every shipped kernel, to prove a refactor leaves the kernels byte-identical.

    python3 scripts/generated_code.py OUT_DIR [--only triton|tilelang] [--match REGEX] [--jobs 2]
    python3 scripts/generated_code.py --compare A B

The first form compiles every shipped Triton kernel configuration for ``GPUTarget("cuda", 90, 32)`` (the specs the
compile tests build: lazy attention fwd/dq/dkdv at every head dim, dtype, causal or not, fixed-length or packed
(varlen: ids with ``-varlen``) and autotune config; the mHC kernels at every x dtype and stream count and
config) and writes its PTX to ``OUT_DIR/triton/<id>.ptx``; it lowers every shipped TileLang kernel
(``kernel_dispatch.testing.tilelang_build.shipped_kernels``) to CUDA source for sm_90a in
``OUT_DIR/tilelang/<id>.cu``; and it writes ``OUT_DIR/manifest.json``, {id: sha256 of the file}. No GPU is
needed. ``--compare`` takes two such directories (or their manifest.json files), lists the kernels whose code
differs or that only one side has, and exits 1 if there are any.

PTX is normalised before it is written: the ``.loc`` line directives, the ``$L__tmp`` labels that only the
debug information refers to, and everything from the first ``.file`` directive on (the file paths and the
DWARF sections) are dropped, so PTX from another checkout or with shifted source lines compares equal;
instructions, registers, branch labels and shared memory are kept as generated. TileLang names the shared buffers
a kernel allocates without a name ``v``, ``v_1``, ... and places them at offsets in an order that changes from
one process to the next (the mHC dx kernel's per-stream output tiles): CUDA source is normalised by renaming those
names in order of first use and listing their offsets sorted, so it compares equal up to that placement.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing
import os
import re
import sys
import tempfile
import time

os.environ.pop("TRITON_INTERPRET", None)  # compile for a GPU target: the interpreter must be off

_LOC = re.compile(r"^\s*\.loc\s")
_TMP_LABEL = re.compile(r"^\$L__tmp\d+:\s*$")


def normalise_ptx(ptx: str) -> str:
    """``ptx`` without line info, debug-only labels and debug sections (see the module docstring)."""
    cut = re.search(r"^\s*\.file\s", ptx, flags=re.M)
    if cut:
        ptx = ptx[:cut.start()]
    return "".join(ln for ln in ptx.splitlines(keepends=True) if not (_LOC.match(ln) or _TMP_LABEL.match(ln)))


_SHARED_DECL = re.compile(r"^\s*void\* (v(?:_\d+)?) = \(\(void\*\)\(\(char\*\)buf_dyn_shmem \+ (\d+)\)\);\n", re.M)


def normalise_cuda(src: str) -> str:
    """``src`` with TileLang's unnamed shared buffers renamed in order of first use (see the module docstring)."""
    decls = _SHARED_DECL.findall(src)
    if not decls:
        return src
    first = _SHARED_DECL.search(src).start()
    body = _SHARED_DECL.sub("", src)
    order: dict = {}
    body = re.sub(r"\bv(?:_\d+)?\b", lambda m: order.setdefault(m.group(0), f"v_{len(order) + 1}"), body)
    offsets = "".join(f"  // shared buffer at {off}\n" for off in sorted(int(o) for _, o in decls))
    return body[:first] + offsets + body[first:]


def _triton_specs() -> dict:
    import torch

    from kernel_dispatch.testing.triton_compile import lazy_attention_specs, mhc_post_specs, mhc_pre_specs

    specs = {}
    dtypes = (torch.bfloat16, torch.float16, torch.float32)
    groups = [("attn", lazy_attention_specs(causal=(True, False), varlen=(False, True))),
              ("mhc_pre", mhc_pre_specs(dtypes=dtypes, ns=(1, 2, 4, 8))),
              ("mhc_post", mhc_post_specs(dtypes=dtypes, ns=(1, 2, 4, 8)))]
    for prefix, group in groups:
        for spec in group:
            key = f"{prefix}-{spec['id']}"
            assert key not in specs, f"two Triton specs named {key}"
            specs[key] = spec
    return specs


def _tilelang_specs() -> dict:
    from kernel_dispatch.testing.tilelang_build import shipped_kernels

    specs = {}
    for key, factory, args in shipped_kernels():
        assert key not in specs, f"two TileLang kernels named {key}"
        specs[key] = (factory, args)
    return specs


_SPECS: dict = {}


def _generate(task: tuple[str, str]) -> tuple[str, str, str, float]:
    """(backend, id, code, seconds) of one kernel; runs in a worker process."""
    backend, key = task
    t0 = time.time()
    if backend not in _SPECS:
        _SPECS[backend] = _triton_specs() if backend == "triton" else _tilelang_specs()
    spec = _SPECS[backend][key]
    if backend == "triton":
        from kernel_dispatch.testing.triton_compile import compile_spec

        code = normalise_ptx(compile_spec(spec).asm["ptx"])
    else:
        from kernel_dispatch.testing.tilelang_build import cuda_source

        factory, args = spec
        code = normalise_cuda(cuda_source(factory(*args)))
    return backend, key, code, time.time() - t0


def generate(out_dir: str, backends: tuple[str, ...], jobs: int, match: str | None = None) -> dict:
    """Write the code of every kernel of ``backends`` (whose id matches ``match``, a regex, if given) under
    ``out_dir`` and add it to the manifest there; returns the manifest."""
    tasks = []
    if "tilelang" in backends:
        tasks += [("tilelang", k) for k in _tilelang_specs()]
    if "triton" in backends:
        tasks += [("triton", k) for k in _triton_specs()]
    if match:
        tasks = [t for t in tasks if re.search(match, t[1])]
    for b in backends:
        os.makedirs(os.path.join(out_dir, b), exist_ok=True)
    manifest, t0 = {}, time.time()
    ext = {"triton": "ptx", "tilelang": "cu"}
    with tempfile.TemporaryDirectory() as cache:
        os.environ["TRITON_CACHE_DIR"] = cache  # compile everything, reuse nothing from earlier runs
        with multiprocessing.get_context("spawn").Pool(jobs) as pool:
            for i, (backend, key, code, secs) in enumerate(pool.imap_unordered(_generate, tasks), 1):
                rel = f"{backend}/{key}.{ext[backend]}"
                with open(os.path.join(out_dir, rel), "w") as f:
                    f.write(code)
                manifest[rel] = hashlib.sha256(code.encode()).hexdigest()
                print(f"[{time.time() - t0:6.0f}s {i}/{len(tasks)}] {rel} ({secs:.1f}s)", flush=True)
    path = os.path.join(out_dir, "manifest.json")
    earlier = _load_manifest(out_dir) if os.path.isdir(out_dir) else {}
    # keep the entries of an earlier run that this one did not regenerate
    manifest.update({k: v for k, v in earlier.items()
                     if k not in manifest and (match or k.split("/")[0] not in backends)})
    manifest = dict(sorted(manifest.items()))
    with open(path, "w") as f:
        json.dump(manifest, f, indent=1)
    return manifest


def _load_manifest(path: str) -> dict:
    """The manifest of an output directory (or a manifest file); a directory without one (an interrupted run) is
    hashed file by file."""
    if os.path.isdir(path) and not os.path.exists(os.path.join(path, "manifest.json")):
        out = {}
        for backend in ("tilelang", "triton"):
            folder = os.path.join(path, backend)
            for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
                with open(os.path.join(folder, name), "rb") as f:
                    out[f"{backend}/{name}"] = hashlib.sha256(f.read()).hexdigest()
        return out
    if os.path.isdir(path):
        path = os.path.join(path, "manifest.json")
    with open(path) as f:
        return json.load(f)


def compare(a: str, b: str) -> list[str]:
    """Lines naming every kernel whose digest differs between manifests ``a`` and ``b`` or that one lacks."""
    ma, mb = _load_manifest(a), _load_manifest(b)
    out = [f"differs: {k}" for k in sorted(ma.keys() & mb.keys()) if ma[k] != mb[k]]
    out += [f"only in {a}: {k}" for k in sorted(ma.keys() - mb.keys())]
    out += [f"only in {b}: {k}" for k in sorted(mb.keys() - ma.keys())]
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out_dir", nargs="?", help="directory for the generated code and manifest.json")
    p.add_argument("--only", choices=("triton", "tilelang"), help="one backend only")
    p.add_argument("--match", help="only the kernels whose id matches this regular expression")
    p.add_argument("--jobs", type=int, default=2, help="worker processes (default 2)")
    p.add_argument("--compare", nargs=2, metavar=("A", "B"), help="compare two output directories or manifests")
    args = p.parse_args(argv)
    if args.compare:
        diff = compare(*args.compare)
        print("\n".join(diff) if diff else f"identical: {len(_load_manifest(args.compare[0]))} kernels")
        return 1 if diff else 0
    if not args.out_dir:
        p.error("OUT_DIR is required unless --compare is given")
    backends = (args.only,) if args.only else ("tilelang", "triton")
    manifest = generate(args.out_dir, backends, args.jobs, args.match)
    print(f"{len(manifest)} kernels written to {args.out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
