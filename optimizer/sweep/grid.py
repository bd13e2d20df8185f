"""Sweeps: a grid of what-if points, each simulated (or optimized) on its own.

A point is a dict of parameter values, one per axis of the grid: cluster keys
(``inter_node.nic_Gbps``, ``gpu``, ``nodes``, ...), plan keys (``tp``, ``pp``,
``micro_batch_size``, ``recompute``, ...), ``fidelity`` (analytic or des), ``model`` and
``straggler`` (a slow-down factor as on ``simulate --straggler``: ``node:3=1.2``; a list
of them, or ``none``).
Fixed edits (``--set``) apply to every point. The plan of a point is the base plan (a plan
file, else the defaults) with the fixed and the point's plan edits; ``dp`` fills the
cluster (``world / (tp*pp*cp)``) unless it is set or varied. With ``optimize`` the
optimizer chooses the plan of every point instead.

A point's key is its parameters as canonical JSON; its row holds only deterministic
figures (no wall-clock times), so a sweep run twice, resumed, or run on Ray gives the
same rows. A point whose combination is invalid (``tp`` not dividing the heads, a batch
that does not split) becomes a row with ``status = "invalid"`` and the one-line error;
a bad key or value fails the whole sweep before anything runs.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from dataclasses import dataclass
from typing import Any

from optimizer.constraints import Constraints
from sim.api import FIDELITIES, simulate
from sim.errors import NoFeasiblePlan, SpecError, field_name
from sim.result import Result
from sim.spec.cluster import ClusterSpec, load_cluster
from sim.spec.faults import Faults, faults_from_options
from sim.spec.model import ModelSpec
from sim.spec.plan import Plan, load_plan
from sim.spec.scenario import (
    Edit,
    apply_cluster_edits,
    check_gpu,
    check_key,
    is_cluster_key,
    plan_from_fields,
)
from sim.spec.zoo import load_model

__all__ = ["SweepSpec", "EXTRA_KEYS", "grid_points", "point_key", "sort_key", "check_spec",
           "evaluate_point", "plan_for_point"]

EXTRA_KEYS = ("fidelity", "model", "straggler")
_OPTIMIZE_PLAN_KEYS = ("global_batch_size", "seq_len", "dtype")  # what optimize takes
SCHEMA_VERSION = 1


@dataclass(frozen=True)
class SweepSpec:
    """Everything that defines a sweep: the base inputs, fixed edits and the grid axes."""

    model: str
    cluster: str
    fidelity: str = "analytic"
    fixed: tuple[Edit, ...] = ()
    axes: tuple[tuple[str, tuple[Any, ...]], ...] = ()
    plan_file: str | None = None
    optimize: bool = False
    top_k: int = 4
    constraints: Constraints = Constraints()  # of the optimizer, with optimize

    @property
    def size(self) -> int:
        n = 1
        for _, values in self.axes:
            n *= len(values)
        return n

    def identity(self) -> dict[str, Any]:
        """What a resumed sweep must share with the one that wrote the file (the axes may
        grow: points are keyed by their values)."""
        d = self.to_dict()
        d.pop("axes")
        return d

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["fixed"] = [list(e) for e in self.fixed]
        d["axes"] = [[k, list(v)] for k, v in self.axes]
        if self.constraints == Constraints():  # as sweeps written before constraints existed
            d.pop("constraints")
        else:
            d["constraints"]["fixed"] = [list(f) for f in self.constraints.fixed]
        return d


def grid_points(spec: SweepSpec) -> list[dict[str, Any]]:
    """Every combination of the axes' values, first axis outermost."""
    names = [k for k, _ in spec.axes]
    return [dict(zip(names, combo, strict=True))
            for combo in itertools.product(*(v for _, v in spec.axes))]


def point_key(params: dict[str, Any]) -> str:
    """The canonical key of a point: ``{"inter_node.nic_Gbps":800,"tp":2}``."""
    return json.dumps(params, sort_keys=True, separators=(",", ":"))


