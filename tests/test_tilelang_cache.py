"""The TileLang kernel tarball for GPU machines: pack and unpack keep a cache's kernel directories, a failed build
is reported, and scripts/prebuild_tilelang.py lists every TileLang shape class the GPU tests and the benchmark's
default sweep run (no kernel is compiled here).
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from kernel_dispatch import registry
from kernel_dispatch.ops import lazy_attention_bench as attention_bench
from kernel_dispatch.testing.tilelang_cache import BuildResult, KernelJob, build_one, pack, unpack

from .cases import CASES

PREBUILD = Path(__file__).resolve().parents[1] / "scripts" / "prebuild_tilelang.py"
# the selection facts and the shape class of a case: what the TileLang kernels of each operator are compiled for
FACTS = {
    "lazy_attention": lambda case: {"head_dim": case.D, "gqa": case.H != case.Hkv, "lengths": case.lengths is not None,
                                    "causal": case.causal, "bias_length": case.W},
    "lazy_attention_varlen": lambda case: {"head_dim": case.D, "gqa": case.H != case.Hkv, "causal": case.causal,
                                           "bias_length": case.W},
    "mhc_pre": lambda case: {"n": case.n, "D": case.D},
    "mhc_post": lambda case: {"n": case.n, "D": case.D},
}
SHAPE_CLASS = {
    "lazy_attention": lambda case, dtype: (case.D, dtype, case.causal),
    "lazy_attention_varlen": lambda case, dtype: (case.D, dtype, case.causal),
    "mhc_pre": lambda case, dtype: (case.D, dtype),
    "mhc_post": lambda case, dtype: (case.D, dtype),
}
KERNELS_OF = {"lazy_attention_varlen": "lazy_attention"}  # runs the lazy_attention kernels, one batch per length


def _fake_kernel(cache: Path, key: str) -> Path:
    d = cache / "0.1.15" / "linux-x86_64" / "kernels" / key
    d.mkdir(parents=True)
    (d / "executable.so").write_bytes(b"\x7fELF" + key.encode())
    return d


def test_pack_then_unpack_merges_the_kernels(tmp_path):
    cache = tmp_path / "built"
    job = KernelJob("k", "m", "f")
    results = [BuildResult(job, 1.0, str(_fake_kernel(cache, key))) for key in ("aa", "bb")]
    results.append(BuildResult(job, 1.0, error="ValueError: no"))
    _fake_kernel(cache, "not_used")
    tar = tmp_path / "out" / "kernels.tar.xz"
    assert pack(results, cache, tar) == 2
    target = tmp_path / "gpu_cache"
    _fake_kernel(target, "already_there")
    got, n = unpack(tar, target)
    assert (got, n) == (target, 2)
    kernels = target / "0.1.15" / "linux-x86_64" / "kernels"
    assert sorted(p.name for p in kernels.iterdir()) == ["aa", "already_there", "bb"]
    assert (kernels / "bb" / "executable.so").read_bytes() == b"\x7fELFbb"


def test_pack_refuses_a_kernel_outside_the_cache(tmp_path):
    outside = _fake_kernel(tmp_path / "elsewhere", "cc")
    with pytest.raises(ValueError):
        pack([BuildResult(KernelJob("k", "m", "f"), 1.0, str(outside))], tmp_path / "cache", tmp_path / "t.tar.xz")


def test_unpack_without_a_tarball_names_the_tool(tmp_path):
    with pytest.raises(FileNotFoundError, match="prebuild_tilelang.py"):
        unpack(tmp_path / "missing.tar.xz", tmp_path / "cache")


def test_a_failing_factory_is_a_result_not_a_crash():
    res = build_one(KernelJob("sqrt of -1", "math", "sqrt", (-1.0,)))
    assert res.cache_path is None and res.error.startswith("ValueError")


@pytest.fixture(scope="module")
def prebuild():
    spec = importlib.util.spec_from_file_location("prebuild_tilelang", PREBUILD)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _tilelang_runs(op: str, case, dtype) -> bool:
    reasons = registry.impl(op, "tilelang").caps.why_not(dict(FACTS[op](case), device="cuda", dtype=dtype))
    return not reasons


@pytest.mark.parametrize("op", tuple(SHAPE_CLASS))
def test_prebuild_covers_every_tilelang_case_of_the_matrix(op, prebuild):
    classes = set(prebuild.shape_classes()[KERNELS_OF.get(op, op)])
    missing = {SHAPE_CLASS[op](case, dtype) for case in CASES[op] for dtype in (torch.float16, torch.bfloat16)
               if _tilelang_runs(op, case, dtype)} - classes
    assert not missing, f"{op}: shape classes the GPU tests run but scripts/prebuild_tilelang.py skips: {missing}"


def test_prebuild_covers_the_benchmark_default_sweep(prebuild):
    classes = prebuild.shape_classes()
    assert {(D, torch.bfloat16, True) for D in attention_bench.DEFAULT["D"]} <= set(classes["lazy_attention"])
    from kernel_dispatch.ops import mhc_bench
    for op in ("mhc_pre", "mhc_post"):
        assert {(D, torch.bfloat16) for D in mhc_bench.DEFAULT["D"]} <= set(classes[op])


def test_prebuild_jobs_are_unique_and_named(prebuild):
    jobs = prebuild.all_jobs()
    assert len({(j.module, j.factory, j.args) for j in jobs}) == len(jobs)
    assert all(j.label and j.factory in ("build", "prim_func") for j in jobs)


def test_prebuild_only_keeps_the_kernels_whose_label_matches(prebuild, capsys):
    assert prebuild.main(["--list", "--ops", "lazy_attention", "--dtypes", "bfloat16",
                          "--only", "varlen dkdv d128,row_dot d64 bfloat16 full"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == ["lazy_attention row_dot d64 bfloat16 full", "lazy_attention_varlen row_dot d64 bfloat16 full",
                     "lazy_attention_varlen dkdv d128 bfloat16 causal", "lazy_attention_varlen dkdv d128 bfloat16 full",
                     "4 kernels"]
