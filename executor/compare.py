"""Closed loop: the simulator's prediction beside a real run of the same plan, and a
calibrated profile from the difference (a folder of its own, never the measured profile
or the installed package: :mod:`sim.cost.profile_db`)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from executor.launch import check_runnable, execute
from sim.api import simulate
from sim.cost.profile_db import (
    ProfileDB,
    calibration_key,
    load_profile_db,
    tables_dir,
    user_profiles_root,
)
from sim.errors import SpecError
from sim.io import atomic_write_files, read_text
from sim.layout.inventory import compare_inventory, expected_collectives
from sim.spec.cluster import ClusterSpec
from sim.spec.hardware import cpu_device_name
from sim.spec.model import ModelSpec
from sim.spec.plan import Plan, validate
from sim.spec.workload import Workload

__all__ = ["compare", "calibrate", "calibration_target", "format_comparison",
           "check_measured"]

GIB = 2.0**30
MEASURED_KEYS = ("iteration_s", "min_s", "max_s", "peak_bytes", "loss", "tokens_per_s",
                 "collectives")


def _same(a: Any, b: Any) -> bool:
    return bool(json.loads(json.dumps(a)) == json.loads(json.dumps(b)))


def check_measured(measured: Any, model: ModelSpec | Workload, plan: Plan) -> dict[str, Any]:
    """An earlier ``trainsim execute --json`` result of this model and plan (else a
    SpecError naming ``--measured``)."""
    if not isinstance(measured, dict):
        raise SpecError("--measured", "must be the JSON object `trainsim execute --json` "
                        "prints")
    missing = [k for k in (*MEASURED_KEYS, "model", "plan") if k not in measured]
    if missing:
        raise SpecError("--measured", f"lacks {', '.join(missing)} (give the output of "
                        "`trainsim execute --json` of the same model and plan)")
    for what, mine in (("model", model.to_dict()), ("plan", plan.to_dict())):
        if not _same(measured[what], mine):
            raise SpecError("--measured", f"was measured with another {what} than the one "
                            "given (model and plan must be those of the run)")
    return measured


def _profile_db(cluster: ClusterSpec) -> ProfileDB | None:
    if not cluster.profile:
        return None
    hint = cpu_device_name() if cluster.gpu.name == "cpu" else cluster.gpu.name
    return load_profile_db(cluster.profile, hint, cluster.compute_stat)


def compare_graph(w: Workload, plan: Plan, cluster: ClusterSpec, fidelity: str = "analytic",
                  measured: dict[str, Any] | None = None, **run: Any) -> dict[str, Any]:
    """:func:`compare` for a workload graph: the pipeline split is first moved to where the
    run can split (:func:`executor.graph_run.graph_split`), and both use it."""
    import dataclasses

    from executor.graph_run import graph_split
    from sim.cost.graph import layer_times

    if plan.pp > 1:
        split = graph_split(w, plan, layer_times(w, cluster, plan))
        plan = dataclasses.replace(plan, layers_per_stage=split)
    if measured is None:
        check_runnable(w, plan, run.get("nproc"))
    else:
        check_measured(measured, w, plan)
    predicted = simulate(w, cluster, plan, fidelity=fidelity)
    measured = execute(w, plan, **run) if measured is None else measured
    t_pred, t_meas = predicted.iteration_time_s, measured["iteration_s"]
    return {
        "model": w.name, "cluster": cluster.name, "plan": plan.to_dict(),
        "fidelity": fidelity, "profile": cluster.profile, "compute_stat": cluster.compute_stat,
        "calibrated_by": None, "predicted_s": t_pred, "measured_s": t_meas,
        "measured_min_s": measured["min_s"], "measured_max_s": measured["max_s"],
        "error": (t_pred - t_meas) / t_meas, "predicted_peak_gib": predicted.peak_memory_gib,
        "measured_peak_gib": max(measured["peak_bytes"]) / GIB, "loss": measured["loss"],
        "tokens_per_s": measured["tokens_per_s"], "inventory": [], "inventory_match": None,
        "extrapolated": predicted.extrapolated, "measured": measured}


def compare(model: ModelSpec, plan: Plan, cluster: ClusterSpec, fidelity: str = "analytic",
            measured: dict[str, Any] | None = None, **run: Any) -> dict[str, Any]:
    """Predict, run (or take ``measured``, an earlier ``execute`` result of the same model
    and plan), and put the two side by side (iteration time, peak memory per rank, the
    collectives rank 0 issued against those the simulator expects). ``calibrated_by``
    names the calibration the prediction used, if any."""
    validate(plan, model, cluster)
    if measured is None:
        check_runnable(model, plan, run.get("nproc"))
    else:
        check_measured(measured, model, plan)
    predicted = simulate(model, cluster, plan, fidelity=fidelity)
    db = _profile_db(cluster)
    measured = execute(model, plan, **run) if measured is None else measured
    inventory = compare_inventory(expected_collectives(model, plan, 0),
                                  measured["collectives"]["0"])
    t_pred, t_meas = predicted.iteration_time_s, measured["iteration_s"]
    return {
        "model": model.name, "cluster": cluster.name, "plan": plan.to_dict(),
        "fidelity": fidelity, "profile": cluster.profile, "compute_stat": cluster.compute_stat,
        "calibrated_by": str(db.calibration) if db and db.calibration else None,
        "predicted_s": t_pred, "measured_s": t_meas,
        "measured_min_s": measured["min_s"], "measured_max_s": measured["max_s"],
        "error": (t_pred - t_meas) / t_meas,
        "predicted_peak_gib": predicted.peak_memory_gib,
        "measured_peak_gib": max(measured["peak_bytes"]) / GIB,
        "loss": measured["loss"], "tokens_per_s": measured["tokens_per_s"],
        "inventory": inventory, "inventory_match": all(r["match"] for r in inventory),
        "extrapolated": predicted.extrapolated, "measured": measured}


def _check_target(dest: Path, base: Path) -> None:
    """``dest`` may hold a calibration of ``base``: not inside the installed package or a
    measured profile, and not a folder holding anything else."""
    import sim

    d = dest.resolve()
    for protected, why in ((Path(sim.__file__).resolve().parent, "inside the installed "
                            "trainsim package"), (base.resolve(), "inside the measured "
                            "profile it would calibrate")):
        if d == protected or protected in d.parents:
            raise SpecError("--calibration-out", f"{dest} is {why}: a calibration goes in "
                            "a folder of its own")
    if (dest / "meta.json").is_file():
        other = json.loads(read_text(dest / "meta.json", "profile")).get("calibrates")
        if other is None or Path(other).resolve() != base.resolve():
            raise SpecError("--calibration-out", f"{dest} holds "
                            f"{'a measured profile' if other is None else 'a calibration of '}"
                            f"{other or ''}, not a calibration of {base}: choose another folder")
    elif dest.is_dir() and any(dest.iterdir()):
        raise SpecError("--calibration-out", f"{dest} is not empty and holds no calibrated "
                        "profile: choose another folder")


def calibration_target(cluster: ClusterSpec, out: str | Path | None = None
                       ) -> tuple[Path, ProfileDB]:
    """(the calibrated-profile folder to write, the profile the prediction read): ``out``,
    else the calibrated profile the prediction used, else ``$TRAINSIM_HOME/profiles/
    <device>``; never the installed package nor a measured profile."""
    db = _profile_db(cluster)
    if db is None:
        raise SpecError("--calibrate", f"cluster {cluster.name!r} names no profile DB to "
                        "calibrate (give --profile DIR)")
    base = tables_dir(db.path, db.meta)
    dest = Path(out) if out else db.path if db.calibration else user_profiles_root() / base.name
    _check_target(dest, base)
    return dest, db


def calibrate(cluster: ClusterSpec, comparisons: list[dict[str, Any]],
              out: str | Path | None = None) -> dict[str, Any]:
    """Fold measured/predicted iteration-time ratios (geometric mean over the comparisons)
    into a compute scale for the cluster's ``compute_stat``, on top of the scale the
    predictions already had, and write it to a calibrated profile of its own
    (:func:`calibration_target`; ``meta.json`` names the measured profile it calibrates).
    It applies only where ``--profile`` names that folder."""
    dest, db = calibration_target(cluster, out)
    path, key = dest / "calibration.json", calibration_key(cluster.compute_stat)
    old = json.loads(read_text(path, "profile")) if path.is_file() else {}
    ratios = [c["measured_s"] / c["predicted_s"] for c in comparisons]
    step = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
    runs = [{"model": c["model"], "plan": c["plan"], "compute_stat": cluster.compute_stat,
             "measured_s": c["measured_s"], "predicted_s": c["predicted_s"],
             "applied_scale": db.compute_scale} for c in comparisons]
    new = {**old, "schema_version": 1, key: db.compute_scale * step,
           "runs": old.get("runs", []) + runs}
    meta = {"schema_version": 1, "device": db.device,
            "calibrates": str(tables_dir(db.path, db.meta).resolve()),
            "runs": [{"kind": "calibration", "compute_stat": cluster.compute_stat,
                      "compute_scale": new[key], "time_utc": _now()}]}
    if (dest / "meta.json").is_file():
        meta["runs"] = json.loads(read_text(dest / "meta.json", "profile"))["runs"] + \
            meta["runs"]
    atomic_write_files({path: json.dumps(new, indent=2) + "\n",
                        dest / "meta.json": json.dumps(meta, indent=2) + "\n"})
    return {"path": str(path), "profile": str(dest), "calibrates": meta["calibrates"],
            "compute_stat": cluster.compute_stat, "compute_scale": new[key], "step": step,
            "replaced": old.get(key) if db.calibration is None else None}


def _now() -> str:
    import datetime

    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def _profile_label(c: dict[str, Any]) -> str:
    if not c["profile"]:
        return "none: hardware specs"
    label = f"{c['profile']}, {c.get('compute_stat', 'median')} of its compute rows"
    return label + (f", calibrated by {c['calibrated_by']}" if c.get("calibrated_by") else "")


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
