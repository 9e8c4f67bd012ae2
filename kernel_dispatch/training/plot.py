"""The loss-curve PNG written at the end of a run (matplotlib, Agg backend: no display needed)."""
from __future__ import annotations

from pathlib import Path


def loss_curve(history: dict, path: str | Path, title: str = "") -> Path:
    """Plot training loss per step and eval loss at its steps from ``history`` into ``path``.

    ``history``: {"train": [[step, loss], ...], "eval": [[step, loss], ...]} (natural-log loss per byte).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), dpi=120)
    if history["train"]:
        steps, losses = zip(*history["train"])
        ax.plot(steps, losses, lw=0.8, alpha=0.8, label="train (per step)")
    if history["eval"]:
        steps, losses = zip(*history["eval"])
        ax.plot(steps, losses, "o-", lw=1.5, label="eval")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats per byte)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path
