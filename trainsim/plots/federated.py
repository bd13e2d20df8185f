"""Figures of federated jobs: the distribution of round times (one line per result, e.g. the
shared server link against the scalar model), participation over time, and time-to-accuracy
curves per strategy."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from trainsim.plots.output import save_figure

__all__ = ["round_time_figure", "participation_figure", "tta_figure"]


def _finish(fig: Any, ax: Any, xlabel: str, ylabel: str, title: str, path: Path,
            legend_title: str | None = None) -> Path:
    """Labels, title, grid and legend, then the figure written (atomically) to ``path``."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(title=legend_title, fontsize=8)
    fig.tight_layout()
    return save_figure(fig, path)


def round_time_figure(results: dict[str, Any], path: Path, title: str) -> Path:
    """Empirical CDF of round durations, one line per labelled result."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for label, res in results.items():
        t = np.sort(res.round_times())
        ax.step(t, np.arange(1, len(t) + 1) / len(t), where="post", label=label)
    return _finish(fig, ax, "Round duration (s)", "Fraction of rounds at most this long",
                   title, path, "strategy, server link")


def participation_figure(res: Any, path: Path, title: str) -> Path:
    """Updates used a round (and clients sampled) against the virtual clock in hours."""
    import matplotlib.pyplot as plt

    rows = res.rows
    t = np.array([r["end_s"] for r in rows]) / 3600.0
    fig, ax = plt.subplots(figsize=(7, 4.2))
    ax.plot(t, [r["updates"] for r in rows], label="updates used", lw=1.2)
    if res.job.training.strategy != "fedbuff":
        ax.plot(t, [r["sampled"] for r in rows], label="clients sampled", lw=1.0, ls="--")
        ax.plot(t, [r["dropped"] for r in rows], label="dropped out", lw=1.0, ls=":")
    return _finish(fig, ax, "Virtual time (hours)", "Clients per round", title, path)


def tta_figure(curves: dict[str, tuple[np.ndarray, np.ndarray]], target: float, path: Path,
               title: str) -> Path:
    """When each test accuracy is predicted to be reached (virtual hours), one line per
    strategy: each point is the fitted rounds to that accuracy on the simulated clock."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for label, (hours, acc) in curves.items():
        ax.plot(hours, acc, label=label, lw=1.3, marker="o")
    ax.axhline(target, color="grey", ls="--", lw=0.8, label=f"target {target:.0%}")
    return _finish(fig, ax, "Virtual time (hours)", "Predicted test accuracy (fraction)",
                   title, path)
