"""Selection: precedence, strictness, auto, unknown names, reasons, logging, YAML and use_backend."""
import logging

import pytest
import torch

import kernel_dispatch as kd
from kernel_dispatch import config, registry

META = {"device": "cpu", "dtype": torch.float32, "head_dim": 8, "gqa": False, "lengths": False, "causal": True,
        "bias_length": 4}
MHC_META = {"device": "cpu", "dtype": torch.float32, "n": 4, "D": 8}


def test_golden_implements_every_operator_and_a_missing_one_is_a_reason():
    for op in kd.OPERATORS:
        assert "golden" in {i.backend for i in registry.implementations(op)}
    for b in kd.BACKEND_NAMES:
        for op in ("lazy_attention",) + (() if b == "cute" else ("mhc_pre", "mhc_post")):  # cute: attention only
            assert registry.impl(op, b) is not None, (op, b)
    assert registry.why_not("mhc_pre", "cute", MHC_META) == ["no cute implementation of mhc_pre"]
    registry.unregister_impl("mhc_post", "triton")
    try:
        assert registry.why_not("mhc_post", "triton", MHC_META) == ["no triton implementation of mhc_post"]
    finally:
        registry._package_cache.pop("triton")  # the next look-up registers the package's implementations again
    assert registry.impl("mhc_post", "triton") is not None


def test_auto_on_cpu_ends_at_golden_with_reasons_for_the_others():
    r = registry.resolve("lazy_attention", META)
    assert (r.forward, r.backward, r.source) == ("golden", "golden", "auto")
    assert r.reasons["golden"] == []
    assert any("CUDA" in x or "auto does not pick" in x for x in r.reasons["tilelang"])


def test_explicit_unavailable_backend_raises_with_every_reason():
    meta = dict(META, head_dim=96, dtype=torch.float64)
    with pytest.raises(kd.BackendUnavailableError) as e:
        registry.resolve("lazy_attention", meta, "tilelang")
    msg = str(e.value)
    assert "no CUDA device" in msg and "head_dim 96" in msg and "float64" in msg and "argument" in msg


def test_precedence_argument_context_env_yaml(monkeypatch):
    registry.set_yaml_backend("golden", "YAML test.yaml")
    assert registry.current_choice("mhc_pre") == (("golden", "golden"), "YAML test.yaml")
    monkeypatch.setenv("KERNEL_BACKEND", "auto")
    assert registry.current_choice("mhc_pre") == (("auto", "auto"), "environment KERNEL_BACKEND")
    monkeypatch.setenv("MHC_BACKEND", "golden,auto")
    assert registry.current_choice("mhc_pre") == (("golden", "auto"), "environment MHC_BACKEND")
    assert registry.current_choice("lazy_attention")[1] == "environment KERNEL_BACKEND"
    monkeypatch.setenv("LAZYATTN_BACKEND", "golden")
    assert registry.current_choice("lazy_attention")[1] == "environment LAZYATTN_BACKEND"
    with kd.use_backend(mhc=("auto", "golden")):
        assert registry.current_choice("mhc_pre") == (("auto", "golden"), "use_backend")
        assert registry.current_choice("lazy_attention")[1] == "environment LAZYATTN_BACKEND"
        with kd.use_backend("golden"):
            assert registry.current_choice("lazy_attention") == (("golden", "golden"), "use_backend")
        assert registry.current_choice("mhc_pre", backend="golden") == (("golden", "golden"), "argument")
    assert registry.current_choice("mhc_pre")[1] == "environment MHC_BACKEND"


@pytest.mark.parametrize("value", ["cudnn", "triton,nope", "gold"])
def test_unknown_environment_name_fails_listing_valid_names(monkeypatch, value):
    monkeypatch.setenv("LAZYATTN_BACKEND", value)
    with pytest.raises(kd.ConfigError) as e:
        registry.current_choice("lazy_attention")
    assert "LAZYATTN_BACKEND" in str(e.value) and "golden, triton, tilelang, cute, auto" in str(e.value)


