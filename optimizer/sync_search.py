"""Search over synchronisation strategies for a parallel plan: which sync kind, with which
parameters, over all-reduce or how many parameter servers where, compressed how.

Every candidate is simulated over many steps (:func:`sim.strategies.simulate_sync`: the
closed forms for all, then the multi-step DES for the best few); with a statistical-
efficiency model (``convergence``, fitted to measured runs) each also gets the updates and
the time to the target accuracy. The objective is time-to-accuracy (candidates without a
measured model, or predicted to diverge, are not ranked by it) or throughput. BSP over
all-reduce, the plan as given, is candidate 0 and the baseline; the Pareto set holds the
candidates no other beats on both throughput (samples/s) and statistical efficiency
(samples to the target).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from sim.errors import NoFeasiblePlan, SpecError
from sim.spec.cluster import ClusterSpec
from sim.spec.model import ModelSpec
from sim.spec.plan import Plan
from sim.spec.sync import as_bsp
from sim.spec.workload import Workload
from sim.strategies import covering_steps, simulate_sync
from sim.strategies.result import samples_per_update, strategy_label

__all__ = ["optimize_sync", "sync_candidates", "SyncSearch", "OBJECTIVES", "ranking_key",
           "pareto_of"]

OBJECTIVES = ("time-to-accuracy", "throughput")


def _servers(cluster: ClusterSpec, dp: int) -> list[int]:
    return sorted({s for s in (1, 2, 4, 8, cluster.nodes) if 1 <= s <= max(1, dp)})


def sync_candidates(plan: Plan, cluster: ClusterSpec) -> list[Plan]:
    """The strategies tried for ``plan`` (its own, BSP over all-reduce, first; the others
    without ZeRO, since each worker keeps whole replicas of its state)."""
    base = as_bsp(plan)
    out: list[dict[str, Any]] = [{}]
    out += [{"compression": c} for c in ("fp16", "int8", {"kind": "powersgd", "rank": 4})]
    for n in _servers(cluster, plan.dp):
        for place in ("dedicated", "colocated"):
            ps = {"architecture": "ps", "servers": n, "placement": place}
            out += [{"sync": "bsp", "communication": ps}, {"sync": "asp", "communication": ps}]
            out += [{"sync": {"kind": "ssp", "staleness": s}, "communication": ps}
                    for s in (1, 2, 4)]
            if plan.dp > 2:
                out.append({"sync": {"kind": "backup-workers", "backups": max(
                    1, plan.dp // 16)}, "communication": ps})
    out += [{"sync": {"kind": "local-sgd", "period": h}} for h in (2, 4, 8, 16, 32)]
    out += [{"sync": {"kind": "diloco", "period": h, "pseudo_gradient_dtype": "bf16"}}
            for h in (50, 500)]
    out += [{"sync": {"kind": "two-stage", "important_fraction": f}} for f in (0.1, 0.3)]
    if plan.dp > 2:
        out += [{"sync": "gossip"}, {"sync": {"kind": "gossip", "gossip_mode": "sgp",
                                              "graph": "exponential"}}]
    plans = []
    for fields in out:
        d = base.to_dict()
        if fields:  # every other strategy keeps whole replicas: no ZeRO sharding
            d["zero_stage"] = 0
        d.update({k: v for k, v in fields.items()})
        plans.append(Plan.from_dict(d))
    return plans


@dataclass
class SyncSearch:
    objective: str
    rows: list[dict[str, Any]]  # every candidate, best first
    baseline: dict[str, Any]
    pareto: list[str] = field(default_factory=list)  # strategy labels
    notes: list[str] = field(default_factory=list)

    @property
    def best(self) -> dict[str, Any]:
        return self.rows[0]


def _row(r: Any, plan: Plan) -> dict[str, Any]:
    t = r.time_to_target
    per_update = samples_per_update(plan, r.update_scope)
    samples = t["updates"] * per_update if t and not t["diverges"] else math.inf
    return {"strategy": r.strategy, "plan": plan, "fidelity": r.fidelity,
            "samples_per_s": r.samples_per_s, "updates_per_s": r.updates_per_s,
            "staleness_mean": r.staleness.get("mean"),
            "time_to_target_s": t["seconds"] if t else None,
            "time_band_s": (t["seconds_low"], t["seconds_high"]) if t else None,
            "diverges": bool(t and t["diverges"]), "samples_to_target": samples if t else None,
            "extrapolated": t.get("extrapolated", []) if t else [],
            "fits_in_memory": r.fits_in_memory}


def ranking_key(objective: str) -> Any:
    def key(row: dict[str, Any]) -> tuple[bool, float, str]:
        oom = not row.get("fits_in_memory", True)  # out of memory: last
        if objective == "throughput":
            return (oom, -row["samples_per_s"], row["strategy"])
        t = row["time_to_target_s"]
        return (oom, math.inf if t is None or row["diverges"] else t, row["strategy"])
    return key


def _no_family(exc: SpecError) -> bool:
    """Whether the convergence runs hold no model of the plan's family (none of its runs,
    too few that reached the target, or two-stage by named layers): its time-to-accuracy is
    left out and it ranks last, rather than the search failing."""
    text = str(exc)
    return (text.startswith("plan.sync.kind: no measured") or "runs reached the target" in text
            or exc.field == "plan.sync.important_layers")


def _simulate(model: Any, cluster: ClusterSpec, p: Plan, fidelity: str,
              kw: dict[str, Any]) -> dict[str, Any]:
    conv = kw.get("convergence")
    steps = covering_steps(p, kw["steps"])
    try:
        r = simulate_sync(model, cluster, p, fidelity, steps=steps, faults=kw["faults"],
                          convergence=conv, lr=kw.get("lr"), target=kw["target"])
    except SpecError as exc:
        if conv is None or not _no_family(exc):
            raise
        r = simulate_sync(model, cluster, p, fidelity, steps=steps, faults=kw["faults"])
        return {**_row(r, p), "untimed": str(exc)}  # why it has no time-to-accuracy
    return _row(r, p)


def optimize_sync(model: ModelSpec | Workload, cluster: ClusterSpec, plan: Plan,
                  objective: str = "time-to-accuracy", *, convergence: str | None = None,
                  lr: float | None = None, target: float = 0.95, des_top: int = 5,
                  steps: int = 200, faults: Any = None) -> SyncSearch:
    """Rank the strategies of :func:`sync_candidates` for ``plan`` by ``objective``."""
    if objective not in OBJECTIVES:
        raise SpecError("--objective", f"must be one of {', '.join(OBJECTIVES)}, got "
                        f"{objective!r}")
    if objective == "time-to-accuracy" and (convergence is None or lr is None):
        raise SpecError("--convergence", "time-to-accuracy needs a statistical-efficiency "
                        "model and the learning rate (--convergence digits-cpu --lr 0.2), or "
                        "--objective throughput")
    if plan.dp < 2:
        raise NoFeasiblePlan(f"plan.dp = {plan.dp}: one data-parallel worker has nothing to "
                             "synchronise")
    kw = {"convergence": convergence, "lr": lr, "target": target, "steps": steps,
          "faults": faults}
    candidates = sync_candidates(plan, cluster)
    found = [_simulate(model, cluster, p, "analytic", kw) for p in candidates]
    key = ranking_key(objective)
    found.sort(key=key)
    for i, row in enumerate(found[:des_top]):  # the best few again, in the DES
        found[i] = _simulate(model, cluster, row["plan"], "des", kw)
    label = strategy_label(candidates[0])
    at = next(i for i, r in enumerate(found) if r["strategy"] == label)
    if found[at]["fidelity"] != "des":  # the baseline always in the DES
        found[at] = _simulate(model, cluster, found[at]["plan"], "des", kw)
    baseline = found[at]
    found.sort(key=key)
    return SyncSearch(objective, found, baseline, pareto_of(found), _notes(found, baseline, key))


def pareto_of(rows: list[dict[str, Any]]) -> list[str]:
    """The labels of the rows no other beats on both throughput and samples to target."""
    pts = [r for r in rows if r["samples_to_target"] not in (None, math.inf)]
    out = []
    for r in pts:
        if not any(o["samples_per_s"] >= r["samples_per_s"] and o["samples_to_target"]
                   <= r["samples_to_target"] and (o["samples_per_s"] > r["samples_per_s"]
                                                  or o["samples_to_target"]
                                                  < r["samples_to_target"]) for o in pts):
            out.append(r["strategy"])
    return out


def _notes(rows: list[dict[str, Any]], baseline: dict[str, Any], key: Any) -> list[str]:
    out = []
    if key(rows[0]) > key(baseline):
        out.append("no candidate beats the baseline (BSP over all-reduce)")
    oom = sum(not r.get("fits_in_memory", True) for r in rows)
    if oom:
        out.append(f"{oom} candidate(s) do not fit in memory (whole replicas, no ZeRO): "
                   "ranked last")
    if rows[0]["fidelity"] != "des":
        out.append("the best was ranked by the closed forms only")
    if rows[0]["extrapolated"]:
        out.append("the best's statistical efficiency is extrapolated: "
                   + "; ".join(rows[0]["extrapolated"]))
    untimed = sorted({r["untimed"] for r in rows if r.get("untimed")})
    if untimed:
        n = sum(bool(r.get("untimed")) for r in rows)
        out.append(f"{n} candidate(s) have no time-to-accuracy, ranked last: "
                   + "; ".join(untimed))
    return out
