"""Short CPU training runs: every backend that can run here agrees with golden; resume is exact; the CLI.

The model is small enough for the Triton interpreter (head_dim 16, n = 4, D = 32, L = 32).

Tolerances of the backend comparison, derived from tests/tolerances.py (fp32, the CPU run's dtype):
- Forward: a relative error e_i in the output of op call i moves the logits by about e_i relative
  (every op output reaches the logits through residual sums, RMSNorms and projections of gain ~1),
  and the cross-entropy moves by at most ||p - onehot|| * ||dlogits|| <= sqrt(2) * ||dlogits||;
  so |dL_k| <= C * F * L_k with F = sum of the fp32 forward tolerances of every op call in one
  forward pass and C = 4 (propagation gain and the sqrt(2), rounded up).
- Training: AdamW normalises each gradient element, so a relative gradient error g turns into the
  same relative error of the update; its effect on the next loss is at most g times the loss change
  that update made. Summed over steps: + C * G * sum_{j<k} |L_{j+1} - L_j|, with G the sum of the
  fp32 gradient tolerances of every op call in one backward pass (an upper bound of the max).
- First-step gradients of every parameter: relative error <= C * (F + G) (forward errors reach the
  gradients through the saved activations, backward errors directly).
In practice (Triton interpreter vs golden, 1 layer) the losses agree to the last fp32 bit and the
gradients to ~1e-5 relative, against bounds of ~1.4e-3 absolute and ~2.2e-3 relative.
"""
import json
import math

import pytest
import torch
import torch.nn.functional as F
import yaml

import kernel_dispatch as kd
from kernel_dispatch import registry
from kernel_dispatch.ops.lazy_attention import lazy_attention_meta
from kernel_dispatch.training import config as tcfg
from kernel_dispatch.training import loop
from kernel_dispatch.training.model import LazyLM
from tests.tolerances import TABLE, rel_err, tolerance

SMALL = {
    "model": {"dim": 32, "n_layers": 1, "n_heads": 2, "n_kv_heads": 1, "n_streams": 4, "max_bias_length": 32},
    "data": {"seq_len": 32},
    "train": {"batch_size": 2, "max_steps": 3, "eval_interval": 100, "eval_batches": 1, "warmup_steps": 2,
              "device": "cpu", "progress": False, "plot": False},
}
GRADIENTS = {"lazy_attention": ("dq", "dk", "dv", "dbias", "dtau"),
             "mhc_pre": ("dx", "dphi", "dalpha", "dbias", "dgamma"), "mhc_post": ("df", "dx", "dh_post", "dh_res")}
OUTPUTS = {"lazy_attention": ("o",), "mhc_pre": ("h_in", "h_post", "h_res"), "mhc_post": ("out",)}


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py


def small_config(tmp_path, **train) -> tcfg.RunConfig:
    overrides = [("train.out_dir", str(tmp_path))] + [(f"train.{k}", v) for k, v in train.items()]
    data = tcfg.apply_overrides(SMALL, overrides)
    return tcfg.from_mapping(data, "test config")


def op_calls(cfg: tcfg.RunConfig) -> dict:
    """How many times one forward pass calls each operator."""
    n = cfg.model.n_layers
    return {"lazy_attention": n, "mhc_pre": 2 * n, "mhc_post": 2 * n}


C = 4.0  # propagation gain of an op's relative error to the logits and loss, rounded up (see above)


def forward_backward_tolerances(cfg: tcfg.RunConfig) -> tuple[float, float]:
    """(F, G): sums of the fp32 output and gradient tolerances of every op call of one step."""
    calls = op_calls(cfg)
    assert all(set(OUTPUTS[op] + GRADIENTS[op]) == set(TABLE[op]) for op in calls)
    F_tol = sum(calls[op] * tolerance(op, torch.float32, t) for op in calls for t in OUTPUTS[op])
    G_tol = sum(calls[op] * tolerance(op, torch.float32, t) for op in calls for t in GRADIENTS[op])
    return F_tol, G_tol


def loss_tolerances(cfg: tcfg.RunConfig, losses: list[float]) -> list[float]:
    """The bound on |L_k(backend) - L_k(golden)| for each step k (see the module docstring)."""
    F_tol, G_tol = forward_backward_tolerances(cfg)
    out, drift = [], 0.0
    for k, loss in enumerate(losses):
        out.append(C * F_tol * abs(loss) + C * G_tol * drift)
        if k + 1 < len(losses):
            drift += abs(losses[k + 1] - loss)
    return out