def test_yaml_forms_and_errors(tmp_path):
    p = tmp_path / "run.yaml"
    p.write_text("backend:\n  lazy_attention: {forward: golden, backward: auto}\n  mhc: golden\nother: 1\n")
    data = kd.load_config(p)
    assert data["other"] == 1
    assert registry.current_choice("lazy_attention") == (("golden", "auto"), f"YAML {p}")
    assert registry.current_choice("mhc_post") == (("golden", "golden"), f"YAML {p}")
    p.write_text("backend: {lazy_atention: golden}\n")
    with pytest.raises(kd.ConfigError, match="lazy_atention"):
        kd.load_config(p)
    p.write_text("backend: {mhc: {forward: golden, sideways: triton}}\n")
    with pytest.raises(kd.ConfigError, match="sideways"):
        kd.load_config(p)
    p.write_text("backend: tritn\n")
    with pytest.raises(kd.ConfigError, match="tritn.*valid names"):
        kd.load_config(p)


def test_use_backend_rejects_unknown_operator_and_name():
    with pytest.raises(kd.ConfigError, match="attention"):
        with kd.use_backend(attention="golden"):
            pass
    with pytest.raises(kd.ConfigError, match="valid names"):
        with kd.use_backend("cuda"):
            pass


def test_first_resolution_is_logged_once_with_its_source(caplog):
    registry.reset()
    with caplog.at_level(logging.INFO, logger="kernel_dispatch"):
        registry.resolve("mhc_post", MHC_META)
        registry.resolve("mhc_post", dict(MHC_META, D=16))
    lines = [r.getMessage() for r in caplog.records if "mhc_post" in r.getMessage()]
    assert len(lines) == 1 and "golden" in lines[0] and "from auto" in lines[0]


def test_missing_package_and_missing_kernels_are_reasons_not_crashes(monkeypatch):
    import sys
    registry.reset()
    monkeypatch.setitem(sys.modules, "tilelang", None)  # import tilelang now raises ImportError
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    reason = registry.backend_unavailable("tilelang")
    assert reason and "tilelang not importable" in reason
    registry.reset()


def test_capabilities_are_data_and_explain_themselves():
    from kernel_dispatch.ops.lazy_attention import LazyAttentionCaps
    from kernel_dispatch.ops.mhc_pre import MHCCaps

    caps = LazyAttentionCaps(devices=("cuda",), dtypes=(torch.bfloat16,), head_dims=(64, 128), gqa=False)
    r = caps.why_not({"device": "cpu", "dtype": torch.float16, "head_dim": 96, "gqa": True})
    assert len(r) == 4, r
    assert caps.why_not({"device": "cuda", "dtype": torch.bfloat16, "head_dim": 64}) == []
    mcaps = MHCCaps(devices=("cuda",), n_streams=(4,), d_multiple=8)
    assert len(mcaps.why_not({"device": "cpu", "n": 3, "D": 12})) == 3
    assert mcaps.why_not({"device": "cuda", "n": 4, "D": 16}) == []


def test_which_backend_describes_a_call():
    q = torch.randn(1, 2, 5, 8)
    r = kd.which_backend("lazy_attention", q, q, q, torch.zeros(2, 3), torch.zeros(2))
    assert r.forward == "golden" and r.source == "auto"
    assert "golden" in str(r)
    with pytest.raises(ValueError, match="tau"):
        kd.which_backend("lazy_attention", q, q, q, torch.zeros(2, 3), torch.zeros(3))


def test_parse_choice_forms():
    assert config.parse_choice("triton", "x") == ("triton", "triton")
    assert config.parse_choice("triton, golden", "x") == ("triton", "golden")
    assert config.parse_choice(("tilelang", "golden"), "x") == ("tilelang", "golden")
    assert config.parse_choice({"backward": "golden"}, "x") == ("auto", "golden")


def test_import_works_without_triton_and_tilelang(tmp_path):
    import subprocess
    import sys
    code = ("import sys; sys.modules['triton'] = None; sys.modules['tilelang'] = None\n"
            "import torch, kernel_dispatch as kd\n"
            "from kernel_dispatch import registry\n"
            "print(registry.backend_unavailable('triton'))\n"
            "q = torch.randn(1, 1, 4, 8); print(kd.lazy_attention(q, q, q, torch.zeros(1, 2), torch.zeros(1)).shape)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "triton not importable" in out.stdout
