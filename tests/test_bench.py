"""The benchmark harness never rots: ``python -m kernel_dispatch.bench --quick`` runs on the CPU and
writes a sane table, JSON, plots and docs preview; the docs page is written only from GPU runs."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kernel_dispatch import bench
from kernel_dispatch.benchmarks import docs, merge, report

BACKENDS = "golden,tilelang,sdpa_flash"  # golden runs; the other two must say why they cannot
PNG = b"\x89PNG\r\n\x1a\n"


def _finite_positive(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


def _check_table(stdout: str) -> None:
    for heading in ("## Lazy attention (", "## mHC block", "## Lazy attention over packed documents",
                    "## Lazy attention with a KV cache"):
        assert heading in stdout, heading
    rows = [line for line in stdout.splitlines() if line.startswith("| ")]
    assert sum("| golden |" in r for r in rows) == 8  # 2 attention + 2 mHC + 2 varlen + 2 KV-cache shapes
    assert any("| tilelang |" in r and "not run:" in r for r in rows)


def _check_environment(data: dict) -> None:
    for key in ("device", "card", "driver", "torch", "triton", "tilelang", "date"):
        assert key in data["env"], key
    assert data["env"]["device"] == "cpu" and data["quick"] is True and data["complete"] is True
    assert _finite_positive(data["copy_gbps"])
    assert set(data["conventions"]) >= {"lazy_attention_flops", "mhc_bytes", "mhc_sol", "time",
                                        "lazy_attention_varlen_flops", "kvcache_sol"}


def _check_golden(records: list[dict]) -> None:
    golden = [r for r in records if r["backend"] == "golden"]
    assert {r["op"] for r in golden} == {"lazy_attention", "mhc", "lazy_attention_varlen",
                                         "lazy_attention_with_kvcache"}
    rates = {"lazy_attention": ("fwd_tflops", "fwd_bwd_tflops"), "lazy_attention_varlen": ("fwd_tflops",
             "fwd_bwd_tflops"), "mhc": ("fwd_sol", "fwd_bwd_sol"), "lazy_attention_with_kvcache": ("fwd_sol",)}
    for r in golden:
        assert r["reason"] is None, r
        forward_only = r["op"] == "lazy_attention_with_kvcache"
        assert (r["fwd_bwd"] is None) == forward_only, r
        for key in ("fwd",) if forward_only else ("fwd", "fwd_bwd"):
            t = r[key]
            assert _finite_positive(t["median_ms"]) and t["reps"] >= 1, t
            assert t["min_ms"] <= t["q1_ms"] <= t["median_ms"] <= t["q3_ms"] <= t["max_ms"], t
        assert all(_finite_positive(r["metrics"][k]) for k in rates[r["op"]]), r["metrics"]
        for d in ("fwd",) if forward_only else ("fwd", "bwd"):  # golden bf16 vs float64: bf16 rounding, no more
            e = r["check"][d]
            assert 0 < e["rel"] < 2e-2 and math.isfinite(e["max_abs"]), (d, e)


def _check_reasons(records: list[dict]) -> None:
    others = [r for r in records if r["backend"] != "golden"]
    assert {r["backend"] for r in others} == {"tilelang", "sdpa_flash"}
    assert {r["op"] for r in others if r["backend"] == "sdpa_flash"} == {"lazy_attention",
                                                                          "lazy_attention_with_kvcache"}
    for r in others:
        assert r["reason"] and r["fwd"] is None and r["fwd_bwd"] is None, r


def test_quick_command_line(tmp_path):
    """What CI runs: the real entry point, its table, JSON, plots and docs preview."""
    page = docs.DOCS_PAGE
    before = page.stat().st_mtime_ns if page.exists() else None
    cmd = [sys.executable, "-m", "kernel_dispatch.bench", "--quick", "--backends", BACKENDS,
           "--json", str(tmp_path / "quick.json"), "--docs"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=report.REPO, env=dict(os.environ))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (page.stat().st_mtime_ns if page.exists() else None) == before, "a CPU run wrote docs/benchmarks.md"
    _check_table(proc.stdout)
    data = json.loads((tmp_path / "quick.json").read_text())
    _check_environment(data)
    _check_golden(data["records"])
    _check_reasons(data["records"])
    for name in ("lazy_attention_time.png", "mhc_sol.png", "lazy_attention_varlen_time.png",
                 "lazy_attention_with_kvcache_sol.png"):
        assert (tmp_path / name).read_bytes()[:8] == PNG
    preview = (tmp_path / "benchmarks.md").read_text()
    assert "Not a complete GPU run" in preview and "| golden |" in preview
    assert (tmp_path / "benchmarks" / "results.json").exists()


@pytest.fixture(scope="module")
def gpu_like(tmp_path_factory) -> dict:
    """A quick run made in-process, then relabelled as a complete H100 run (for the docs rules)."""
    path = tmp_path_factory.mktemp("bench") / "quick.json"
    assert bench.main(["--quick", "--json", str(path), "--no-plots"]) == 0
    data = json.loads(path.read_text())
    env = dict(data["env"], device="cuda", card="NVIDIA H100 80GB HBM3", capability="9.0", sms=132, memory_gib=79.2)
    return dict(data, quick=False, env=env)


def test_docs_page_only_from_gpu_runs(gpu_like):
    cpu = dict(gpu_like, quick=True, env=dict(gpu_like["env"], device="cpu"))
    with pytest.raises(ValueError, match="only a full GPU run"):
        docs.write(cpu, docs.DOCS_PAGE)
    assert docs.is_gpu_run(gpu_like) and not docs.is_gpu_run(cpu)
    assert not docs.is_gpu_run(dict(gpu_like, complete=False))  # a run stopped early never becomes the page
    page = docs.render(gpu_like, "benchmarks", ["lazy_attention_time.png"])
    assert "Not a complete GPU run" not in page and "NVIDIA H100 80GB HBM3 (sm_90" in page
    assert "![lazy_attention_time.png](benchmarks/lazy_attention_time.png)" in page


def test_docs_regenerated_from_a_saved_gpu_json(gpu_like, tmp_path, monkeypatch, capsys):
    """The GPU flow: run with --json on the GPU, then --from-json ... --docs here (the page redirected)."""
    saved = tmp_path / "bench.json"
    saved.write_text(json.dumps(gpu_like))
    page = tmp_path / "docs" / "benchmarks.md"
    monkeypatch.setattr(docs, "DOCS_PAGE", page)
    readme = tmp_path / "README.md"
    readme.write_text("# x\n<!-- speed:start -->\n<!-- speed:end -->\n")
    monkeypatch.setattr(docs, "README_PAGE", readme)
    assert bench.main(["--from-json", str(saved), "--docs"]) == 0
    assert "| tilelang |" in readme.read_text() and "NVIDIA H100 80GB HBM3" in readme.read_text()
    assert "| golden |" in capsys.readouterr().out
    text = page.read_text()
    assert "Not a complete GPU run" not in text and "NVIDIA H100 80GB HBM3" in text
    assert json.loads((page.parent / "benchmarks" / "results.json").read_text())["env"]["device"] == "cuda"
    assert (page.parent / "benchmarks" / "mhc_sol.png").read_bytes()[:8] == PNG


def test_command_line_parsing():
    assert bench.int_list("1K,2048,32k") == (1024, 2048, 32768)
    assert bench._D(bench.parse_args(["--D", "64,128", "--D", "mhc=1280"]).D) == {
        "lazy_attention": (64, 128), "mhc": (1280,), "lazy_attention_varlen": (64, 128),
        "lazy_attention_with_kvcache": (64, 128)}
    args = bench.parse_args(["--varlen-T", "8K", "--kv-shapes", "1x4K,64x16k", "--T", "4096"])
    assert (args.varlen_T, args.kv_shapes, args.T) == (8192, ((1, 4096), (64, 16384)), (4096,))
    args = bench.parse_args(["--reps", "400", "--rounds", "40"])
    assert (args.reps, args.rounds) == (400, 40) and bench.parse_args([]).rounds == 10
    for bad in (["--backends", "nope"], ["--L", "abc"], ["--D", "attn=64"], ["--ops", "mhc_pre"],
                ["--kv-shapes", "4096"]):
        with pytest.raises(SystemExit):
            bench.parse_args(bad)


def test_commit_override(monkeypatch):
    """$KD_GIT_COMMIT names the commit of a run whose tree is a copy with another .git (a remote GPU machine)."""
    import torch

    from kernel_dispatch.benchmarks.report import environment
    monkeypatch.setenv("KD_GIT_COMMIT", "abc1234")
    assert environment(torch.device("cpu"))["git_commit"] == "abc1234"
    monkeypatch.delenv("KD_GIT_COMMIT")
    assert environment(torch.device("cpu"))["git_commit"] != "abc1234"


def test_flex_falls_back_to_smaller_tiles_once(monkeypatch):
    """FlexAttention's default tiles can exceed an H100's shared memory (torch 2.11): the baseline then reruns
    with FLEX_SMALL_TILES, keeps them for that head dim and direction, and its note says so; any other
    error still fails the row."""
    from kernel_dispatch.benchmarks.common import Candidate
    from kernel_dispatch.ops import lazy_attention_baselines as baselines

    monkeypatch.setattr(baselines, "_flex_tiles", {})
    calls = []

    def run(options):
        calls.append(options)
        if options is None:
            raise RuntimeError("No valid triton configs. OutOfMemoryError: out of resource: Required: 245760")
        return "ran"

    cand = Candidate("flex", note="bias as score_mod")
    fwd = baselines.with_smaller_tiles(run, (64, "fwd"), cand, "fwd")
    assert fwd() == "ran" and calls == [None, baselines.FLEX_SMALL_TILES]
    assert fwd() == "ran" and calls[2:] == [baselines.FLEX_SMALL_TILES]  # the default is not retried
    assert cand.note == ("bias as score_mod; fwd with kernel_options BLOCK_M=64, BLOCK_N=64, num_stages=2 "
                         "(torch's default tiles exceed shared memory)")
    both = baselines.with_smaller_tiles(run, (64, "fwd_bwd"), cand, "fwd+bwd")
    assert both() == "ran" and cand.note.count("kernel_options") == 2 and "; fwd+bwd with kernel_options" in cand.note

    def broken(options):
        raise ValueError("score_mod: bad index")

    with pytest.raises(ValueError, match="bad index"):
        baselines.with_smaller_tiles(broken, (128, "fwd_bwd"), Candidate("flex"), "fwd+bwd")()
    assert baselines.out_of_shared_memory(RuntimeError("out of resource: shared memory"))
    assert not baselines.out_of_shared_memory(RuntimeError("CUDA error: illegal address"))


def test_readme_speed_summary_is_the_generated_one():
    """The README's speed block is generated from docs/benchmarks/results.json, so it never drifts from the
    benchmark page."""
    from kernel_dispatch import _readme

    data = json.loads((_readme.README.parent / "docs" / "benchmarks" / "results.json").read_text())
    assert _readme.block(_readme.README.read_text(), "speed") == docs.readme_speed(data), \
        "README speed summary is stale: run python -m kernel_dispatch.bench --from-json " \
        "docs/benchmarks/results.json --docs"


def test_readme_block_names_missing_markers(tmp_path):
    from kernel_dispatch import _readme

    page = tmp_path / "README.md"
    page.write_text("# x\n<!-- speed:start -->\nold\n<!-- speed:end -->\ntail\n")
    _readme.replace_block(page, "speed", "new")
    assert page.read_text() == "# x\n<!-- speed:start -->\nnew\n<!-- speed:end -->\ntail\n"
    with pytest.raises(ValueError, match="support-table:start"):
        _readme.block(page.read_text(), "support-table")


def test_varlen_documents_are_seeded_and_fill_T():
    from kernel_dispatch.ops import lazy_attention_varlen_bench as vb

    lens = vb.document_lengths(16384, 64, 4096, seed=0)
    assert lens == vb.document_lengths(16384, 64, 4096, seed=0) != vb.document_lengths(16384, 64, 4096, seed=1)
    assert sum(lens) == 16384 and all(64 <= n <= 4096 for n in lens[:-1]) and 1 <= lens[-1] <= 4096
    uniform = vb.shapes(bench.parse_args([]), False, None)[1]
    assert uniform.case == "uniform" and uniform.lengths == (4096,) * 4
    assert vb.flops(uniform)["fwd"] == 4 * 16 * 128 * 4 * 4096**2 / 2


def _split_run(gpu_like: dict) -> tuple[dict, dict]:
    """gpu_like as two runs of one machine: lazy attention and its packed form, then the two ops that measure the
    copy bandwidth (mhc, KV cache)."""
    copy_ops = ("mhc", "lazy_attention_with_kvcache")
    a = dict(gpu_like, command="python -m kernel_dispatch.bench --ops lazy_attention", copy_gbps=None,
             elapsed_s=10.0, records=[r for r in gpu_like["records"] if r["op"] not in copy_ops])
    b = dict(gpu_like, command="python -m kernel_dispatch.bench --ops mhc,lazy_attention_with_kvcache",
             elapsed_s=5.5, records=[r for r in gpu_like["records"] if r["op"] in copy_ops])
    assert a["records"] and b["records"] and gpu_like["copy_gbps"]
    return a, b


def test_saved_runs_merge_into_one_page(gpu_like, tmp_path, capsys):
    """A sweep longer than one process may run: two invocations on one machine, merged by --from-json a,b."""
    a, b = _split_run(gpu_like)
    (tmp_path / "a.json").write_text(json.dumps(a))
    (tmp_path / "b.json").write_text(json.dumps(b))
    out = tmp_path / "merged.json"
    assert bench.main(["--from-json", f"{tmp_path / 'a.json'},{tmp_path / 'b.json'}", "--json", str(out),
                       "--no-plots"]) == 0
    assert f"results: {out}" in capsys.readouterr().out
    merged = json.loads(out.read_text())
    assert len(merged["records"]) == len(gpu_like["records"]) and merged["copy_gbps"] == gpu_like["copy_gbps"]
    assert [r["command"] for r in merged["runs"]] == [a["command"], b["command"]] and merged["elapsed_s"] == 15.5
    assert "command" not in merged and "settings" not in merged and merged["runs"][0]["settings"] == a["settings"]
    page = docs.render(merged, "benchmarks", [])
    assert f"- `{a['command']}` ({a['env']['date']}, 10.0 s)" in page and "Command: `" not in page
    assert "copy bandwidth" in page and "| golden |" in page
    assert "Command: `python -m kernel_dispatch.bench --quick" in docs.render(gpu_like, "benchmarks", [])
    # a merged result renders again from its own file, and is not merged a second time
    assert docs.render(json.loads(out.read_text()), "benchmarks", []) == page
    with pytest.raises(ValueError, match="merge the runs it came from"):
        merge.merge([(out, merged), (tmp_path / "a.json", a)])
    # runs saved without conventions merge and render too (the page then states the code's current ones)
    old_a, old_b = ({k: v for k, v in run.items() if k != "conventions"} for run in (a, b))
    assert merge.merge([(Path("a.json"), old_a), (Path("b.json"), b)])["conventions"] == b["conventions"]
    both_old = merge.merge([(Path("a.json"), old_a), (Path("b.json"), old_b)])
    assert both_old["conventions"] == {} and "## How to read the numbers" in docs.render(both_old, "benchmarks", [])


@pytest.mark.parametrize("change, message", [
    (lambda a, b: b["env"].update(card="NVIDIA H200"),
     r"b\.json: env\.card is 'NVIDIA H200', a\.json has 'NVIDIA H100"),
    (lambda a, b: b["env"].update(git_commit="abc1234"), r"env\.git_commit is 'abc1234'"),
    (lambda a, b: b.update(records=b["records"] + a["records"][:1]), r"b\.json: lazy_attention .* is also in a\.json"),
    (lambda a, b: a.update(copy_gbps=1000.0), r"a\.json and b\.json each measured the copy bandwidth"),
    (lambda a, b: b.update(quick=True), r"b\.json: a --quick run"),
])
def test_merge_refuses_runs_that_do_not_share_a_page(gpu_like, change, message):
    a, b = (json.loads(json.dumps(run)) for run in _split_run(gpu_like))
    change(a, b)
    with pytest.raises(ValueError, match=message):
        merge.merge([(Path("a.json"), a), (Path("b.json"), b)])
    with pytest.raises(ValueError, match="two or more"):
        merge.merge([(Path("a.json"), a)])


def test_from_json_names_an_unreadable_file(tmp_path):
    with pytest.raises(SystemExit, match="cannot read .*missing.json"):
        bench.main(["--from-json", f"{tmp_path / 'missing.json'},{tmp_path / 'other.json'}", "--no-plots"])
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"records": []}))
    with pytest.raises(SystemExit, match="other.json is not a saved benchmark run"):
        bench.main(["--from-json", str(other), "--no-plots"])


def test_attention_plot_draws_the_main_sweep_only():
    """A point of another batch size merged into a run (B=2, L=16384 beside the sweep's B=1) stays off the lines."""
    from kernel_dispatch.ops.lazy_attention_bench import main_sweep

    def rec(B, L):
        return {"shape": {"B": B, "H": 16, "L": L, "D": 128, "W": 512}, "backend": "cute"}

    records = [rec(16, 1024), rec(4, 4096), rec(1, 16384), rec(1, 32768), rec(2, 16384)]
    tokens, kept = main_sweep(records)
    assert tokens == 16384 and kept == records[:4]


def test_fraction_axis_never_cuts_a_point_off():
    from kernel_dispatch.benchmarks import plots

    plt = plots.pyplot()
    fig, axes = plots.grid(plt, 2, "t")
    axes[0][0].plot([1, 2], [0.5, 1.08])
    axes[0][1].plot([1, 2], [0.2, 0.4])
    for ax in axes[0]:
        plots.fraction_axis(ax)
    assert axes[0][0].get_ylim()[1] >= 1.08 and axes[0][1].get_ylim() == (0.0, 1.05)
    plt.close(fig)


def test_every_backend_and_baseline_has_its_own_colour():
    from kernel_dispatch import registry
    from kernel_dispatch.benchmarks import plots
    from kernel_dispatch.benchmarks.common import baselines

    names = registry.BACKEND_NAMES + baselines()
    records = [{"backend": n, "kind": "kernel" if n in registry.BACKEND_NAMES else "baseline"} for n in names]
    colours = [s["color"] for s in plots.styles(records).values()]
    assert len(set(colours)) == len(names) == len(colours)
