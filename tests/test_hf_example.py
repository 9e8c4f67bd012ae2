"""examples/hf_finetune_generate.py runs: a few training steps lower the loss, generate() continues the prompt,
and the model reloaded with from_pretrained generates the same (the script exits otherwise)."""
from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest

pytest.importorskip("transformers", minversion="5.23")

SCRIPT = Path(__file__).resolve().parents[1] / "examples" / "hf_finetune_generate.py"


def test_example_fine_tunes_generates_and_reloads():
    spec = importlib.util.spec_from_file_location("hf_finetune_generate", SCRIPT)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    result = example.main(["--steps", "6", "--batch", "4", "--seq", "32", "--new-tokens", "6", "--backend", "golden"])
    losses = result["losses"]
    assert len(losses) == 6 and all(math.isfinite(x) for x in losses) and losses[-1] < losses[0]
    assert len(result["continuation"].encode("utf-8", errors="replace")) >= 1
