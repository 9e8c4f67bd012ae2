"""Checkpoints survive a kill during a save, and --resume refuses a checkpoint that cannot work, in one line."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import train
from kernel_dispatch.training import checkpoint, loop
from kernel_dispatch.training import config as tcfg
from tests.test_train import SMALL

REPO = Path(__file__).resolve().parents[1]

# Runs train.main with torch.save writing through a file that, from the second save on, creates a
# marker after its third write (the file then holds part of a checkpoint) and sleeps after every write.
WRITER = """
import sys, time
import torch
import train

marker, args = sys.argv[1], sys.argv[2:]
real_save, saves = torch.save, []


class SlowFile:
    def __init__(self, f):
        self.f, self.writes = f, 0

    def write(self, data):
        n = self.f.write(data)
        self.f.flush()
        self.writes += 1
        if self.writes == 3:
            open(marker, "w").close()
        time.sleep(0.2)
        return n

    def flush(self):
        self.f.flush()


def slow_save(obj, f, *args, **kwargs):
    saves.append(1)
    return real_save(obj, f if len(saves) == 1 else SlowFile(f), *args, **kwargs)


torch.save = slow_save
sys.exit(train.main(args))
"""


def write_config(tmp_path: Path, out_dir: Path, **train_keys) -> Path:
    data = tcfg.apply_overrides(SMALL, [("train.out_dir", str(out_dir)), ("train.threads", 1)]
                                + [(f"train.{k}", v) for k, v in train_keys.items()])
    path = tmp_path / f"{out_dir.name}.yaml"
    path.write_text(json.dumps(data))  # JSON is YAML
    return path


def test_kill_during_save_keeps_the_previous_checkpoint(tmp_path):
    """A writer SIGKILLed in the middle of its step-6 save leaves the step-3 ckpt.pt, and --resume finishes exactly."""
    full = loop.train(tcfg.load_run_config(str(write_config(tmp_path, tmp_path / "full", max_steps=6,
                                                                 ckpt_interval=3))))
    out = tmp_path / "cut"
    cfg_path = write_config(tmp_path, out, max_steps=6, ckpt_interval=3)
    marker = tmp_path / "saving"
    log = (tmp_path / "writer.log").open("w")
    child = subprocess.Popen([sys.executable, "-c", WRITER, str(marker), "--config", str(cfg_path)], cwd=REPO,
                             env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 300
    while not marker.exists() and child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert marker.exists(), f"the writer never reached its second save: {(tmp_path / 'writer.log').read_text()}"
    os.kill(child.pid, signal.SIGKILL)
    assert child.wait(timeout=60) == -signal.SIGKILL

    assert checkpoint.read(out / "ckpt.pt")["step"] == 3
    partial = out / "ckpt.pt.tmp"
    assert partial.stat().st_size > 0  # the kill hit a save that had begun writing
    with pytest.raises(Exception):
        torch.load(partial, weights_only=True)

    resumed = loop.train(tcfg.load_run_config(str(cfg_path)), resume="auto")
    assert resumed.history == full.history
    assert checkpoint.read(out / "ckpt.pt")["step"] == 6
    assert not partial.exists()


def test_failed_save_leaves_the_previous_checkpoint(tmp_path, monkeypatch):
    """An exception inside torch.save removes the temporary file and keeps ckpt.pt as it was."""
    cfg = tcfg.load_run_config(str(write_config(tmp_path, tmp_path / "run", max_steps=2)))
    loop.train(cfg)
    before = (tmp_path / "run" / "ckpt.pt").read_bytes()

    def broken_save(obj, f, *args, **kwargs):
        f.write(b"partial")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(checkpoint.torch, "save", broken_save)
    with pytest.raises(OSError, match="No space left"):
        loop.train(tcfg.load_run_config(str(write_config(tmp_path, tmp_path / "run", max_steps=4))), resume="auto")
    assert (tmp_path / "run" / "ckpt.pt").read_bytes() == before
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["ckpt.pt", "summary.json"]  # no ckpt.pt.tmp left


@pytest.fixture(scope="module")
def saved_run(tmp_path_factory):
    """A finished 2-step run's config file and out_dir (with ckpt.pt)."""
    tmp = tmp_path_factory.mktemp("saved")
    cfg_path = write_config(tmp, tmp / "run", max_steps=2, plot=False)
    loop.train(tcfg.load_run_config(str(cfg_path)))
    return cfg_path, tmp / "run"


def resume_error(capsys, cfg_path: Path, *args: str) -> str:
    """train.py's stderr for a --resume that must fail before any step: one line, exit status 2."""
    with pytest.raises(SystemExit) as exc:
        train.main(["--config", str(cfg_path), *args])
    assert exc.value.code == 2
    captured = capsys.readouterr()
    assert "eval loss" not in captured.out
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("train.py: error: --resume: "), captured.err
    return lines[0]


def test_resume_with_another_model_names_the_keys(saved_run, capsys):
    cfg_path, _ = saved_run
    line = resume_error(capsys, cfg_path, "--resume", "--model.dim=64", "--model.n_layers=2")
    assert line.endswith("holds a different model: model.dim: checkpoint 32, this run 64; "
                         "model.n_layers: checkpoint 1, this run 2")


@pytest.mark.parametrize("damage, reason", [
    (lambda b: b[:len(b) // 2], "truncated or corrupted (PytorchStreamReader failed reading zip archive"),
    (lambda b: b[:1000] + bytes(1000) + b[2000:], "truncated or corrupted ("),
    (lambda b: b"", "truncated or corrupted ("),
])
def test_resume_from_a_damaged_checkpoint_says_so(saved_run, tmp_path, capsys, damage, reason):
    cfg_path, out = saved_run
    bad = tmp_path / "ckpt.pt"
    bad.write_bytes(damage((out / "ckpt.pt").read_bytes()))
    line = resume_error(capsys, cfg_path, "--resume", str(bad))
    assert f"{str(bad)!r} is {reason}" in line


def test_resume_from_another_torch_file_says_so(saved_run, tmp_path, capsys):
    cfg_path, _ = saved_run
    other = tmp_path / "weights.pt"
    torch.save({"model": {}}, other)
    line = resume_error(capsys, cfg_path, "--resume", str(other))
    assert line.endswith("is not a checkpoint of train.py (no optimizer, rng, step, history, sampler, config)")
