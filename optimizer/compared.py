"""Measured iteration times from ``trainsim compare --json`` results, for ``trainsim
calibrate``.

A comparison names the model, cluster and plan it ran and the measured iteration time (the
median over its timed steps): the run's row must name the same model and cluster and the
same plan, but for the pipeline split a workload graph's comparison may have moved to where
the run can split (:func:`executor.compare.compare_graph`); the calibration then uses the
split that ran.
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
    if data["cluster"] != cluster.name:
        raise SpecError(field, f"{path.name} ran on cluster {data['cluster']!r}, not "
                        f"{cluster.name!r}")
    try:
        ran = Plan.from_dict(data["plan"])
    except (SpecError, TypeError) as exc:
        raise SpecError(field, f"{path.name}'s plan: {exc}") from None
    mine = dataclasses.replace(plan, layers_per_stage=ran.layers_per_stage)
    if ran != mine:
        name = next(f.name for f in dataclasses.fields(Plan)
                    if getattr(ran, f.name) != getattr(mine, f.name))
        raise SpecError(field, f"{path.name} ran another plan: its {name} is "
                        f"{getattr(ran, name)!r}, the row's {getattr(mine, name)!r}")
    return float(data["measured_s"]), ran


def _load(path: Path, field: str) -> dict[str, Any]:
    """The comparison's JSON object, with the keys calibrate reads and a positive time."""
    try:
        data = json.loads(read_text(path, field))
    except json.JSONDecodeError:
        data = None
    keys = ("model", "cluster", "plan", "measured_s")
    if not isinstance(data, dict) or any(k not in data for k in keys):
        raise SpecError(field, f"{path.name} is not a `trainsim compare --json` result (it "
                        f"needs {', '.join(keys)})")
    t = data["measured_s"]
    if isinstance(t, bool) or not isinstance(t, int | float) or not math.isfinite(t) or t <= 0:
        raise SpecError(field, f"{path.name}'s measured_s must be a positive number of "
                        f"seconds, got {t!r}")
    return data
