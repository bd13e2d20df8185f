"""Plots of a search: throughput vs memory (Pareto front marked), top plans' breakdown."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from optimizer.scoring import SearchReport
from trainsim.plots.output import save_figure

__all__ = ["plot_search", "plot_pareto", "plot_top_breakdown", "pareto_front", "pareto_figure",
           "top_breakdown_figure"]


def pareto_front(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """(memory, throughput) points not beaten on both: less memory and more throughput."""
    front: list[tuple[float, float]] = []
    for mem, thr in sorted(points, key=lambda p: (p[0], -p[1])):
        if not front or thr > front[-1][1]:
            front.append((mem, thr))
    return front


def plot_pareto(rep: SearchReport, path: Path) -> Path:
    return save_figure(pareto_figure(rep), path)


def pareto_figure(rep: SearchReport) -> Any:
    """Every plan's throughput against its memory, the Pareto front and the best plan."""
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
    ax.set_ylabel("throughput (tokens/s)")
    ax.legend(fontsize=8)
    ax.set_title(f"Throughput against memory: {rep.model} on {rep.cluster}", fontsize=10)
    fig.tight_layout()
    return fig


def plot_top_breakdown(rep: SearchReport, path: Path, top: int = 8) -> Path:
    return save_figure(top_breakdown_figure(rep, top), path)


def top_breakdown_figure(rep: SearchReport, top: int = 8) -> Any:
    """The best ``top`` plans' critical paths (DES) as shares of their iteration, and the
    baseline's when there is one."""
    from optimizer.report import plan_label
    from trainsim.plots.figures import breakdown_figure

    rows = [(plan_label(c.plan)[:40], dict(c.des.breakdown), c.des.iteration_time_s)
            for c in rep.ranked[:top] if c.des]
    title = f"Critical path of the top {len(rows)} plans (DES): {rep.model} on {rep.cluster}"
    b = rep.baseline
    if b is not None and b.des is not None:
        rows.append(("baseline: " + plan_label(b.plan)[:30], dict(b.des.breakdown),
                     b.des.iteration_time_s))
    return breakdown_figure(rows, share=True, title=title)


def plot_search(rep: SearchReport, out: Path) -> list[Path]:
    """The search's figures in ``out``: the Pareto front and the top plans' breakdowns."""
    return [plot_pareto(rep, out / "pareto.png"),
            plot_top_breakdown(rep, out / "top_breakdown.png")]
