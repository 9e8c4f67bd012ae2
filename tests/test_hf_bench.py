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
