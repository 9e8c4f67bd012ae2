"""Every shipped cute kernel builds for sm_90a on this CPU machine (the DSL from the ``cute`` extra), fits sm_90's
shared memory, keeps its values in registers (no local memory: spills), keeps its wgmma asynchronous (ptxas did not
serialise them) and loads from the store without the DSL: what a GPU machine with only the runtime library and tvm_ffi
does."""
import importlib
import json
import os
import subprocess
import sys

import pytest

from kernel_dispatch.backends.cute import _store
from kernel_dispatch.backends.cute.build import SM90_SHARED_BYTES, main, shipped_keys

pytest.importorskip("cutlass", reason="the CuTe DSL (pip install 'kernel-dispatch[cute]') builds the cute kernels")


def test_the_store_map_matches_the_kernel_modules():
    for module_name in set(_store.KERNEL_MODULES.values()):
        module = importlib.import_module(f"kernel_dispatch.backends.cute.{module_name}")
        mapped = {k for k, m in _store.KERNEL_MODULES.items() if m == module_name}
        assert set(module.KERNELS) == mapped, module_name
        assert set(module.ARGS) == mapped, module_name
        assert all(_store.KERNEL_SOURCES[k][0] == module_name + ".py" for k in mapped)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    out = tmp_path_factory.mktemp("cute-store")
    assert main(["--out", str(out), "--workers", "2", "--quiet"]) == 0, "a kernel failed or is over sm_90's limits"
    return out


def test_every_shipped_kernel_builds_within_sm90_limits(store):
    manifest = json.loads((store / "manifest.json").read_text())["kernels"]
    assert sorted(manifest) == sorted(k.name for k in shipped_keys())
    for name, m in manifest.items():
        assert m["arch"] == "sm_90a" and m["source_hash"] == _store.source_hash(m["kernel"]), name
        assert m["local_bytes"] == 0, f"{name}: {m['local_bytes']} bytes of local memory (register spills)"
        assert m["shared_bytes"] <= SM90_SHARED_BYTES, f"{name}: {m['shared_bytes']} bytes of shared memory"
        assert 0 < m["registers"] <= 255, name
        assert m["stack_bytes"] == 0, f"{name}: {m['stack_bytes']} bytes of stack (spilled registers)"
        # ptxas serialises every wgmma of a kernel it cannot prove safe to overlap: then one wait per wgmma
        assert 0 < 2 * m["wgmma_waits"] <= m["wgmma"], f"{name}: {m['wgmma_waits']} waits on {m['wgmma']} wgmma"


def test_the_store_loads_without_the_dsl(store):
    code = ("import sys; from kernel_dispatch.backends.cute import _store, build;"
            "_store.dsl_installed = lambda: False;"
            "fns = [_store.function(k) for k in build.shipped_keys()];"
            "assert 'cutlass' not in sys.modules, 'the prebuilt route imported the DSL';"
            "print(len(fns), type(fns[0]).__name__)")
    env = dict(os.environ, KERNEL_DISPATCH_CUTE_KERNELS=str(store))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[0] == str(len(shipped_keys()))


def test_a_missing_kernel_is_compiled_into_the_store_at_first_use(monkeypatch, tmp_path):
    from kernel_dispatch.backends.cute._kernel_key import KernelKey

    monkeypatch.setenv("KERNEL_DISPATCH_CUTE_KERNELS", str(tmp_path))
    key = KernelKey("fwd_sm90", 64, "float16", True)
    _store.function.cache_clear()
    try:
        fn = _store.function(key)
    finally:
        _store.function.cache_clear()
    assert type(fn).__name__ == "Function"
    assert _store.stored(key, tmp_path)["name"] == key.name
