"""PNG plots of a run: each bench module draws its own (``plot``, ``PLOT_FILE``, ``PLOT_TITLE``; see
:mod:`kernel_dispatch.benchmarks.common`) with the helpers here, which keep one style for every plot."""
from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from .. import registry
from .common import baselines, modules, option

DIRECTIONS = (("fwd", "forward"), ("fwd_bwd", "forward + backward"))


def pyplot():
    """matplotlib.pyplot on the Agg backend (ImportError when matplotlib is missing)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def series(records, key_of_panel, x_of, y_of):
    """{panel: {backend: [(x, y), ...]}} of the records that have a y."""
    panels: dict = defaultdict(lambda: defaultdict(list))
    for r in records:
        y = y_of(r)
        if y is not None:
            panels[key_of_panel(r)][r["backend"]].append((x_of(r), y))
    return panels


def grid(plt, ncols: int, title: str):
    """A figure of 2 rows (the DIRECTIONS) by ``ncols`` panels; returns (figure, axes[row][col])."""
    fig, axes = plt.subplots(2, ncols, figsize=(5.5 * ncols, 8), squeeze=False)
    fig.suptitle(title)
    return fig, axes


def fraction_axis(ax) -> None:
    """A linear axis from 0 for fractions of the speed of light, with a dotted line at 1; it reaches past 1 where a
    point does (a baseline measured faster than the copy bandwidth), never cutting a point off."""
    top = ax.dataLim.ymax if ax.has_data() else 1.0
    ax.set_ylim(0, max(1.05, 1.05 * top))
    ax.axhline(1.0, color="0.5", linestyle=":", linewidth=1)


def draw(ax, lines: dict, styles: dict) -> None:
    """One line per backend ({backend: [(x, y), ...]}) in its style, with a grid and a legend."""
    for backend in sorted(lines):
        pts = sorted(lines[backend])
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=backend, **styles.get(backend, {}))
    ax.grid(True, which="both", alpha=0.3)
    if lines:
        ax.legend(fontsize=8)


def styles(records) -> dict:
    """Kernels solid, baselines dashed, one colour per backend or baseline in every plot."""
    order = registry.BACKEND_NAMES + baselines()
    kinds = {r["backend"]: r["kind"] for r in records}
    return {n: {"color": _color(order.index(n) if n in order else len(order)),
                "linestyle": "-" if k == "kernel" else "--"} for n, k in kinds.items()}


EXTRA_COLORS = ("black", "darkgoldenrod", "navy", "lime", "maroon", "slategray")  # after matplotlib's ten


def _color(i: int) -> str:
    """Colour i of the plots: matplotlib's ten (C0..C9), then EXTRA_COLORS, so no two names share one."""
    return f"C{i}" if i < 10 else EXTRA_COLORS[(i - 10) % len(EXTRA_COLORS)]


def save(plt, fig, path: Path) -> Path:
    """Lay out, write and close ``fig``; returns ``path``."""
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_plots(data: dict, out_dir: str | Path) -> list[Path]:
    """Write every plot the records allow into ``out_dir``, in the order of the bench modules; returns the
    paths written."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    card = data["env"].get("card", "?")
    written = []
    for name, mod in modules().items():
        plot = option(mod, "plot")
        recs = [r for r in data["records"] if r["op"] == name]
        if plot is not None and recs:
            written.append(plot(recs, out_dir / mod.PLOT_FILE, f"{mod.PLOT_TITLE} ({card})"))
    return [p for p in written if p is not None]
