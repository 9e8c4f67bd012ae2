"""The transformers benchmark never rots: its --smoke mode runs the same code on tiny models on the CPU."""
from __future__ import annotations

import json
import math

import pytest

pytest.importorskip("transformers", minversion="5.23")

from kernel_dispatch.integrations import transformers_bench  # noqa: E402


def test_smoke_prints_both_tables_and_writes_json(tmp_path, capsys):
    path = tmp_path / "hf_bench.json"
    data = transformers_bench.main(["--smoke", "--json", str(path)])
    out = capsys.readouterr().out
    assert "## DeepSeek-V4 stack" in out and "## Llama-style training step" in out
    assert "| kernel mHC, golden |" in out and "| lazy attention, golden |" in out
    assert json.loads(path.read_text())["env"]["transformers"] == data["env"]["transformers"]
    for table, names in (("mhc", ["eager mHC (transformers)", "kernel mHC, golden"]),
                         ("llama", ["SDPA (transformers)", "lazy attention, golden"])):
        rows = data[table]["rows"]
        assert [r["name"] for r in rows] == names
        assert all("error" not in r and math.isfinite(r["ms"]) and r["ms"] > 0 for r in rows), rows
    assert data["mhc"]["rows"][1]["check_rel_err"] < 1e-4  # kernel mHC's output against eager, float32


def test_an_unavailable_backend_is_a_row_not_a_crash(capsys):
    data = transformers_bench.main(["--smoke", "--only", "mhc", "--backends", "tilelang"])
    row = data["mhc"]["rows"][1]
    assert row["name"] == "kernel mHC, tilelang" and "BackendUnavailableError" in row["error"]
    assert "not run: BackendUnavailableError" in capsys.readouterr().out


def test_rows_are_timed_in_alternation_and_errors_stay_rows():
    """A table's steps take turns (each round one after the other, every other round reversed); a model that could
    not be built, a step that raises and a failing check are rows with their errors, in the table's order."""
    import torch

    from kernel_dispatch.benchmarks.timing import Settings, Timer

    calls = []

    def step(name):
        return lambda: calls.append(name)

    def broken():
        raise RuntimeError("step failed")

    steps = {"a": step("a"), "b": MemoryError("no room for b"), "c": step("c"), "d": broken}
    timer = Timer(torch.device("cpu"), Settings(warmup=0, min_reps=2, max_reps=2, budget_s=0.0, rounds=2))
    rows = transformers_bench._rows(timer, steps, {"a": lambda: 0.5, "c": lambda: 1 / 0})
    assert [r["name"] for r in rows] == ["a", "b", "c", "d"]
    assert rows[0]["check_rel_err"] == 0.5 and rows[0]["reps"] == 2 and rows[0]["ms"] >= 0
    assert rows[1]["error"] == "MemoryError: no room for b"
    assert rows[2]["error"].startswith("ZeroDivisionError") and rows[3]["error"] == "RuntimeError: step failed"
    timed = calls[-8:]  # after preparation: round 1 a, c (each an untimed run, then one timed); round 2 c, a
    assert timed == ["a", "a", "c", "c", "c", "c", "a", "a"], calls
