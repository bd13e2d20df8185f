"""Closed loop: the simulator's prediction beside a real run of the same plan, and
calibration of the profile DB from the difference."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from executor.launch import execute
from sim.api import simulate
from sim.cost.profile_db import calibration_key, resolve_device_dir
from sim.errors import SpecError
from sim.io import atomic_write_text
from sim.layout.inventory import compare_inventory, expected_collectives
from sim.spec.cluster import ClusterSpec
from sim.spec.hardware import cpu_device_name
from sim.spec.model import ModelSpec
from sim.spec.plan import Plan, validate

__all__ = ["compare", "calibrate", "format_comparison"]

GIB = 2.0**30


def compare(model: ModelSpec, plan: Plan, cluster: ClusterSpec, fidelity: str = "analytic",
            **run: Any) -> dict[str, Any]:
    """Predict, run, and put the two side by side (iteration time, peak memory per rank,
    the collectives rank 0 issued against those the simulator expects)."""
    validate(plan, model, cluster)
    predicted = simulate(model, cluster, plan, fidelity=fidelity)
    measured = execute(model, plan, **run)
    inventory = compare_inventory(expected_collectives(model, plan, 0),
                                  measured["collectives"]["0"])
    t_pred, t_meas = predicted.iteration_time_s, measured["iteration_s"]
    return {
        "model": model.name, "cluster": cluster.name, "plan": plan.to_dict(),
        "fidelity": fidelity, "profile": cluster.profile, "compute_stat": cluster.compute_stat,
        "predicted_s": t_pred, "measured_s": t_meas,
        "measured_min_s": measured["min_s"], "measured_max_s": measured["max_s"],
        "error": (t_pred - t_meas) / t_meas,
        "predicted_peak_gib": predicted.peak_memory_gib,
        "measured_peak_gib": max(measured["peak_bytes"]) / GIB,
        "loss": measured["loss"], "tokens_per_s": measured["tokens_per_s"],
        "inventory": inventory, "inventory_match": all(r["match"] for r in inventory),
        "extrapolated": predicted.extrapolated, "measured": measured}


def _calibration_file(cluster: ClusterSpec) -> Path:
    if not cluster.profile:
        raise SpecError("--calibrate", f"cluster {cluster.name!r} names no profile DB to "
                        "calibrate (give --profile DIR)")
    hint = cpu_device_name() if cluster.gpu.name == "cpu" else cluster.gpu.name
    return resolve_device_dir(cluster.profile, hint) / "calibration.json"


def calibrate(cluster: ClusterSpec, comparisons: list[dict[str, Any]]) -> dict[str, Any]:
    """Fold measured/predicted iteration-time ratios into the profile DB's compute scale
    for the cluster's ``compute_stat`` (geometric mean over the comparisons, on top of any
    earlier calibration), written atomically to ``calibration.json`` in the device folder;
    the cost model multiplies every compute time it reads with that statistic by it."""
    path = _calibration_file(cluster)
    old = json.loads(path.read_text()) if path.exists() else {}
    key = calibration_key(cluster.compute_stat)
    ratios = [c["measured_s"] / c["predicted_s"] for c in comparisons]
    step = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
    runs = [{"model": c["model"], "plan": c["plan"], "compute_stat": cluster.compute_stat,
             "measured_s": c["measured_s"], "predicted_s": c["predicted_s"]}
            for c in comparisons]
    new = {**old, "schema_version": 1, key: old.get(key, 1.0) * step,
           "runs": old.get("runs", []) + runs}
    atomic_write_text(path, json.dumps(new, indent=2) + "\n")
    return {"path": str(path), "compute_stat": cluster.compute_stat, "compute_scale": new[key],
            "step": step}


def _profile_label(c: dict[str, Any]) -> str:
    if not c["profile"]:
        return "none: hardware specs"
    return f"{c['profile']}, {c.get('compute_stat', 'median')} of its compute rows"


def format_comparison(c: dict[str, Any]) -> str:
    lines = [
        f"{c['model']} on {c['cluster']} ({c['fidelity']} simulator, profile "
        f"{_profile_label(c)})",
        f"  iteration   predicted {c['predicted_s']:.3f} s   measured {c['measured_s']:.3f} s "
        f"(steps {c['measured_min_s']:.3f}-{c['measured_max_s']:.3f})   error "
        f"{100 * c['error']:+.1f}%",
        f"  peak memory predicted {c['predicted_peak_gib']:.2f} GiB   measured "
        f"{c['measured_peak_gib']:.2f} GiB per rank (CPU: peak RSS, torch runtime included)",
        f"  loss        {c['loss'][0]:.3f} -> {c['loss'][-1]:.3f} over "
        f"{len(c['loss'])} steps",
        "  collectives of rank 0 (group kind: expected / measured count, bytes):"]
    for r in c["inventory"]:
        mark = "ok" if r["match"] else "MISMATCH"
        lines.append(f"    {r['group']:9s} {r['kind']:14s} {r['expected_count']:4d} / "
                     f"{r['measured_count']:<4d} {r['expected_bytes']:>12,d} / "
                     f"{r['measured_bytes']:<12,d} {mark}")
    if not c["inventory"]:
        lines.append("    none (every group has one rank)")
    return "\n".join(lines)
