"""``trainsim plot breakdown``: stacked time-breakdown bars of saved results.

It reads what the other commands write: a ``simulate --json`` result, a scenarios file
(``simulate --set ... --json``), or a sweep (its folder, ``results.json`` or
``points.jsonl``). Each bar is one result's critical path split by kind.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from sim.errors import SpecError
from sim.io import read_text

__all__ = ["load_breakdowns", "add_plot_breakdown"]

Row = tuple[str, dict[str, float], float]
MAX_BARS = 60


def _result_row(label: str, d: dict[str, Any]) -> Row | None:
    """None for a result without a time (a step that cannot complete)."""
    it, breakdown = d.get("iteration_time_s"), d.get("breakdown")
    if it is None or not isinstance(breakdown, dict):
        return None
    return label, {k: float(v) for k, v in breakdown.items()}, float(it)


def _rows_of(path: Path) -> tuple[list[Row], int]:
    """(rows, results skipped because they have no time)."""
    if path.is_dir() or path.suffix == ".jsonl":
        return _sweep_rows(path)
    try:
        data = json.loads(read_text(path, "results"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise SpecError("results", f"{path} is not JSON") from None
    if isinstance(data, list):
        return _sweep_rows(path)
    if isinstance(data, dict) and isinstance(data.get("scenarios"), list):
        found = [(str(s.get("name", i)), s.get("result"))
                 for i, s in enumerate(data["scenarios"])]
        rows = [_result_row(name, r) for name, r in found if isinstance(r, dict)]
        return [r for r in rows if r], len(found) - sum(1 for r in rows if r)
    if isinstance(data, dict) and "breakdown" in data:
        row = _result_row(path.stem, data)
        return ([row], 0) if row else ([], 1)
    raise SpecError("results", f"{path} is neither a simulate --json result, a scenarios "
                    "file nor a sweep's results")


def _sweep_rows(path: Path) -> tuple[list[Row], int]:
    from trainsim.plots.sweep import load_rows

    rows, skipped = [], 0
    for r in load_rows(path):
        label = ", ".join(f"{k}={v}" for k, v in r["params"].items()) or "base"
        row = _result_row(label, r) if r.get("status") == "ok" else None
        if row:
            rows.append(row)
        else:
            skipped += 1
    return rows, skipped


def load_breakdowns(paths: list[str]) -> tuple[list[Row], int]:
    """Every bar from every file, in order, and how many results had no time."""
    rows: list[Row] = []
    skipped = 0
    for name in paths:
        path = Path(name)
        if not path.exists():
            raise SpecError("results", f"no such file or folder: {path}")
        got, n = _rows_of(path)
        rows += [(f"{path.stem}: {label}" if len(paths) > 1 and label != path.stem else label,
                  b, it) for label, b, it in got]
        skipped += n
    if not rows:
        raise SpecError("results", "no result with an iteration time in "
                        + ", ".join(paths))
    if len(rows) > MAX_BARS:
        raise SpecError("results", f"{len(rows)} results: at most {MAX_BARS} bars fit in one "
                        "chart (plot a filtered sweep, e.g. results.json of fewer points)")
    return rows, skipped


def cmd_plot_breakdown(args: argparse.Namespace) -> int:
    from trainsim.plots.figures import breakdown_bars
    from trainsim.plots.output import check_pair

    out = check_pair(args.out, "--out")
    rows, skipped = load_breakdowns(args.results)
    for path in breakdown_bars(rows, out, share=args.share):
        print(f"wrote {path}")
    if skipped:
        print(f"skipped {skipped} result(s) without an iteration time (invalid or cannot "
              "complete)")
    return 0


def add_plot_breakdown(sub: Any) -> None:
    from trainsim.commands.sweep import plot_subparsers

    psub = plot_subparsers(sub)
    p = psub.add_parser("breakdown", help="stacked time-breakdown bars of saved results "
                        "(PNG and SVG)",
                        description="One bar per result: its critical path split into "
                        "compute, tp, cp, ep, pp, dp, optimizer and bubble.")
    p.add_argument("results", nargs="+", help="simulate --json results, scenario files "
                   "(simulate --set ... --json) or sweeps (folder, results.json, points.jsonl)")
    p.add_argument("--share", action="store_true",
                   help="percent of each iteration instead of seconds")
    p.add_argument("--out", default="breakdown.png",
                   help="PNG or SVG to write; the other goes beside it (default "
                   "breakdown.png)")
    p.set_defaults(func=cmd_plot_breakdown)
