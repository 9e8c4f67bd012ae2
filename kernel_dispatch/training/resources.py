"""What a run needs from the machine, checked before it reads data or builds the model.

- ``train.out_dir`` must be a directory this process can create and write (rank 0 writes there).
- One training step must fit in the device's available memory. :func:`step_bytes` estimates the
  peak from the config (below); :func:`available_bytes` reads what the device has free. The
  estimate is rough: it exists to turn a batch size that cannot fit into an error before the first
  step, not to predict the peak exactly. On CPU (configs/tiny.yaml with batch_size 8-256, seq_len
  64-1024, dim 64-256, 1-4 layers, golden attention) it lands within 0.7x-1.3x of the measured rise
  of the peak resident set during two steps.

The estimate, in bytes, for T = batch_size * seq_len tokens per rank:

    16 P                                      fp32 parameters, gradients and AdamW's two moments
  + 1.5 * 4 T (N ((3n + 12) D + 4F) + 4D + 3V)
        activations autograd keeps, per layer: n streams of width D and about 12 D-wide tensors (norms,
        q/k/v, RoPE, attention output, projections) and 4 SwiGLU-wide ones (F: its hidden width); outside
        the layers: embedding and final norm, the logits, their log-softmax and gradient (V: vocab_size);
        times 1.5 for the activation gradients of the backward and the allocator's slack
  + 9 * 4 B H L^2                             golden lazy attention only: its forward and backward hold up
                                              to nine [B, H, L, L] fp32 score-sized tensors at once, one
                                              layer at a time (Triton and TileLang keep scores on chip)

with every element counted at 4 bytes whatever ``train.dtype`` (bf16 runs keep part of their
activations in fp32), P the parameter count, N layers, n streams, D = model.dim, H heads, L = seq_len.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

import torch

from ..config import ConfigError
from .config import RunConfig
from .model import mlp_hidden

_GiB = 2**30


def step_bytes(cfg: RunConfig, attention_backend: str) -> tuple[int, int]:
    """(fixed bytes, bytes per sequence of the batch) of one training step on one rank (module docstring).

    ``attention_backend``: the backend of lazy attention's forward (``golden`` holds [B, H, L, L]
    scores). The step's estimate at batch size B is ``fixed + B * per_sequence``.
    """
    m, L = cfg.model, cfg.data.seq_len
    D, n, N, V, F = m.dim, m.n_streams, m.n_layers, m.vocab_size, mlp_hidden(m)
    hd, W = D // m.n_heads, m.max_bias_length
    M = n * n + 2 * n  # mHC's mixing coefficients per token
    per_layer_params = (2 * D  # the two RMSNorm gains
                        + D * (m.n_heads + 2 * m.n_kv_heads) * hd + D * D + m.n_heads * (W + 1)  # attention
                        + 3 * D * F  # SwiGLU
                        + 2 * (M * n * D + 3 + M + n * D))  # two mHC wrappers
    params = 2 * V * D + D + N * per_layer_params
    per_token = 4 * (N * ((3 * n + 12) * D + 4 * F) + 4 * D + 3 * V)
    scores = 9 * 4 * m.n_heads * L * L if attention_backend == "golden" else 0
    return 16 * params, 3 * L * per_token // 2 + scores


def available_bytes(device: torch.device) -> int | None:
    """Memory free for this process on ``device``, or None where it cannot be read.

    CUDA: the free memory of the device (torch.cuda.mem_get_info). CPU: MemAvailable of
    /proc/meminfo (Linux only), shared by the LOCAL_WORLD_SIZE ranks torchrun starts on this host.
    """
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        meminfo = Path("/proc/meminfo").read_text()
    except OSError:
        return None
    for line in meminfo.splitlines():
        if line.startswith("MemAvailable:"):
            kib = int(line.split()[1])
            return kib * 1024 // max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    return None


def check_memory(cfg: RunConfig, device: torch.device, attention_backend: str) -> None:
    """Raise ConfigError naming train.batch_size when the step's estimate exceeds the available memory."""
    free = available_bytes(device)
    if free is None:
        return
    fixed, per_sequence = step_bytes(cfg, attention_backend)
    need = fixed + cfg.train.batch_size * per_sequence
    if need <= free:
        return
    fits = (free - fixed) // per_sequence
    advice = f"at most about {fits:,} fit" if fits >= 1 else "no batch size fits: lower data.seq_len or the model"
    raise ConfigError(f"train.batch_size: {cfg.train.batch_size:,} sequences of data.seq_len = {cfg.data.seq_len} "
                      f"need about {need / _GiB:,.1f} GiB for one step on {device.type} ({attention_backend} "
                      f"attention; estimate of kernel_dispatch/training/resources.py), more than the "
                      f"{free / _GiB:,.1f} GiB available; {advice}")


def check_out_dir(out_dir: str | Path) -> None:
    """Create ``out_dir`` if needed and make sure a file can be written in it, or raise ConfigError."""
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=out, prefix=".write-test-")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise ConfigError(f"train.out_dir: cannot write to {str(out)!r}: {e.strerror or e}") from None
