"""The run configuration of train.py: dataclasses, YAML loading and command-line overrides.

A config file is YAML with the sections ``model``, ``data``, ``train`` and the key ``backend``
(read by :mod:`kernel_dispatch.config`). Overrides are ``--section.key=value`` (or
``--section.key value``) arguments; values are parsed as YAML scalars. Unknown keys, in the file
or in an override, are errors naming the key.
"""
import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any, Sequence

import yaml

from .. import registry
from ..config import ConfigError, dataclass_from_dict, load_yaml


@dataclass
class ModelConfig:
    """The decoder-only language model (see :mod:`kernel_dispatch.training.model`)."""

    vocab_size: int = 256
    dim: int = 64
    n_layers: int = 2
    n_heads: int = 4
    n_kv_heads: int = 2
    mlp_hidden: int = 0  # 0: 8/3 * dim rounded up to a multiple of 8
    n_streams: int = 4
    max_bias_length: int = 64
    rope_base: float = 10000.0
    tau_init: float = -1.0
    sinkhorn_iters: int = 20
    mhc_alpha_init: float = 0.01
    mhc_res_diag: float = 8.0
    init_std: float = 0.02


@dataclass
class DataConfig:
    """The byte-level corpus: a text file, windows of ``seq_len`` bytes, the last fraction held out."""

    path: str = "data/austen.txt"
    seq_len: int = 64
    val_fraction: float = 0.05
    pack: bool = False  # pack the chapters into each step's batch_size * seq_len tokens (see training/data.py)


@dataclass
class TrainConfig:
    """Optimisation, evaluation, checkpoints and the execution set-up."""

    batch_size: int = 16  # sequences per rank and step
    max_steps: int = 300
    lr: float = 3e-3
    min_lr: float = 3e-4
    warmup_steps: int = 20
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    eval_interval: int = 50
    eval_batches: int = 8  # batches of batch_size sequences, split across ranks
    ckpt_interval: int = 0  # 0: a checkpoint at the end only
    out_dir: str = "runs/tiny"
    seed: int = 1337
    device: str = "auto"  # auto | cpu | cuda
    threads: int = 0  # CPU threads of torch (torch.set_num_threads); 0: torch's default
    dtype: str = "float32"  # float32 | bfloat16 (autocast around matmuls, bf16 activations)
    dist: str = "ddp"  # under torchrun: ddp | fsdp2
    compile: bool = False
    cuda_graph: bool = False  # capture each step's forward+backward in a CUDA graph (one CUDA process)
    mhc_recompute: bool = False  # rebuild the mHC streams in the backward (kernel_dispatch/mhc_recompute.py)
    mhc_recompute_block: int = 0  # mHC wrappers per recompute block; 0: sqrt(n * 2 n_layers / (n + 2))
    progress: bool = True  # the tqdm bar (rank 0)
    plot: bool = True  # loss.png in out_dir at the end


@dataclass
class RunConfig:
    """Everything one run needs; ``backend`` is the YAML ``backend:`` value (see DESIGN.md)."""

    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    backend: Any = None


_CHOICES = {"train.device": ("auto", "cpu", "cuda"), "train.dtype": ("float32", "bfloat16"),
            "train.dist": ("ddp", "fsdp2")}
_POSITIVE = ("model.dim", "model.n_layers", "model.n_heads", "model.n_kv_heads", "model.n_streams",
             "model.max_bias_length", "model.sinkhorn_iters", "data.seq_len", "train.batch_size",
             "train.eval_interval", "train.eval_batches")


