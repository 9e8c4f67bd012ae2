"""`python -m kernel_dispatch.info` prints every operator x backend with availability, reasons and the choice's source."""
import subprocess
import sys

import kernel_dispatch as kd
from kernel_dispatch import info, registry


def test_info_lists_every_operator_and_backend(monkeypatch, capsys):
    monkeypatch.setenv("MHC_BACKEND", "golden")
    info.main(["--device", "cpu", "--dtype", "bf16", "--head-dim", "96"])
    out = capsys.readouterr().out
    for op in kd.OPERATORS:
        assert op in out
    assert out.count("golden    yes") == len(kd.OPERATORS)
    assert "from environment MHC_BACKEND" in out
    assert "head_dim 96" in out


def test_info_markdown_table_has_a_row_per_implementation():
    table = info.markdown_support_table()
    rows = sum(registry.impl(op, b) is not None for op in kd.OPERATORS for b in kd.BACKEND_NAMES)
    assert len(table.splitlines()) == 2 + rows


def test_info_runs_as_a_module():
    out = subprocess.run([sys.executable, "-m", "kernel_dispatch.info"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "lazy_attention" in out.stdout and "from auto" in out.stdout


def test_readme_support_table_is_the_generated_one():
    from pathlib import Path
    readme = (Path(__file__).parent.parent / "README.md").read_text()
    assert info.readme_table(readme) == info.markdown_support_table(), \
        "README support table is stale: run python -m kernel_dispatch.info --update-readme README.md"


def test_info_reports_a_bad_choice_as_a_line_and_rejects_bad_options(monkeypatch, capsys):
    import pytest

    monkeypatch.setenv("LAZYATTN_BACKEND", "cudnn")
    info.main(["--device", "cpu"])
    out = capsys.readouterr().out
    assert "choice error: environment variable LAZYATTN_BACKEND: unknown backend 'cudnn'" in out
    with pytest.raises(SystemExit):
        info.main(["--head-dim", "0"])
    assert "--head-dim: expected a positive integer, got 0" in capsys.readouterr().err