def sort_key(params: dict[str, Any], names: list[str]) -> tuple[Any, ...]:
    """Numbers in numeric order, then everything else by its text, axis by axis."""
    def one(v: Any) -> tuple[int, Any]:
        return (0, v) if isinstance(v, int | float) and not isinstance(v, bool) else (1, str(v))
    return tuple(one(params.get(k)) for k in names)


# Checking a spec before anything runs ------------------------------------------------------
def check_spec(spec: SweepSpec) -> None:
    """Every key known, every cluster value valid on the base cluster on its own, models and
    fidelities known, and the batch given. Raises a one-line SpecError."""
    axis_names = [k for k, _ in spec.axes]
    for key in [k for k, _ in spec.fixed] + axis_names:
        check_key(key, EXTRA_KEYS)
    for key in {k for k in axis_names if axis_names.count(k) > 1}:
        raise SpecError(f"--vary {field_name(key)}", "is given twice")
    for key in set(axis_names) & {k for k, _ in spec.fixed}:
        raise SpecError(field_name(key), "is both fixed (--set) and varied (--vary)")
    for key, values in spec.axes:
        if not values:
            raise SpecError(f"--vary {field_name(key)}", "needs at least one value")
    _check_values(spec)
    _check_plan_inputs(spec)


def _values(spec: SweepSpec, key: str, default: Any) -> list[Any]:
    fixed = dict(spec.fixed)
    if key in fixed:
        return [fixed[key]]
    return list(dict(spec.axes).get(key, [default]))


def _check_values(spec: SweepSpec) -> None:
    for fidelity in _values(spec, "fidelity", spec.fidelity):
        if fidelity not in FIDELITIES:
            raise SpecError("fidelity", f"must be one of {', '.join(FIDELITIES)}, "
                            f"got {fidelity!r}")
    for value in _values(spec, "straggler", "none"):
        _faults(value)
    for ref in _values(spec, "model", spec.model):
        if not isinstance(ref, str):
            raise SpecError("model", f"must be a zoo name or a file, got {ref!r}")
        _model(ref)
    base = _cluster(spec.cluster)
    fixed = [e for e in spec.fixed if is_cluster_key(e[0])]
    apply_cluster_edits(base, fixed)
    for key, values in spec.axes:
        if is_cluster_key(key):
            for value in values:
                if key == "gpu":
                    check_gpu(value)
                apply_cluster_edits(base, fixed + [(key, value)])


def _check_plan_inputs(spec: SweepSpec) -> None:
    keys = {k for k, _ in spec.fixed} | {k for k, _ in spec.axes}
    plan_keys = {k for k in keys if not is_cluster_key(k) and k not in EXTRA_KEYS}
    if spec.optimize:
        for key in sorted(plan_keys - set(_OPTIMIZE_PLAN_KEYS)):
            raise SpecError(key, "is a plan field: with --optimize the optimizer chooses "
                            f"the plan (only {', '.join(_OPTIMIZE_PLAN_KEYS)} may be given)")
    have = set(_base_plan_fields(spec)) | plan_keys
    for key in ("global_batch_size", "seq_len"):
        if key not in have:
            raise SpecError(f"plan.{key}", "is required (--set, --vary, --plan or "
                            "--global-batch-size/--seq-len)")


# Evaluating one point (runs in worker processes) -------------------------------------------
_MODELS: dict[str, ModelSpec] = {}
_CLUSTERS: dict[str, ClusterSpec] = {}
_PLANS: dict[str, dict[str, Any]] = {}


def _model(ref: str) -> ModelSpec:
    if ref not in _MODELS:
        _MODELS[ref] = load_model(ref)
    return _MODELS[ref]


def _cluster(ref: str) -> ClusterSpec:
    if ref not in _CLUSTERS:
        _CLUSTERS[ref] = load_cluster(ref)
    return _CLUSTERS[ref]


def _faults(value: Any) -> Faults | None:
    """A ``straggler`` value: ``none``, ``node:3=1.2`` or a list of such."""
    if value == "none":
        return None
    items = value if isinstance(value, list) else [value]
    if not all(isinstance(v, str) for v in items):
        raise SpecError("straggler", f"must be SCOPE:NAME=FACTOR (e.g. node:3=1.2), a list "
                        f"of them, or none; got {value!r}")
    return faults_from_options([str(v) for v in items], option="straggler")


