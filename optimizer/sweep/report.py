"""What a finished sweep reports: the sorted tables, the sensitivity of the iteration time
to each swept parameter, and every place where better hardware made it slower.

Sensitivity of a parameter: for each combination of the other parameters, the spread
``max / min - 1`` of the metric over this parameter's values; the median and the largest
spread over those combinations are reported. Monotonicity: along every hardware axis with a
direction (a higher bandwidth, fewer microseconds of latency, less oversubscription), each
step towards better hardware that makes the iteration slower is listed, not hidden.
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from optimizer.sweep.grid import SweepSpec, point_key
from sim.result import BREAKDOWN_KINDS

__all__ = ["BETTER", "flat_row", "results_csv", "sensitivity", "non_monotone", "summarize",
           "final_files", "format_summary"]

# +1: a larger value is better hardware; -1: a smaller one is.
BETTER = {"inter_node.nic_Gbps": 1, "inter_node.nics_per_node": 1,
          "intra_node.bandwidth_GBps": 1, "inter_node.latency_us": -1,
          "intra_node.latency_us": -1, "inter_node.oversubscription": -1}
_METRICS = ("fidelity", "gpus", "dp", "plan", "iteration_time_s", "tokens_per_s", "mfu",
            "model_tflops_per_gpu", "peak_memory_gib", "fits_in_memory", "bubble_fraction")
_REL_TOL = 1e-9  # a slowdown smaller than this is rounding, not a finding


def flat_row(row: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """One CSV row: the parameters, the status, the figures, the breakdown by kind."""
    out = {k: row["params"].get(k) for k in names}
    out["status"] = row["status"]
    out.update({k: row.get(k) for k in _METRICS})
    out.update({f"{k}_s": row.get("breakdown", {}).get(k) for k in BREAKDOWN_KINDS})
    out["error"] = row.get("error", "")
    return out


def results_csv(rows: list[dict[str, Any]], names: list[str]) -> str:
    import pandas as pd

    df = pd.DataFrame([flat_row(r, names) for r in rows])
    for col in ("gpus", "dp"):
        df[col] = df[col].astype("Int64")  # integers, blank where a point did not run
    return df.to_csv(index=False)


def _groups(rows: list[dict[str, Any]], name: str, y: str) -> dict[str, list[tuple[Any, float]]]:
    """Ok rows grouped by every parameter but ``name``: (value of ``name``, metric)."""
    groups: dict[str, list[tuple[Any, float]]] = defaultdict(list)
    for r in rows:
        if r.get("status") == "ok" and name in r["params"]:
            rest = {k: v for k, v in r["params"].items() if k != name}
            groups[point_key(rest)].append((r["params"][name], float(r[y])))
    return groups


def sensitivity(rows: list[dict[str, Any]], names: list[str], y: str = "iteration_time_s"
                ) -> list[dict[str, Any]]:
    """Per swept parameter, the median and largest relative spread of ``y`` over it."""
    out = []
    for name in names:
        spreads = [max(v for _, v in g) / min(v for _, v in g) - 1
                   for g in _groups(rows, name, y).values() if len(g) > 1]
        if spreads:
            out.append({"param": name, "median_spread": statistics.median(spreads),
                        "max_spread": max(spreads), "combinations": len(spreads)})
    return out


def non_monotone(rows: list[dict[str, Any]], names: list[str], y: str = "iteration_time_s"
                 ) -> list[dict[str, Any]]:
    """Every step towards better hardware along a directed axis that made ``y`` slower."""
    found = []
    for name in (n for n in names if n in BETTER):
        for rest, g in sorted(_groups(rows, name, y).items()):
            steps = sorted(g, key=lambda p: BETTER[name] * p[0])  # worse hardware first
            for (a, ta), (b, tb) in zip(steps, steps[1:], strict=False):
                if tb > ta * (1 + _REL_TOL):
                    found.append({"param": name, "from": a, "to": b, "others": json.loads(rest),
                                  f"{y}_from": ta, f"{y}_to": tb, "slowdown": tb / ta - 1})
    return found


def summarize(spec: SweepSpec, rows: list[dict[str, Any]]) -> dict[str, Any]:
    names = [k for k, _ in spec.axes]
    ok = [r for r in rows if r["status"] == "ok"]
    counts = {s: sum(r["status"] == s for r in rows) for s in ("ok", "invalid", "infeasible")}
    fits = [r for r in ok if r["fits_in_memory"]]
    best = min(fits, key=lambda r: r["iteration_time_s"], default=None)
    fastest = None if best is None else {k: best.get(k) for k in
                                         ("params", "iteration_time_s", "plan")}
    return {"sweep": spec.to_dict(), "points": len(rows), "status": counts,
            "fit_in_memory": len(fits), "fastest": fastest,
            "sensitivity": sensitivity(rows, names), "non_monotone": non_monotone(rows, names)}


def final_files(spec: SweepSpec, rows: list[dict[str, Any]], out: Path) -> dict[Path, str]:
    names = [k for k, _ in spec.axes]
    return {out / "results.json": json.dumps(rows, indent=1) + "\n",
            out / "results.csv": results_csv(rows, names),
            out / "summary.json": json.dumps(summarize(spec, rows), indent=2) + "\n"}


def format_summary(s: dict[str, Any]) -> str:
    c = s["status"]
    lines = [f"{s['points']} points: {c['ok']} simulated ({s['fit_in_memory']} fit in memory), "
             f"{c['invalid']} invalid, {c['infeasible']} without a feasible plan"]
    if s["fastest"]:
        f = s["fastest"]
        lines.append(f"fastest that fits: {f['iteration_time_s']:.4g} s at "
                     f"{point_key(f['params'])} ({f['plan']})")
    for e in s["sensitivity"]:
        lines.append(f"sensitivity to {e['param']}: median {100 * e['median_spread']:.1f}%, "
                     f"max {100 * e['max_spread']:.1f}% ({e['combinations']} combinations)")
    bad = s["non_monotone"]
    if bad:
        worst = max(bad, key=lambda e: e["slowdown"])
        lines.append(f"NOT MONOTONE: {len(bad)} steps to better hardware were slower; worst "
                     f"{worst['param']} {worst['from']} -> {worst['to']} at "
                     f"{point_key(worst['others'])}: +{100 * worst['slowdown']:.3g}% "
                     "(all in summary.json)")
    return "\n".join(lines)
