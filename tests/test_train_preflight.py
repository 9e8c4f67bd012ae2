"""train.py stops before its first step, with one line naming the key, on anything that cannot work.

Values no run can use, a missing or malformed --config file, an empty or too small data file, an
unwritable out_dir, a batch that cannot fit in memory, a backend that cannot run: each exits with
status 2 and ``train.py: error: <key>: ...`` alone on stderr, before the first evaluation.
"""
import json
import math

import pytest
import torch

import train
from kernel_dispatch.training import config as tcfg
from kernel_dispatch.training import resources
from kernel_dispatch.training.model import LazyLM
from tests.test_train import SMALL


@pytest.fixture
def run_yaml(tmp_path):
    """The small test config as a file, writing into tmp_path/out."""
    path = tmp_path / "run.yaml"
    path.write_text(json.dumps(tcfg.apply_overrides(SMALL, [("train.out_dir", str(tmp_path / "out"))])))
    return path


def error_line(capsys, *args: str) -> str:
    """The one line train.py writes on stderr when it refuses ``args``; asserts no evaluation or step ran."""
    with pytest.raises(SystemExit) as exc:
        train.main(list(args))
    assert exc.value.code == 2
    captured = capsys.readouterr()
    assert "eval loss" not in captured.out
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("train.py: error: "), captured.err
    return lines[0].removeprefix("train.py: error: ")


@pytest.mark.parametrize("override, message", [
    ("--train.lr=0", "train.lr: expected a number > 0, got 0.0"),
    ("--train.lr=-1e-3", "train.lr: expected a number > 0, got -0.001"),
    ("--train.lr=.nan", "train.lr: expected a finite number, got nan"),
    ("--train.lr=nan", "train.lr: expected a finite number, got nan"),
    ("--train.grad_clip=.inf", "train.grad_clip: expected a finite number, got inf"),
    ("--train.beta1=1", "train.beta1: expected a number in [0, 1), got 1.0"),
    ("--train.beta2=-0.5", "train.beta2: expected a number in [0, 1), got -0.5"),
    ("--train.min_lr=0.1", "train.min_lr: expected at most train.lr = 0.003, got 0.1"),
    ("--train.min_lr=-1e-4", "train.min_lr: expected a number >= 0, got -0.0001"),
    ("--train.warmup_steps=-1", "train.warmup_steps: expected an integer >= 0, got -1"),
    ("--train.weight_decay=-0.1", "train.weight_decay: expected a number >= 0, got -0.1"),
    ("--train.grad_clip=-1", "train.grad_clip: expected a number >= 0 (0: no clipping), got -1.0"),
    ("--train.ckpt_interval=-5", "train.ckpt_interval: expected an integer >= 0, got -5"),
    ("--train.progress_interval=-1", "train.progress_interval: expected a number of seconds >= 0, got -1.0"),
    ("--model.dim=64.7", "model.dim: expected an integer, got 64.7"),
    ("--train.batch_size=2.5", "train.batch_size: expected an integer, got 2.5"),
    ("--train.max_steps=true", "train.max_steps: expected a number, got True"),
    ("--train.lr=[0.1]", "train.lr: expected a single value, got [0.1]"),
    ("--model.mlp_hidden=-8", "model.mlp_hidden: expected an integer >= 0, got -8"),
    ("--model.init_std=0", "model.init_std: expected a number > 0, got 0.0"),
    ("--data.path=", "data.path: expected a string, got no value"),
    ("--data.path=''", "data.path: expected a file path, got ''"),
    ("--train.out_dir=", "train.out_dir: expected a string, got no value"),
    ("--train.batch_size=", "train.batch_size: expected an integer, got no value"),
])
def test_bad_values_are_refused(run_yaml, capsys, override, message):
    assert error_line(capsys, "--config", str(run_yaml), override) == message


def test_integral_floats_are_integers(run_yaml):
    cfg = tcfg.load_run_config(str(run_yaml), ["--model.dim=64.0"])
    assert cfg.model.dim == 64 and isinstance(cfg.model.dim, int)


def test_missing_config_file(capsys, tmp_path):
    assert error_line(capsys, "--config", str(tmp_path / "nope.yaml")) == f"--config: {tmp_path / 'nope.yaml'}: no such file"


@pytest.mark.parametrize("text, where, problem", [
    ("model:\n  dim: 64\n  n_layers: [1,\ntrain:\n  lr: 1\n", "5:5",
     "while parsing a flow sequence started at line 3; expected ',' or ']', but got ':'"),
    ("model:\n\tdim: 64\n", "2:1", "found character '\\t' that cannot start any token"),
    ("train: batch_size: 4\n", "1:18", "mapping values are not allowed here"),
])
def test_malformed_yaml_names_file_and_line(capsys, tmp_path, text, where, problem):
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    line = error_line(capsys, "--config", str(bad))
    assert line.startswith(f"--config: {bad}:{where}: malformed YAML: ") and line.endswith(problem)


def test_yaml_that_is_not_a_mapping(capsys, tmp_path):
    bad = tmp_path / "list.yaml"
    bad.write_text("- 1\n- 2\n")
    assert error_line(capsys, "--config", str(bad)) == f"--config: {bad}: expected a mapping at the top level, got list"