def _meta(cfg: tcfg.RunConfig) -> dict:
    """The registry meta of each operator call of the model, built as the ops build it."""
    m = cfg.model
    hd = m.dim // m.n_heads
    q, k = torch.zeros(1, m.n_heads, 1, hd), torch.zeros(1, m.n_kv_heads, 1, hd)
    mhc = {"device": "cpu", "dtype": torch.float32, "n": m.n_streams, "D": m.dim}  # ops/mhc_pre.py, ops/mhc_post.py
    return {"lazy_attention": lazy_attention_meta(q, k, torch.zeros(m.n_heads, m.max_bias_length), None, True),
            "mhc_pre": mhc, "mhc_post": mhc}


def first_gradients(cfg: tcfg.RunConfig, backend: str) -> dict:
    """Every parameter's gradient of the loss on one batch, from a fresh model, through ``backend``."""
    torch.manual_seed(0)
    model = LazyLM(cfg.model)
    gen = torch.Generator().manual_seed(1)
    x, y = (torch.randint(0, 256, (2, cfg.data.seq_len), generator=gen) for _ in range(2))
    with kd.use_backend(backend):
        F.cross_entropy(model(x).flatten(0, 1), y.flatten()).backward()
    return {name: p.grad for name, p in model.named_parameters()}


@pytest.mark.parametrize("backend", kd.BACKEND_NAMES)
def test_backend_training_matches_golden(backend, tmp_path):
    """First-step gradients of every parameter, then the losses of 3 training steps, against golden."""
    cfg = small_config(tmp_path / "golden")
    reasons = {op: registry.why_not(op, backend, meta) for op, meta in _meta(cfg).items()}
    if any(reasons.values()):
        pytest.skip(f"{backend} cannot run this model here: "
                    + "; ".join(f"{op}: {', '.join(r)}" for op, r in reasons.items() if r))
    F_tol, G_tol = forward_backward_tolerances(cfg)
    ref, got = first_gradients(cfg, "golden"), first_gradients(cfg, backend)
    for name, g in ref.items():
        err = rel_err(got[name], g)
        assert err <= C * (F_tol + G_tol), f"gradient of {name}: relative error {err:.3g} > {C * (F_tol + G_tol):.3g}"

    registry.set_yaml_backend("golden", "test")
    golden = [loss for _, loss in loop.train(cfg).history["train"]]
    assert all(map(math.isfinite, golden))
    registry.set_yaml_backend(backend, "test")
    result = loop.train(small_config(tmp_path / backend))
    assert all(f"-> {backend} (from test)" in line for line in result.summary["backends"])
    losses = [loss for _, loss in result.history["train"]]
    for k, (a, b, tol) in enumerate(zip(losses, golden, loss_tolerances(cfg, golden))):
        assert abs(a - b) <= tol, f"step {k + 1}: {backend} loss {a!r} vs golden {b!r}, |diff| > {tol:.3g}"


def test_resume_continues_exactly(tmp_path, monkeypatch):
    """Crash right after the checkpoint at step 3 of 6, resume: losses 4..6 equal the uninterrupted run's."""
    registry.set_yaml_backend("golden", "test")
    full = loop.train(small_config(tmp_path / "full", max_steps=6, ckpt_interval=3))

    class Crash(Exception):
        pass

    real_save = loop.checkpoint.save

    def save_then_crash(path, *args, step, **kwargs):
        real_save(path, *args, step=step, **kwargs)
        if step == 3:
            raise Crash

    monkeypatch.setattr(loop.checkpoint, "save", save_then_crash)
    cut = small_config(tmp_path / "cut", max_steps=6, ckpt_interval=3)
    with pytest.raises(Crash):
        loop.train(cut)
    monkeypatch.setattr(loop.checkpoint, "save", real_save)
    resumed = loop.train(cut, resume="auto")
    assert [s for s, _ in resumed.history["train"]] == list(range(1, 7))
    assert resumed.history["train"] == full.history["train"]
    assert resumed.history["eval"] == full.history["eval"]
    for (name, a), b in zip(full.model.state_dict().items(), resumed.model.state_dict().values()):
        assert torch.equal(a, b), name


def test_cli_trains_writes_outputs_and_names_backends(tmp_path, capsys):
    import train

    cfg = tmp_path / "run.yaml"
    backend = {"lazy_attention": "golden", "mhc": {"forward": "auto", "backward": "golden"}}
    cfg.write_text(yaml.safe_dump({"backend": backend, **SMALL}))
    assert train.main(["--config", str(cfg), f"--train.out_dir={tmp_path / 'out'}", "--train.max_steps", "4",
                       "--train.eval_interval=2", "--train.plot=true"]) == 0
    out = capsys.readouterr().out
    src = f"YAML {cfg}"
    assert (f"backends: lazy_attention=golden (from {src}), mhc_pre=golden (partly auto, from {src}), "
            f"mhc_post=golden (partly auto, from {src})") in out
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["steps"] == 4 and summary["final_eval_loss"] < summary["initial_eval_loss"]
    assert (tmp_path / "out" / "loss.png").stat().st_size > 1000
    assert (tmp_path / "out" / "ckpt.pt").is_file()