def _base_plan_fields(spec: SweepSpec) -> dict[str, Any]:
    if spec.plan_file is None:
        return {}
    if spec.plan_file not in _PLANS:
        _PLANS[spec.plan_file] = load_plan(spec.plan_file).to_dict()
    return dict(_PLANS[spec.plan_file])


def _edits(spec: SweepSpec, params: dict[str, Any]) -> list[Edit]:
    return list(spec.fixed) + list(params.items())


def plan_for_point(spec: SweepSpec, params: dict[str, Any], cluster: ClusterSpec) -> Plan:
    """The base plan with the fixed and the point's plan edits; ``dp`` fills the cluster
    unless it is given."""
    edits = {k: v for k, v in _edits(spec, params)
             if not is_cluster_key(k) and k not in EXTRA_KEYS}
    fields = _base_plan_fields(spec) | edits
    if "dp" not in edits:
        inner = [fields.get(k, 1) for k in ("tp", "pp", "cp")]
        if any(isinstance(d, bool) or not isinstance(d, int) or d < 1 for d in inner):
            return plan_from_fields(fields)  # Plan names the bad field
        per_replica = inner[0] * inner[1] * inner[2]
        if cluster.world_size % per_replica:
            raise SpecError("plan.dp", f"tp*pp*cp = {'*'.join(map(str, inner))} = "
                            f"{per_replica} does not divide the {cluster.world_size} GPUs")
        fields["dp"] = cluster.world_size // per_replica
    return plan_from_fields(fields)


def evaluate_point(spec: SweepSpec, params: dict[str, Any]) -> dict[str, Any]:
    """The row of one point: its figures, or ``status`` invalid/infeasible with the error."""
    head = {"key": point_key(params), "params": params}
    edits = dict(_edits(spec, params))
    try:
        model = _model(edits.get("model", spec.model))
        cluster = apply_cluster_edits(_cluster(spec.cluster), _edits(spec, params))
        fidelity = edits.get("fidelity", spec.fidelity)
        if spec.optimize:
            return head | _optimized(spec, model, cluster, edits, fidelity)
        plan = plan_for_point(spec, params, cluster)
        faults = _faults(edits.get("straggler", "none"))
        return head | _figures(simulate(model, cluster, plan, fidelity, faults=faults), plan)
    except NoFeasiblePlan as exc:
        return head | {"status": "infeasible", "error": str(exc)}
    except SpecError as exc:
        return head | {"status": "invalid", "error": str(exc)}


def _optimized(spec: SweepSpec, model: ModelSpec, cluster: ClusterSpec, edits: dict[str, Any],
               fidelity: str) -> dict[str, Any]:
    """The optimizer's best plan for the point (one process: the sweep is the parallel
    part), simulated at the point's fidelity."""
    from optimizer.search import optimize

    base = _base_plan_fields(spec) | {k: v for k, v in edits.items() if k in _OPTIMIZE_PLAN_KEYS}
    from optimizer.space import SearchSpace

    gbs, seq, dtype = base["global_batch_size"], base["seq_len"], base.get("dtype", "bf16")
    rep = optimize(model, cluster, gbs, seq, top_k=spec.top_k, workers=1, progress=False,
                   space=SearchSpace(model, cluster, gbs, seq, dtype,
                                     constraints=spec.constraints))
    plan = rep.best.plan
    result = rep.best.des if fidelity == "des" and rep.best.des else \
        simulate(model, cluster, plan, fidelity)
    return _figures(result, plan)


def _figures(r: Result, plan: Plan) -> dict[str, Any]:
    from optimizer.report import plan_label

    return {"status": "ok", "fidelity": r.fidelity, "gpus": r.gpus,
            "iteration_time_s": r.iteration_time_s, "tokens_per_s": r.tokens_per_s,
            "mfu": r.mfu, "model_tflops_per_gpu": r.model_tflops_per_gpu,
            "peak_memory_gib": r.peak_memory_gib, "fits_in_memory": r.fits_in_memory,
            "bubble_fraction": r.bubble_fraction, "breakdown": dict(r.breakdown),
            "plan": plan_label(plan), "dp": plan.dp}
