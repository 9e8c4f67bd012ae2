"""PNG plots of a run: lazy attention time vs L per backend, mHC fraction of the speed of light vs D."""
from __future__ import annotations

from collections import defaultdict
from pathlib import Path

DIRECTIONS = (("fwd", "forward"), ("fwd_bwd", "forward + backward"))


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _series(records, key_of_panel, x_of, y_of):
    """{panel: {backend: [(x, y), ...]}} of the records that have a y."""
    panels: dict = defaultdict(lambda: defaultdict(list))
    for r in records:
        y = y_of(r)
        if y is not None:
            panels[key_of_panel(r)][r["backend"]].append((x_of(r), y))
    return panels


def _grid(plt, ncols: int, title: str):
    fig, axes = plt.subplots(2, ncols, figsize=(5.5 * ncols, 8), squeeze=False)
    fig.suptitle(title)
    return fig, axes


def _draw(ax, lines: dict, styles: dict) -> None:
    for backend in sorted(lines):
        pts = sorted(lines[backend])
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=backend, **styles.get(backend, {}))
    ax.grid(True, which="both", alpha=0.3)
    if lines:
        ax.legend(fontsize=8)


ORDER = ("golden", "triton", "tilelang", "golden_compile", "sdpa_flash", "sdpa_cudnn", "flex")


def _styles(records) -> dict:
    # kernels solid, baselines dashed, one colour per backend in every plot
    kinds = {r["backend"]: r["kind"] for r in records}
    return {n: {"color": f"C{ORDER.index(n) if n in ORDER else len(ORDER)}",
                "linestyle": "-" if k == "kernel" else "--"} for n, k in kinds.items()}


def attention_plot(records: list[dict], path: Path, title: str) -> Path | None:
    """Median time (ms, log) vs L (log) per backend; columns are head dims, rows fwd and fwd+bwd."""
    Ds = sorted({r["shape"]["D"] for r in records})
    if not Ds:
        return None
    plt = _pyplot()
    fig, axes = _grid(plt, len(Ds), title)
    styles = _styles(records)
    for row, (key, label) in enumerate(DIRECTIONS):
        panels = _series(records, lambda r: r["shape"]["D"], lambda r: r["shape"]["L"],
                         lambda r, key=key: (r.get(key) or {}).get("median_ms"))
        for col, D in enumerate(Ds):
            ax = axes[row][col]
            _draw(ax, panels.get(D, {}), styles)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_title(f"D = {D}, {label}")
            ax.set_xlabel("L (tokens; B = tokens // L)")
            ax.set_ylabel("median time (ms)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def mhc_plot(records: list[dict], path: Path, title: str) -> Path | None:
    """Fraction of the speed of light vs D per backend; columns are token counts T, rows fwd and fwd+bwd."""
    Ts = sorted({r["shape"]["T"] for r in records})
    if not Ts:
        return None
    plt = _pyplot()
    fig, axes = _grid(plt, len(Ts), title)
    styles = _styles(records)
    for row, (key, label) in enumerate(DIRECTIONS):
        panels = _series(records, lambda r: r["shape"]["T"], lambda r: r["shape"]["D"],
                         lambda r, key=key: r["metrics"].get(f"{key}_sol"))
        for col, T in enumerate(Ts):
            ax = axes[row][col]
            _draw(ax, panels.get(T, {}), styles)
            ax.set_ylim(0, 1.05)
            ax.set_title(f"T = {T}, {label}")
            ax.set_xlabel("D (hidden size)")
            ax.set_ylabel("fraction of the speed of light")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


FILES = {"lazy_attention": "lazy_attention_time.png", "mhc": "mhc_sol.png"}


def write_plots(data: dict, out_dir: str | Path) -> list[Path]:
    """Write every plot the records allow into ``out_dir``; returns the paths written."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    card = data["env"].get("card", "?")
    att = [r for r in data["records"] if r["op"] == "lazy_attention"]
    mhc = [r for r in data["records"] if r["op"] == "mhc"]
    written = [attention_plot(att, out_dir / FILES["lazy_attention"], f"Lazy attention ({card})"),
               mhc_plot(mhc, out_dir / FILES["mhc"], f"mHC block pre -> post ({card})")]
    return [p for p in written if p is not None]
