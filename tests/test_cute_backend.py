"""The cute backend on a machine without a GPU: it is registered and selectable like the others (argument, scope,
environment, YAML, auto), says why it cannot run, and its kernel store names a missing or stale kernel and the
command that builds it. The kernels' own builds: tests/test_cute_build.py; numerics: the GPU matrix."""
import json

import pytest
import torch

import kernel_dispatch as kd
from kernel_dispatch import registry
from kernel_dispatch.backends.cute import _store
from kernel_dispatch.backends.cute._kernel_key import ARCH, KernelKey

META = {"device": "cuda", "dtype": torch.bfloat16, "head_dim": 128, "gqa": True, "lengths": True, "causal": True,
        "bias_length": 512}
KEY = KernelKey("fwd_sm90", 128, "bfloat16", True)


def test_registered_for_lazy_attention_only_with_its_capabilities():
    assert "cute" in kd.BACKEND_NAMES
    assert registry.impl("lazy_attention", "cute") is not None
    assert registry.impl("mhc_pre", "cute") is None
    reasons = registry.why_not("lazy_attention", "cute", dict(META, dtype=torch.float32, head_dim=96))
    assert any("float32" in r for r in reasons) and any("head_dim 96" in r for r in reasons)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the reasons of a machine without CUDA")
def test_every_way_of_choosing_it_reaches_it_and_says_why_it_cannot_run(monkeypatch, tmp_path):
    q = torch.randn(1, 2, 8, 64)
    k, v = torch.randn(1, 2, 8, 64), torch.randn(1, 2, 8, 64)
    bias, tau = torch.zeros(2, 4), torch.full((2,), -1.0)
    with pytest.raises(kd.BackendUnavailableError, match="cute.*no CUDA device"):
        kd.lazy_attention(q, k, v, bias, tau, backend="cute")
    with kd.use_backend(lazy_attention="cute"), pytest.raises(kd.BackendUnavailableError, match="use_backend"):
        kd.lazy_attention(q, k, v, bias, tau)
    for var in ("LAZYATTN_BACKEND", "KERNEL_BACKEND"):
        monkeypatch.setenv(var, "cute")
        with pytest.raises(kd.BackendUnavailableError, match=f"environment {var}"):
            kd.lazy_attention(q, k, v, bias, tau)
        monkeypatch.delenv(var)
    cfg = tmp_path / "c.yaml"
    cfg.write_text("backend:\n  lazy_attention: cute\n")
    kd.load_config(cfg)
    with pytest.raises(kd.BackendUnavailableError, match="cute"):
        kd.lazy_attention(q, k, v, bias, tau)
    kd.set_yaml_backend(None)
    res = registry.resolve("lazy_attention", dict(META, device="cpu", dtype=torch.float32, head_dim=64))
    assert res.forward != "cute" and res.reasons["cute"]  # auto passes over it, with its reasons


def test_a_missing_kernel_without_the_dsl_names_it_and_the_build_command(monkeypatch, tmp_path):
    monkeypatch.setenv("KERNEL_DISPATCH_CUTE_KERNELS", str(tmp_path))
    monkeypatch.setattr(_store, "dsl_installed", lambda: False)
    reason = _store.why_missing(KEY)
    assert KEY.name in reason and "not built" in reason and str(tmp_path) in reason
    assert "python -m kernel_dispatch.backends.cute.build" in reason
    monkeypatch.setattr(_store, "dsl_installed", lambda: True)
    assert _store.why_missing(KEY) is None  # compiled at first use instead
    monkeypatch.setenv("PATH", str(tmp_path))  # no gcc to link the compiled object
    assert "gcc is not on PATH" in _store.why_missing(KEY)


def test_a_stored_kernel_is_used_only_when_built_from_these_sources(monkeypatch, tmp_path):
    monkeypatch.setenv("KERNEL_DISPATCH_CUTE_KERNELS", str(tmp_path))
    monkeypatch.setattr(_store, "dsl_installed", lambda: False)
    (tmp_path / f"{KEY.name}.so").write_bytes(b"")
    meta = {"name": KEY.name, "arch": ARCH, "source_hash": _store.source_hash(KEY.kernel)}
    (tmp_path / f"{KEY.name}.json").write_text(json.dumps(meta))
    assert _store.stored(KEY) == meta and _store.why_missing(KEY) is None
    (tmp_path / f"{KEY.name}.json").write_text(json.dumps(dict(meta, source_hash="0" * 16)))
    assert _store.stored(KEY) is None
    assert "stale" in _store.why_missing(KEY)


def test_source_hashes_follow_the_kernel_files():
    kernels = list(_store.KERNEL_MODULES)
    for a in kernels:
        for b in kernels:
            same_files = _store.KERNEL_SOURCES[a] == _store.KERNEL_SOURCES[b]
            assert (_store.source_hash(a) == _store.source_hash(b)) == same_files, (a, b)
    with pytest.raises(ValueError, match="kernel"):
        _store.source_hash("nope")


def test_a_kernel_built_from_another_kernel_module_hashes_that_module_too():
    import re

    for kernel, module in _store.KERNEL_MODULES.items():
        text = (_store.PACKAGE_DIR / f"{module}.py").read_text()
        imported = {f"{m}.py" for m in re.findall(r"^from \.(_lazy_attention_\w+_kernel) import", text, re.M)}
        assert imported <= set(_store.KERNEL_SOURCES[kernel]), (kernel, imported)
    assert "_lazy_attention_fwd_sm90_kernel.py" in _store.KERNEL_SOURCES["lse_sm90"]  # its row work is the forward's


def test_key_names_are_distinct():
    from kernel_dispatch.backends.cute.build import shipped_keys

    names = [k.name for k in shipped_keys()]
    assert len(names) == len(set(names)) == len(_store.KERNEL_MODULES) * 2 * 2 * 2  # kernels x D x dtype x mask
    assert KEY.name == "kd_lazy_attention_fwd_sm90_d128_bfloat16_causal"
