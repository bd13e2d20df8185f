"""Plots of a sweep (PNG and SVG): a metric against a swept parameter (scaling curves,
bandwidth sweeps), and the sensitivity of a metric to each swept parameter."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from optimizer.sweep.report import sensitivity
from sim.errors import SpecError
from trainsim.plots.labels import metric_label, param_label
from trainsim.plots.output import pair_paths, save_figures

__all__ = ["load_rows", "plot_sweep", "plot_sensitivity", "sweep_figure",
           "sensitivity_figure", "swept_names"]

MAX_LINES = 20


def load_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of a sweep folder (its results.json, else its points.jsonl), a results.json
    or a points.jsonl."""
    from optimizer.sweep.run import POINTS_FILE, read_points

    if path.is_dir():
        path = path / "results.json" if (path / "results.json").is_file() else path / POINTS_FILE
    if not path.is_file():
        raise SpecError("results", f"no such file: {path}")
    if path.suffix == ".jsonl":
        return read_points(path)[1]
    try:
        rows = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise SpecError("results", f"{path} is not a sweep's results.json") from None
    if not isinstance(rows, list) or not all(isinstance(r, dict) and "params" in r for r in rows):
        raise SpecError("results", f"{path} is not a sweep's results.json")
    return rows


def swept_names(rows: list[dict[str, Any]]) -> list[str]:
    names: list[str] = []
    for r in rows:
        names += [k for k in r["params"] if k not in names]
    return names


def _metric(row: dict[str, Any], y: str) -> float:
    return float(row["breakdown"][y] if y in row.get("breakdown", {}) else row[y])


def _check(rows: list[dict[str, Any]], names: list[str], x: str, y: str, hue: str | None
           ) -> None:
    for opt, name in (("--x", x), ("--hue", hue)):
        if name is not None and name not in names:
            raise SpecError(opt, f"{name!r} is not a swept parameter (swept: "
                            f"{', '.join(names) or 'none'})")
    if not rows:
        raise SpecError("results", "no simulated point (every point invalid, or --where "
                        "matched none)")
    try:
        _metric(rows[0], y)
    except (KeyError, TypeError, ValueError):
        raise SpecError("--y", f"{y!r} is not a numeric figure of the rows (e.g. "
                        "iteration_time_s, tokens_per_s, mfu, peak_memory_gib, or a "
                        "breakdown kind such as dp)") from None


def _lines(rows: list[dict[str, Any]], x: str, hue: str | None) -> dict[str, list[dict]]:
    """Rows grouped into lines: one per value of ``hue`` and of every other parameter."""
    lines: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        rest = {k: v for k, v in r["params"].items() if k != x}
        label = ", ".join(f"{k}={v}" for k, v in sorted(rest.items(),
                                                        key=lambda kv: kv[0] != hue))
        lines.setdefault(label or "all points", []).append(r)
    return lines


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def plot_sweep(rows: list[dict[str, Any]], x: str, y: str, hue: str | None,
               where: list[tuple[str, Any]], path: Path) -> list[Path]:
    """Write :func:`sweep_figure` as PNG and SVG (``path`` names either)."""
    return save_figures(sweep_figure(rows, x, y, hue, where), pair_paths(path))


def sweep_figure(rows: list[dict[str, Any]], x: str, y: str, hue: str | None,
                 where: list[tuple[str, Any]]) -> Any:
    """``y`` against ``x``, one line per combination of the other parameters."""
    names = swept_names(rows)
    kept = [r for r in rows if r.get("status") == "ok"
            and all(str(r["params"].get(k)) == str(v) for k, v in where)]
    _check(kept, names, x, y, hue)
    lines = _lines(kept, x, hue)
    if len(lines) > MAX_LINES:
        raise SpecError("--where", f"{len(lines)} lines: fix the other swept parameters with "
                        f"--where KEY=VALUE (swept: {', '.join(n for n in names if n != x)})")
    values = sorted({r["params"][x] for r in kept},
                    key=lambda v: (0, v, "") if _is_number(v) else (1, 0, str(v)))
    numeric = all(_is_number(v) for v in values)
    pos = {v: (v if numeric else i) for i, v in enumerate(values)}
    return _draw(lines, x, y, pos, numeric, values, where)


def _draw(lines: dict[str, list[dict[str, Any]]], x: str, y: str, pos: dict[Any, Any],
          numeric: bool, values: list[Any], where: list[tuple[str, Any]]) -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for label, pts in lines.items():
        pts = sorted(pts, key=lambda r: pos[r["params"][x]])
        ax.plot([pos[r["params"][x]] for r in pts], [_metric(r, y) for r in pts], marker="o",
                label=label)
    if numeric and min(values) > 0 and max(values) / min(values) >= 8:
        ax.set_xscale("log", base=2)
        ax.set_xticks(values, [f"{v:g}" for v in values])
        ax.minorticks_off()
    if not numeric:
        ax.set_xticks(range(len(values)), [str(v) for v in values], rotation=20)
    ax.set_xlabel(param_label(x))
    ax.set_ylabel(metric_label(y))
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, title="other parameters" if len(lines) > 1 else None)
    fixed = ", ".join(f"{k}={v}" for k, v in where)
    ax.set_title(f"{metric_label(y)} against {param_label(x)}"
                 + (f"\n(where {fixed})" if fixed else ""), fontsize=10)
    fig.tight_layout()
    return fig


def plot_sensitivity(rows: list[dict[str, Any]], y: str, path: Path) -> list[Path]:
    """Write :func:`sensitivity_figure` as PNG and SVG (``path`` names either)."""
    return save_figures(sensitivity_figure(rows, y), pair_paths(path))


def sensitivity_figure(rows: list[dict[str, Any]], y: str) -> Any:
    """Per swept parameter: the median spread of ``y`` over its values (bar) and the largest
    (tick), in percent."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in rows if r.get("status") == "ok"]
    if ok:
        _check(ok, swept_names(rows), swept_names(rows)[0], y, None)
    entries = sensitivity(ok, swept_names(rows), y)
    if not entries:
        raise SpecError("results", "no parameter has two simulated values to compare")
    fig, ax = plt.subplots(figsize=(8, 0.5 * len(entries) + 1.5))
    labels = [f"{param_label(e['param'])} [{e['param']}]" for e in entries]
    ax.barh(labels, [100 * e["median_spread"] for e in entries], label="median spread")
    ax.plot([100 * e["max_spread"] for e in entries], labels, "k|", markersize=14,
            label="largest spread")
    ax.set_xlabel("spread over the parameter's values, the others fixed (%)")
    ax.set_ylabel("swept parameter")
    ax.invert_yaxis()
    ax.legend(fontsize=8)
    ax.set_title(f"Sensitivity to each swept parameter: {metric_label(y)}", fontsize=10)
    fig.tight_layout()
    return fig