def validate(cfg: RunConfig) -> None:
    """Raise ConfigError naming the first key whose value cannot work."""
    for key, allowed in _CHOICES.items():
        value = _get(cfg, key)
        if value not in allowed:
            raise ConfigError(f"{key}: expected one of {', '.join(allowed)}, got {value!r}")
    for key in _POSITIVE:
        if _get(cfg, key) < 1:
            raise ConfigError(f"{key}: expected an integer >= 1, got {_get(cfg, key)!r}")
    m = cfg.model
    if m.n_heads % m.n_kv_heads:
        raise ConfigError(f"model.n_kv_heads: expected a divisor of model.n_heads = {m.n_heads}, got {m.n_kv_heads}")
    if m.dim % m.n_heads or (m.dim // m.n_heads) % 2:
        raise ConfigError(f"model.dim: expected a multiple of model.n_heads = {m.n_heads} with an even head "
                          f"dimension, got {m.dim}")
    if m.vocab_size != 256:
        raise ConfigError(f"model.vocab_size: the corpus is read as bytes, expected 256, got {m.vocab_size}")
    if not 0 < cfg.data.val_fraction < 1:
        raise ConfigError(f"data.val_fraction: expected a number in (0, 1), got {cfg.data.val_fraction!r}")
    if cfg.train.threads < 0:
        raise ConfigError(f"train.threads: expected >= 0 (0: torch's default), got {cfg.train.threads}")
    if cfg.train.max_steps < 0:
        raise ConfigError(f"train.max_steps: expected >= 0, got {cfg.train.max_steps}")
    if cfg.train.cuda_graph and cfg.train.compile:
        raise ConfigError("train.cuda_graph: cannot be combined with train.compile (capture the eager model; "
                          "torch.compile(mode='reduce-overhead') is the compiled form)")
    if cfg.train.cuda_graph and cfg.train.device == "cpu":
        raise ConfigError("train.cuda_graph: needs train.device cuda (or auto on a CUDA machine), got cpu")
    _validate_pack_and_recompute(cfg)


def _validate_pack_and_recompute(cfg: RunConfig) -> None:
    tc = cfg.train
    if cfg.data.pack and tc.cuda_graph:
        raise ConfigError("data.pack: cannot be combined with train.cuda_graph (the document boundaries change "
                          "every step; a captured step has fixed inputs)")
    if tc.mhc_recompute_block < 0:
        raise ConfigError(f"train.mhc_recompute_block: expected >= 0 (0: the paper's optimum), got "
                          f"{tc.mhc_recompute_block}")
    if tc.mhc_recompute and (tc.compile or tc.cuda_graph):
        other = "compile" if tc.compile else "cuda_graph"
        raise ConfigError(f"train.mhc_recompute: cannot be combined with train.{other} (its saved-tensor hooks "
                          "run in eager autograd only)")


def _get(cfg: RunConfig, dotted: str):
    section, key = dotted.split(".")
    return getattr(getattr(cfg, section), key)


def parse_overrides(args: Sequence[str]) -> list[tuple[str, Any]]:
    """``["--train.max_steps=50", "--backend", "golden"]`` -> [("train.max_steps", 50), ("backend", "golden")]."""
    out, i = [], 0
    while i < len(args):
        arg = args[i]
        if not arg.startswith("--") or len(arg) == 2:
            raise ConfigError(f"override {arg!r}: expected --section.key=value")
        key, eq, raw = arg[2:].partition("=")
        if not eq:
            if i + 1 >= len(args):
                raise ConfigError(f"override --{key}: missing a value (write --{key}=VALUE)")
            raw, i = args[i + 1], i + 1
        out.append((key, yaml.safe_load(raw) if raw != "" else None))
        i += 1
    return out


def apply_overrides(data: dict, overrides: Sequence[tuple[str, Any]]) -> dict:
    """A copy of the mapping ``data`` with each dotted key set; intermediate mappings are created.

    ``backend.<operator>`` on a backend given as one choice keeps that choice as ``default``.
    """
    data = _deepcopy(data)
    for dotted, value in overrides:
        node, parts = data, dotted.split(".")
        for depth, part in enumerate(parts[:-1]):
            child = node.setdefault(part, {})
            if depth == 0 and part == "backend" and not _per_operator(child):
                child = node["backend"] = {} if child in (None, {}) else {"default": child}
            if not isinstance(child, dict):
                raise ConfigError(f"override --{dotted}: {'.'.join(parts[:depth + 1])} is not a section")
            node = child
        node[parts[-1]] = value
    return data


def _per_operator(value: Any) -> bool:
    """Whether a YAML backend value is already a per-operator mapping."""
    return isinstance(value, dict) and not set(value) <= {"forward", "backward"}


def _deepcopy(d: Any) -> Any:
    return {k: _deepcopy(v) for k, v in d.items()} if isinstance(d, dict) else d


def from_mapping(data: dict, where: str) -> RunConfig:
    """A validated RunConfig from a mapping; unknown keys raise ConfigError naming them."""
    cfg = dataclass_from_dict(RunConfig, data, where)
    validate(cfg)
    return cfg


def load_run_config(path: str | None, overrides: Sequence[str] = ()) -> RunConfig:
    """Read ``path`` (or defaults if None), apply command-line overrides, and install its backend choice.

    The ``backend:`` value is installed with :func:`kernel_dispatch.set_yaml_backend`, its source
    naming the file (and the command line when an override changed it); environment variables
    still win over it.
    """
    data = load_yaml(path) if path else {}
    parsed = parse_overrides(overrides)
    merged = apply_overrides(data, parsed)
    where = os.fspath(path) if path else "defaults"
    cfg = from_mapping(merged, f"{where}{' + command line' if parsed else ''}: config")
    source = f"YAML {where}" if path else "command line"
    if any(k == "backend" or k.startswith("backend.") for k, _ in parsed):
        source += " (backend overridden on the command line)" if path else ""
    registry.set_yaml_backend(cfg.backend, source)
    return cfg


def to_dict(cfg: RunConfig) -> dict:
    """The config as a plain mapping (for checkpoints and summaries)."""
    return dataclasses.asdict(cfg)
