"""Plots of a search: throughput vs memory (Pareto front marked), top plans' breakdown."""

from __future__ import annotations

from pathlib import Path

from optimizer.scoring import SearchReport
from trainsim.plots.figures import save_figure

__all__ = ["plot_search", "plot_pareto", "plot_top_breakdown", "pareto_front"]


def pareto_front(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """(memory, throughput) points not beaten on both: less memory and more throughput."""
    front: list[tuple[float, float]] = []
    for mem, thr in sorted(points, key=lambda p: (p[0], -p[1])):
        if not front or thr > front[-1][1]:
            front.append((mem, thr))
    return front


def plot_pareto(rep: SearchReport, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tokens = rep.best.plan.global_batch_size * rep.best.plan.seq_len
    pts = [(c.peak_gib, tokens / c.analytic_s) for c in rep.candidates]
    front = pareto_front(pts)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.scatter([p[0] for p in pts], [p[1] for p in pts], s=4, alpha=0.3, label="plans (analytic)")
    ax.plot([p[0] for p in front], [p[1] for p in front], "r.-", label="Pareto front")
    ax.scatter([rep.best.peak_gib], [tokens / rep.best.best_s], marker="*", s=150, c="k",
               label="best (DES)")
    ax.set_xlabel("peak memory per device (GiB)")
    ax.set_ylabel("tokens/s")
    ax.legend(fontsize=8)
    ax.set_title(f"{rep.model} on {rep.cluster}")
    fig.tight_layout()
    return save_figure(fig, path)


def plot_top_breakdown(rep: SearchReport, path: Path, top: int = 8) -> Path:
    from optimizer.report import plan_label
    from trainsim.plots.figures import plot_breakdown

    results = [(plan_label(c.plan)[:40], c.des) for c in rep.ranked[:top] if c.des]
    if rep.baseline is not None and rep.baseline.des is not None:
        results.append(("baseline: " + plan_label(rep.baseline.plan)[:30], rep.baseline.des))
    return plot_breakdown(results, path)


def plot_search(rep: SearchReport, out: Path) -> list[Path]:
    """The search's figures in ``out``: the Pareto front and the top plans' breakdowns."""
    return [plot_pareto(rep, out / "pareto.png"),
            plot_top_breakdown(rep, out / "top_breakdown.png")]