def test_empty_data_file(run_yaml, capsys, tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    assert error_line(capsys, "--config", str(run_yaml), f"--data.path={empty}") == f"data.path: {str(empty)!r} is empty"


def test_batch_larger_than_the_data(run_yaml, capsys, tmp_path):
    """10,000 bytes hold 293 windows of 32 bytes at the largest epoch offset; 294 sequences cannot be drawn."""
    small = tmp_path / "small.txt"
    small.write_bytes(bytes(range(256)) * 40)  # 10,240 bytes, 9,728 of them for training
    assert len(range(31, 9728 - 32, 32)) == 303
    line = error_line(capsys, "--config", str(run_yaml), f"--data.path={small}", "--train.batch_size=304")
    assert line.startswith("train.batch_size: expected at most 303, the windows of data.seq_len = 32 bytes")
    assert line.endswith("got 304")


@pytest.mark.parametrize("out_dir", ["{file}/sub", "{file}"])
def test_unwritable_out_dir(run_yaml, capsys, tmp_path, out_dir):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    out = out_dir.format(file=blocker)
    line = error_line(capsys, "--config", str(run_yaml), f"--train.out_dir={out}")
    assert line.startswith(f"train.out_dir: cannot write to {out!r}: ")


@pytest.mark.skipif(not resources.available_bytes(torch.device("cpu")), reason="no /proc/meminfo to read")
def test_oversized_batch_is_caught_before_the_first_evaluation(run_yaml, capsys):
    """10^8 sequences need terabytes: the memory estimate refuses them before data or model exist."""
    line = error_line(capsys, "--config", str(run_yaml), "--train.batch_size=100000000")
    assert line.startswith("train.batch_size: 100,000,000 sequences of data.seq_len = 32 need about ")
    assert "GiB for one step on cpu (golden attention" in line and "fit" in line


def test_unavailable_backend(run_yaml, capsys):
    line = error_line(capsys, "--config", str(run_yaml), "--backend=tilelang")
    assert line.startswith("backend: lazy_attention: backend 'tilelang' (from YAML ")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error of a machine without CUDA")
def test_unavailable_device(run_yaml, capsys):
    assert error_line(capsys, "--config", str(run_yaml), "--train.device=cuda") == \
        "train.device: 'cuda' was asked for but torch sees no CUDA device"


def test_step_estimate_counts_the_real_parameters_and_golden_scores(run_yaml):
    """16 bytes per parameter of the built model; golden adds nine fp32 [H, L, L] tensors per sequence."""
    for dims in ([], ["--model.dim=96", "--model.n_heads=6", "--model.n_kv_heads=3", "--model.n_layers=3",
                      "--model.n_streams=2", "--model.mlp_hidden=200", "--model.max_bias_length=17"]):
        cfg = tcfg.load_run_config(str(run_yaml), dims)
        fixed, per_seq = resources.step_bytes(cfg, "golden")
        assert fixed == 16 * sum(p.numel() for p in LazyLM(cfg.model).parameters())
        fixed_t, per_seq_t = resources.step_bytes(cfg, "triton")
        assert fixed_t == fixed
        assert per_seq - per_seq_t == 9 * 4 * cfg.model.n_heads * cfg.data.seq_len ** 2


def test_memory_check_refuses_exactly_past_the_estimate(run_yaml, monkeypatch):
    cfg = tcfg.load_run_config(str(run_yaml))
    fixed, per_seq = resources.step_bytes(cfg, "golden")
    free = fixed + 1000 * per_seq + per_seq // 2
    monkeypatch.setattr(resources, "available_bytes", lambda device: free)
    resources.check_memory(tcfg.load_run_config(str(run_yaml), ["--train.batch_size=1000"]),
                           torch.device("cpu"), "golden")
    with pytest.raises(tcfg.ConfigError, match=r"^train\.batch_size: 1,001 sequences .* at most about 1,000 fit$"):
        resources.check_memory(tcfg.load_run_config(str(run_yaml), ["--train.batch_size=1001"]),
                               torch.device("cpu"), "golden")
    monkeypatch.setattr(resources, "available_bytes", lambda device: None)  # unknown: no check
    resources.check_memory(tcfg.load_run_config(str(run_yaml), ["--train.batch_size=100000000"]),
                           torch.device("cpu"), "golden")


@pytest.mark.skipif(not resources.available_bytes(torch.device("cpu")), reason="no /proc/meminfo to read")
def test_cpu_memory_is_shared_by_the_local_ranks(monkeypatch):
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    one = resources.available_bytes(torch.device("cpu"))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    four = resources.available_bytes(torch.device("cpu"))
    assert math.isclose(four, one / 4, rel_tol=0.05)  # MemAvailable moves a little between the two reads


def test_a_problem_on_any_rank_stops_every_rank(run_yaml, monkeypatch):
    """Rank 0 finds nothing wrong but rank 1 does: rank 0 raises rank 1's error too (no rank waits alone)."""
    from kernel_dispatch.training import loop
    from kernel_dispatch.training.distributed import DistEnv

    cfg = tcfg.load_run_config(str(run_yaml))
    env = DistEnv(rank=0, world=2, local_rank=0, device=torch.device("cpu"))
    monkeypatch.setattr(loop.distributed, "gather_objects", lambda obj, env: [obj, "train.batch_size: rank 1's"])
    with pytest.raises(tcfg.ConfigError, match="^train.batch_size: rank 1's$"):
        loop._check_machine(cfg, env, "golden")
