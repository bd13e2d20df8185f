"""Measured iteration times from ``trainsim compare --json`` results, for ``trainsim
calibrate``.

A comparison names the model, cluster and plan it ran and the measured iteration time (the
median over its timed steps): the run's row must name the same model (all of its fields),
cluster and plan, measured on the cluster's kind of device (a CPU run is no GPU cluster's),
but for the pipeline split a workload graph's comparison may have moved to where the run
can split (:func:`executor.compare.compare_graph`); the calibration then uses the split
that ran. A synchronisation comparison (``--task``) has no iteration time and is refused.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

from sim.errors import SpecError
from sim.io import read_text
from sim.spec.cluster import ClusterSpec
from sim.spec.model import ModelSpec
from sim.spec.plan import Plan
from sim.spec.workload import Workload

__all__ = ["compared_run"]


def compared_run(path: Path, model: ModelSpec | Workload, cluster: ClusterSpec, plan: Plan,
                 field: str = "compare") -> tuple[float, Plan]:
    """(measured iteration seconds, the plan that ran) of a ``trainsim compare --json``
    result, checked against the run's model, cluster and plan."""
    data = _load(path, field)
    if data["model"] != model.name:
        raise SpecError(field, f"{path.name} compares model {data['model']!r}, not "
                        f"{model.name!r}")
    measured = data["measured"] if isinstance(data.get("measured"), dict) else {}
    if "model" in measured and measured["model"] != json.loads(json.dumps(model.to_dict())):
        raise SpecError(field, f"{path.name} compares another model than the row's (the "
                        f"same name, {model.name!r}, other fields: a scaled run?)")
    if data["cluster"] != cluster.name:
        raise SpecError(field, f"{path.name} ran on cluster {data['cluster']!r}, not "
                        f"{cluster.name!r}")
    device = measured.get("device")
    if device and (device == "cpu") != (cluster.gpu.name == "cpu"):
        raise SpecError(field, f"{path.name} was measured on {device}, cluster "
                        f"{cluster.name!r} has {cluster.gpu.name} (compare --device)")
    return float(data["measured_s"]), _ran(data, model, plan, path, field)


def _ran(data: dict[str, Any], model: ModelSpec | Workload, plan: Plan, path: Path,
         field: str) -> Plan:
    """The plan that ran: the row's, or a workload graph's with its moved pipeline split."""
    try:
        ran = Plan.from_dict(data["plan"])
    except (SpecError, TypeError) as exc:
        raise SpecError(field, f"{path.name}'s plan: {exc}") from None
    mine = dataclasses.replace(plan, layers_per_stage=ran.layers_per_stage) \
        if isinstance(model, Workload) else plan
    if ran != mine:
        name = next(f.name for f in dataclasses.fields(Plan)
                    if getattr(ran, f.name) != getattr(mine, f.name))
        theirs, ours = (_shown(getattr(p, name)) for p in (ran, mine))
        raise SpecError(field, f"{path.name} ran another plan: its {name} is {theirs}, the "
                        f"row's {ours}")
    return ran


def _shown(value: Any) -> str:
    """A plan field as a message shows it (a sync section as its JSON)."""
    return json.dumps(value.to_dict()) if hasattr(value, "to_dict") else repr(value)


def _load(path: Path, field: str) -> dict[str, Any]:
    """The comparison's JSON object, with the keys calibrate reads and a positive time."""
    try:
        data = json.loads(read_text(path, field))
    except json.JSONDecodeError:
        data = None
    keys = ("model", "cluster", "plan", "measured_s")
    if isinstance(data, dict) and "task" in data:
        raise SpecError(field, f"{path.name} is a synchronisation (--task) comparison: it "
                        "has no iteration time to calibrate on")
    if not isinstance(data, dict) or any(k not in data for k in keys):
        raise SpecError(field, f"{path.name} is not a `trainsim compare --json` result (it "
                        f"needs {', '.join(keys)})")
    t = data["measured_s"]
    if isinstance(t, bool) or not isinstance(t, int | float) or not math.isfinite(t) or t <= 0:
        raise SpecError(field, f"{path.name}'s measured_s must be a positive number of "
                        f"seconds, got {t!r}")
    return data
