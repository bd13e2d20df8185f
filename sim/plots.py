"""matplotlib figures of results (imported lazily: simulating needs no plotting)."""

from __future__ import annotations

from pathlib import Path

from sim.result import BREAKDOWN_KINDS, Result

__all__ = ["plot_breakdown"]


def plot_breakdown(results: list[tuple[str, Result]], path: Path) -> Path:
    """Horizontal stacked bars: each scenario's critical path as a share of its iteration."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 0.6 * len(results) + 1.6))
    labels = [label for label, _ in results]
    left = [0.0] * len(results)
    for kind in BREAKDOWN_KINDS:
        share = [100 * r.breakdown[kind] / r.iteration_time_s for _, r in results]
        ax.barh(labels, share, left=left, label=kind)
        left = [a + b for a, b in zip(left, share, strict=True)]
    ax.set_xlabel("share of iteration time (%)")
    ax.invert_yaxis()
    ax.legend(ncol=4, fontsize=8, loc="lower center", bbox_to_anchor=(0.5, 1.0))
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=120)
    plt.close(fig)
    tmp.replace(path)
    return path
