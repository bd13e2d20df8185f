"""matplotlib figures of results (imported lazily: simulating needs no plotting): the
critical-path breakdown bars, and :func:`save_figure` for every plot and study.

Each plot has a builder that returns the matplotlib Figure (tests read its title, labels
and legend) and a writer that saves it; the timeline is in :mod:`trainsim.plots.timeline`,
the topology drawing in :mod:`trainsim.plots.topology`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sim.result import BREAKDOWN_KINDS
from trainsim.plots.output import pair_paths, save_figure, save_figures

__all__ = ["breakdown_bars", "breakdown_figure", "save_figure"]

Row = tuple[str, dict[str, float], float]


def breakdown_bars(rows: list[Row], path: Path, share: bool = False, title: str = ""
                   ) -> list[Path]:
    """Horizontal stacked bars of (label, seconds by kind, iteration seconds): seconds on
    the critical path, or with ``share`` each kind's percentage of its iteration; written
    as PNG and SVG beside each other (``path`` names either)."""
    return save_figures(breakdown_figure(rows, share, title), pair_paths(path))


def breakdown_figure(rows: list[Row], share: bool = False, title: str = "") -> Any:
    """The bars' Figure: one bar per row, one colour per kind of time (the legend)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 0.6 * len(rows) + 2.2))
    labels = [label for label, _, _ in rows]
    left = [0.0] * len(rows)
    for kind in BREAKDOWN_KINDS:
        width = [(100 * b.get(kind, 0.0) / it if share else b.get(kind, 0.0))
                 for _, b, it in rows]
        ax.barh(labels, width, left=left, label=kind)
        left = [a + w for a, w in zip(left, width, strict=True)]
    ax.set_xlabel("share of iteration time (%)" if share else "time per iteration (s)")
    ax.set_ylabel("result")
    ax.invert_yaxis()
    ax.legend(ncol=4, fontsize=8, loc="lower center", bbox_to_anchor=(0.5, 1.0),
              title="critical path by kind", title_fontsize=8)
    ax.set_title(title or "Critical-path breakdown of each iteration", fontsize=10, pad=52)
    fig.tight_layout()
    return fig
