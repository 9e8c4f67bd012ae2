"""Progress without a terminal is plain lines at an interval; the run ends listing every file it wrote."""
import io
import json

import pytest

import train
from kernel_dispatch.training import config as tcfg
from kernel_dispatch.training import progress as progress_mod
from kernel_dispatch.training.progress import Progress
from tests.test_train import SMALL


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch):
    fake = FakeClock()
    monkeypatch.setattr(progress_mod.time, "monotonic", fake)
    return fake


def test_lines_every_interval_and_for_the_last_step(clock):
    out = io.StringIO()
    p = Progress(total=10, initial=0, enabled=True, interval=5.0, stream=out)
    for step in range(1, 11):
        clock.now = 2.0 * step  # a step every 2 s: lines at steps 3, 6, 9 (6 s, 12 s, 18 s) and the last one
        p.update(step, loss=5.0 - step / 10, tokens_per_s=1234.5)
    p.close()
    lines = out.getvalue().splitlines()
    assert "\r" not in out.getvalue()
    assert lines == ["step 3/10 (30%) | loss 4.700 | 1,234 tokens/s | 6s elapsed, ~14s left",
                     "step 6/10 (60%) | loss 4.400 | 1,234 tokens/s | 12s elapsed, ~8s left",
                     "step 9/10 (90%) | loss 4.100 | 1,234 tokens/s | 18s elapsed, ~2s left",
                     "step 10/10 (100%) | loss 4.000 | 1,234 tokens/s | 20s elapsed"]


def test_close_shows_the_last_step_of_a_run_that_stops_early(clock):
    out = io.StringIO()
    p = Progress(total=500, initial=100, enabled=True, interval=60.0, stream=out)
    clock.now = 130.0
    p.update(101, loss=2.0, tokens_per_s=10.0)
    clock.now = 150.0
    p.update(102, loss=1.9, tokens_per_s=10.0)  # 20 s after the last line: not shown yet
    assert len(out.getvalue().splitlines()) == 1
    p.close()
    assert out.getvalue().splitlines() == [
        "step 101/500 (20%) | loss 2.000 | 10 tokens/s | 2m10s elapsed, ~14h24m left",
        "step 102/500 (20%) | loss 1.900 | 10 tokens/s | 2m30s elapsed, ~8h17m left"]


def test_disabled_writes_nothing():
    out = io.StringIO()
    p = Progress(total=3, initial=0, enabled=False, interval=0.0, stream=out)
    p.update(1, 1.0, 1.0)
    p.close()
    assert out.getvalue() == ""


def test_terminal_gets_a_bar():
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    out = Terminal()
    p = Progress(total=3, initial=0, enabled=True, interval=0.0, stream=out)
    for step in (1, 2, 3):
        p.update(step, 1.0, 100.0)
    p.close()
    assert "\r" in out.getvalue() and "3/3" in out.getvalue() and "step 3/3 (100%)" not in out.getvalue()


def test_run_without_terminal_logs_lines_and_lists_its_files(tmp_path, capsys):
    cfg = tmp_path / "run.yaml"
    out_dir = tmp_path / "out"
    cfg.write_text(json.dumps(tcfg.apply_overrides(SMALL, [("train.out_dir", str(out_dir))])))
    assert train.main(["--config", str(cfg), "--train.progress=true", "--train.progress_interval=0",
                       "--train.plot=true", "--train.max_steps=3"]) == 0
    captured = capsys.readouterr()
    assert "\r" not in captured.err
    assert [line.split(" |")[0] for line in captured.err.splitlines()] == ["step 1/3 (33%)", "step 2/3 (66%)",
                                                                           "step 3/3 (100%)"]
    assert captured.out.splitlines()[-1] == \
        f"wrote {out_dir / 'ckpt.pt'}, {out_dir / 'loss.png'}, {out_dir / 'summary.json'}"
    assert sorted(p.name for p in out_dir.iterdir()) == ["ckpt.pt", "loss.png", "summary.json"]