def test_environment_beats_yaml(tmp_path, monkeypatch, capsys):
    """YAML asks for tilelang (cannot run on CPU); KERNEL_BACKEND=golden wins and the start line says so."""
    import train

    cfg = tmp_path / "run.yaml"
    cfg.write_text("backend: tilelang\n")
    monkeypatch.setenv("KERNEL_BACKEND", "golden")
    overrides = [f"--{k}.{kk}={json.dumps(vv)}" for k, sec in SMALL.items() for kk, vv in sec.items()]
    assert train.main(["--config", str(cfg), *overrides, f"--train.out_dir={tmp_path}", "--train.max_steps=1"]) == 0
    assert "lazy_attention=golden (from environment KERNEL_BACKEND)" in capsys.readouterr().out


@pytest.mark.parametrize("args, message", [
    (["--train.max_step=5"], "unknown key(s) ['max_step']"),
    (["--trian.max_steps=5"], "unknown key(s) ['trian']"),
    (["--backend=trion"], "unknown backend 'trion'"),
    (["--backend.flash=golden"], "unknown operator key(s) ['flash']"),
    (["--train.dtype=float8"], "train.dtype: expected one of float32, bfloat16"),
])
def test_cli_rejects_unknown_keys_and_names(args, message, capsys):
    import train

    with pytest.raises(SystemExit) as exc:
        train.main(["--config", "configs/tiny.yaml", *args])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("text, expected", [
    ("backend: golden", {op: ("golden", "golden") for op in kd.OPERATORS}),
    ("backend: {lazy_attention: golden, mhc: triton}",
     {"lazy_attention": ("golden", "golden"), "mhc_pre": ("triton", "triton"), "mhc_post": ("triton", "triton")}),
    ("backend: {forward: triton, backward: golden}", {op: ("triton", "golden") for op in kd.OPERATORS}),
    ("backend: {default: golden, mhc_post: {forward: tilelang}}",
     {"lazy_attention": ("golden", "golden"), "mhc_pre": ("golden", "golden"), "mhc_post": ("tilelang", "auto")}),
])
def test_yaml_backend_forms(text, expected, tmp_path):
    cfg = tmp_path / "b.yaml"
    cfg.write_text(text + "\n")
    tcfg.load_run_config(str(cfg))
    for op, choice in expected.items():
        assert registry.current_choice(op) == (choice, f"YAML {cfg}")


def test_command_line_backend_override_keeps_the_rest(tmp_path):
    cfg = tmp_path / "b.yaml"
    cfg.write_text("backend: {forward: golden, backward: auto}\n")
    tcfg.load_run_config(str(cfg), ["--backend.lazy_attention=triton"])
    source = f"YAML {cfg} (backend overridden on the command line)"
    assert registry.current_choice("lazy_attention") == (("triton", "triton"), source)
    assert registry.current_choice("mhc_pre") == (("golden", "auto"), source)


def test_yaml_unknown_backend_is_an_error(tmp_path):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("backend:\n  mhc: {forward: triton, backward: goldn}\n")
    with pytest.raises(kd.ConfigError, match="goldn"):
        tcfg.load_run_config(str(cfg))


def test_defaults_equal_tiny_yaml():
    tiny = tcfg.load_run_config("configs/tiny.yaml")
    assert tiny == tcfg.load_run_config(None, ["--backend=auto", "--train.threads=1"])


def test_shipped_configs_load():
    for name in ("tiny", "gpu-small", "gpu-ddp"):
        cfg = tcfg.load_run_config(f"configs/{name}.yaml")
        assert cfg.model.dim % cfg.model.n_heads == 0


@pytest.mark.parametrize("train, message", [
    ({"cuda_graph": True, "compile": True}, "train.cuda_graph: cannot be combined with train.compile"),
    ({"cuda_graph": True, "device": "cpu"}, "train.cuda_graph: needs train.device cuda"),
])
def test_cuda_graph_config_errors(train, message, tmp_path):
    with pytest.raises(kd.ConfigError, match=message.replace(".", r"\.")):
        small_config(tmp_path, **train)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error a machine without CUDA gives")
def test_cuda_graph_needs_cuda_at_run_time(tmp_path):
    cfg = small_config(tmp_path, device="auto", cuda_graph=True)
    with pytest.raises(kd.ConfigError, match="train.cuda_graph: needs a CUDA device, got cpu"):
        loop.train(cfg)


def test_cuda_graph_one_process_only(tmp_path):
    import types

    cfg = small_config(tmp_path, device="auto", cuda_graph=True)
    env = types.SimpleNamespace(device=torch.device("cuda"), distributed=True)
    with pytest.raises(kd.ConfigError, match="train.cuda_graph: one process only"):
        loop._check_cuda_graph(cfg, env)
