"""The local moves of the search: from a plan the DES has simulated, the neighbouring plans
that attack what the DES says is its bottleneck (exposed communication, the slowest
pipeline stage, spare memory)."""

from __future__ import annotations

import dataclasses
from typing import Any

from optimizer.scoring import Candidate
from optimizer.space import SearchSpace
from sim.cost.profiled import cost_model_for
from sim.errors import SpecError
from sim.result import Result
from sim.spec.plan import Plan, validate


def _collective_moves(p: Plan, r: Result) -> list[tuple[str, Plan]]:
    from sim.spec.plan import ALGORITHMS

    comm = r.communication
    group = max(("tp", "dp", "ep"), key=lambda g: (comm[g]["exposed_s"], g))
    if comm[group]["exposed_s"] <= 0:
        return []
    current = p.algorithm(group)
    out = []
    for algo in ALGORITHMS[group]:
        if algo in ("auto", current):
            continue
        coll = tuple(sorted({**dict(p.collectives), group: algo}.items()))
        out.append((f"{group} collectives: {algo}", dataclasses.replace(p, collectives=coll)))
    return out


def _dispatcher_moves(p: Plan, r: Result) -> list[tuple[str, Plan]]:
    """The other MoE token dispatchers and ways to hide the all-to-alls, when expert-
    parallel communication is exposed (invalid pairs are dropped by validation)."""
    from sim.spec.experts import OVERLAPS
    from sim.spec.routing import DISPATCHERS

    if p.ep == 1 or r.communication["ep"]["exposed_s"] <= 0:
        return []
    changes: list[tuple[str, dict[str, Any]]] = [
        (f"dispatcher {d}", {"moe_dispatcher": d}) for d in DISPATCHERS
        if d != p.moe_dispatcher]
    # operator overlap is MegaScale-MoE's, which no framework the plans export to runs
    changes += [(f"overlap {o}", {"moe_overlap": o}) for o in OVERLAPS
                if o not in (p.moe_overlap, "operator")]
    out = []
    for name, change in changes:
        try:
            out.append((name, dataclasses.replace(p, **change)))
        except SpecError:  # e.g. a2a overlap with full recomputation
            continue
    return out


def _cp_moves(p: Plan, r: Result) -> list[tuple[str, Plan]]:
    """The other context-parallel exchanges when the plan's is exposed (Ulysses where the
    heads do not split is dropped by validation)."""
    from sim.spec.batch import CP_COMMS

    if p.cp == 1 or r.communication["cp"]["exposed_s"] <= 0:
        return []
    return [(f"cp exchange {c}", dataclasses.replace(p, cp_comm=c)) for c in CP_COMMS
            if c != p.cp_comm]


def _stage_moves(space: SearchSpace, p: Plan) -> list[tuple[str, Plan]]:
    """Shift one layer off the slowest pipeline stage onto the fastest (1F1B only)."""
    from sim.analytic.iteration import stage_costs
    from sim.layout.stages import virtual_stage_layers

    if p.pp == 1 or p.vpp > 1:
        return []
    costs = stage_costs(space.model, space.cluster, p, cost_model_for(space.cluster))
    times = [c.per_microbatch_s for c in costs]
    slow, fast = times.index(max(times)), times.index(min(times))
    layers = virtual_stage_layers(p, space.model)
    if slow == fast or layers[slow] <= 1:
        return []
    layers[slow] -= 1
    layers[fast] += 1
    return [(f"layer from stage {slow} to {fast}",
             dataclasses.replace(p, layers_per_stage=tuple(layers)))]


def _memory_moves(space: SearchSpace, p: Plan, peak_gib: float) -> list[tuple[str, Plan]]:
    out = []
    if peak_gib < 0.8 * space.cluster.gpu.memory_gib:
        if p.recompute != "none":
            out.append(("recompute none", dataclasses.replace(
                p, recompute="none", recompute_modules=None, recompute_replay="whole")))
        per_replica = p.global_batch_size // p.dp
        if per_replica % (2 * p.micro_batch_size) == 0 and (
                p.schedule != "interleaved-1f1b"
                or (per_replica // (2 * p.micro_batch_size)) % p.pp == 0):
            out.append(("micro-batch x2", dataclasses.replace(
                p, micro_batch_size=2 * p.micro_batch_size)))
    if p.pp > 1:
        other = "tp-cp-ep-pp-dp" if p.placement == "tp-cp-ep-dp-pp" else "tp-cp-ep-dp-pp"
        out.append((f"placement {other}", dataclasses.replace(p, placement=other)))
    return out


def neighbours(space: SearchSpace, c: Candidate) -> list[tuple[str, Plan]]:
    if c.des is None:  # more micro-batches than the DES runs: no bottleneck to move from
        return []
    moves = _collective_moves(c.plan, c.des) + _dispatcher_moves(c.plan, c.des) + \
        _cp_moves(c.plan, c.des) + _stage_moves(space, c.plan) + \
        _memory_moves(space, c.plan, c.peak_gib)
    valid = []
    for name, plan in moves:
        try:
            validate(plan, space.model, space.cluster)
        except SpecError:
            continue  # e.g. an algorithm the hardware lacks
        if space.constraints.admits(plan, space.model):
            valid.append((name, plan))
    return valid
