"""Balancing a plan on a heterogeneous cluster: more layers on the pipeline stages of faster
GPUs, more micro-batches for the data-parallel replicas of faster GPUs.

A stage's speed is the inverse of its slowest device's compute scale (over every replica,
since all replicas share one layer split); a replica's is the inverse of its slowest
stage's. Counts start proportional to speed (largest remainder, at least one each) and are
then refined with the analytic tier, moving one layer or one micro-batch (``pp`` of them
under interleaved 1F1B; never below ``2 pp`` under DualPipeV) from the slowest stage or
replica to the fastest while the step gets shorter. A pipeline rank's layers are those of
its virtual stages (every ``pp``-th, or DualPipeV's V).

>>> proportional(10, [1.0, 1.5])
[4, 6]
>>> proportional(12, [1.0, 3.0], unit=2)
[4, 8]
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from sim.analytic.replicas import replica_stage_scales, replica_timings
from sim.cost.costmodel import CostModel
from sim.cost.scales import gpu_compute_scales
from sim.errors import SpecError
from sim.layout.stages import mirrored, rank_virtual_stages, virtual_stage_rank
from sim.spec.cluster import ClusterSpec
from sim.spec.model import ModelSpec
from sim.spec.plan import Plan, validate

__all__ = ["proportional", "balanced_variants", "balanced", "refine", "even_form"]


def proportional(total: int, weights: Sequence[float], unit: int = 1, least: int = 1
                 ) -> list[int]:
    """``total`` split in multiples of ``unit`` proportionally to ``weights``, at least
    ``least`` units each, by largest remainder (ties to the lower index)."""
    units = total // unit
    share = [w / sum(weights) * units for w in weights]
    out = [max(least, int(s)) for s in share]
    order = sorted(range(len(out)), key=lambda i: (-(share[i] - int(share[i])), i))
    k = 0
    while sum(out) < units:
        out[order[k % len(out)]] += 1
        k += 1
    while sum(out) > units:  # minimums pushed it over: take from the largest
        out[max(range(len(out)), key=lambda i: (out[i], -i))] -= 1
    return [n * unit for n in out]


def _layers(plan: Plan, model: ModelSpec, stage_speed: list[float]) -> tuple[int, ...]:
    if mirrored(plan):  # stage s sits on ranks s and pp - 1 - s: the slower one sets its pace
        pp = plan.pp
        return tuple(proportional(model.num_layers, [
            min(stage_speed[s], stage_speed[pp - 1 - s]) for s in range(pp)]))
    weights = [stage_speed[virtual_stage_rank(plan, k)] for k in range(plan.pp * plan.vpp)]
    return tuple(proportional(model.num_layers, weights))


def _micro_unit(plan: Plan) -> tuple[int, int]:
    """(step, least) of a replica's micro-batches: ``pp`` at a time under interleaved 1F1B,
    at least ``2 pp`` under DualPipeV, two at a time and at least ``2 pp`` under DualPipe
    (half enter at each end), else one and one."""
    if plan.schedule == "interleaved-1f1b":
        return plan.pp, plan.pp
    if mirrored(plan):
        return 2, 2 * plan.pp
    return 1, 2 * plan.pp if plan.schedule == "dualpipev" else 1


def _micro(plan: Plan, replica_speed: list[float]) -> tuple[int, ...]:
    unit, least = _micro_unit(plan)
    total = plan.global_batch_size // plan.micro_batch_size
    return tuple(proportional(total, replica_speed, unit, least // unit))


def balanced_variants(model: ModelSpec, cluster: ClusterSpec, plan: Plan
                      ) -> list[tuple[str, Plan]]:
    """Uneven layers, uneven micro-batches and both, where the devices' speeds differ
    across stages or replicas (none on a homogeneous cluster); only valid plans."""
    rs = replica_stage_scales(plan, gpu_compute_scales(model, cluster, plan))
    stage_speed = [1 / max(rs[d][s] for d in range(plan.dp)) for s in range(plan.pp)]
    replica_speed = [1 / max(row) for row in rs]
    edits: list[tuple[str, dict]] = []
    if plan.pp > 1 and len(set(stage_speed)) > 1:
        edits.append(("layers", {"layers_per_stage": _layers(plan, model, stage_speed)}))
    if plan.dp > 1 and len(set(replica_speed)) > 1 and plan.zero_stage <= 1 and plan.ep == 1:
        edits.append(("micro-batches",
                      {"micro_batches_per_replica": _micro(plan, replica_speed)}))
    if len(edits) == 2:
        edits.append(("layers + micro-batches", edits[0][1] | edits[1][1]))
    out = []
    for name, change in edits:
        try:
            candidate = even_form(dataclasses.replace(plan, **change), model)
            validate(candidate, model, cluster)
        except SpecError:
            continue
        out.append((name, candidate))
    return out


def even_form(plan: Plan, model: ModelSpec) -> Plan:
    """``plan`` with a split that is even written as the default (``None``)."""
    mbr, lps = plan.micro_batches_per_replica, plan.layers_per_stage
    if mbr and len(set(mbr)) == 1 and mbr[0] * plan.dp * plan.micro_batch_size \
            == plan.global_batch_size:
        plan = dataclasses.replace(plan, micro_batches_per_replica=None)
    if lps and len(set(lps)) == 1 and model.num_layers % len(lps) == 0:
        plan = dataclasses.replace(plan, layers_per_stage=None)
    return plan


def _moves(plan: Plan, classes: list[list[int]]) -> list[Plan]:
    """One layer from any pipeline rank to any other (from its fullest virtual stage to the
    other's emptiest); one micro-batch (``pp`` under interleaved 1F1B) from the fullest
    replica of one speed class to the emptiest of another."""
    out = []
    lps, pp = plan.layers_per_stage, plan.pp
    for a, b in _pairs(pp if lps else 0):  # pipeline ranks; their fullest / emptiest chunk
        assert lps is not None  # (under DualPipe lps lists the stages each chain runs)
        src = max((vs % len(lps) for vs in rank_virtual_stages(plan, a)),
                  key=lambda k: (lps[k], -k))
        dst = min((vs % len(lps) for vs in rank_virtual_stages(plan, b)),
                  key=lambda k: (lps[k], k))
        if lps[src] > 1:
            new = list(lps)
            new[src], new[dst] = new[src] - 1, new[dst] + 1
            out.append(dataclasses.replace(plan, layers_per_stage=tuple(new)))
    mbr = plan.micro_batches_per_replica
    unit, least = _micro_unit(plan)
    for ca, cb in _pairs(len(classes) if mbr else 0):
        assert mbr is not None
        a = max(classes[ca], key=lambda d: (mbr[d], -d))
        b = min(classes[cb], key=lambda d: (mbr[d], d))
        if mbr[a] - unit >= least:
            new = list(mbr)
            new[a], new[b] = new[a] - unit, new[b] + unit
            out.append(dataclasses.replace(plan, micro_batches_per_replica=tuple(new)))
    return out


def _pairs(n: int) -> list[tuple[int, int]]:
    return [(a, b) for a in range(n) for b in range(n) if a != b]


def _speed_classes(model: ModelSpec, cluster: ClusterSpec, plan: Plan) -> list[list[int]]:
    """Replicas grouped by their stages' scales (replicas alike in speed)."""
    rs = replica_stage_scales(plan, gpu_compute_scales(model, cluster, plan))
    groups: dict[tuple[float, ...], list[int]] = {}
    for d, row in enumerate(rs):
        groups.setdefault(tuple(row), []).append(d)
    return list(groups.values())


def _objective(model: ModelSpec, cluster: ClusterSpec, plan: Plan, cost: CostModel
               ) -> tuple[float, ...]:
    """Replica step times, slowest first: the step, then how close the others are to it
    (so that evening out one of several equally slow replicas counts as progress)."""
    scales = gpu_compute_scales(model, cluster, plan)
    times = [t.iteration_s for t in replica_timings(model, cluster, plan, cost, scales)]
    return tuple(sorted(times, reverse=True))


def refine(model: ModelSpec, cluster: ClusterSpec, plan: Plan, cost: CostModel,
           fits: Callable[[Plan], bool], rounds: int = 96) -> Plan:
    """Greedy descent over :func:`_moves` on the analytic replica times, slowest first
    (compared as tuples); ``fits``: the memory check; at most ``rounds`` moves."""
    best = _objective(model, cluster, plan, cost)
    classes = _speed_classes(model, cluster, plan)
    for _ in range(rounds):
        scored = [(_objective(model, cluster, p, cost), i, p)
                  for i, p in enumerate(_moves(plan, classes)) if fits(p)]
        if not scored:
            break
        objective, _, candidate = min(scored, key=lambda t: (t[0], t[1]))
        if objective >= best:
            break
        plan, best = candidate, objective
    return even_form(plan, model)


def _explicit_even(plan: Plan, model: ModelSpec, like: Plan) -> Plan:
    """``plan`` with an even split written out wherever ``like`` has an uneven one (a start
    for :func:`refine` that shifts work only as far as memory allows)."""
    change: dict = {}
    if like.layers_per_stage is not None:
        stages = plan.pp if mirrored(plan) else plan.pp * plan.vpp
        change["layers_per_stage"] = tuple(proportional(model.num_layers, [1.0] * stages))
    if like.micro_batches_per_replica is not None:
        unit, least = _micro_unit(plan)
        change["micro_batches_per_replica"] = tuple(proportional(
            plan.global_batch_size // plan.micro_batch_size, [1.0] * plan.dp, unit,
            least // unit))
    return dataclasses.replace(plan, **change)


def balanced(model: ModelSpec, cluster: ClusterSpec, plan: Plan, cost: CostModel,
             fits: Callable[[Plan], bool]) -> list[tuple[str, Plan]]:
    """:func:`balanced_variants` of ``plan``, each refined; a variant that does not fit in
    memory is approached from the even split instead, as far as memory allows. Variants
    that end up even are left out."""
    out = []
    for name, variant in balanced_variants(model, cluster, plan):
        start = variant if fits(variant) else _explicit_even(plan, model, variant)
        if not fits(start):
            continue
        tuned = refine(model, cluster, start, cost, fits)
        if tuned.layers_per_stage is not None or tuned.micro_batches_per_replica is not None:
            out.append((name if start is variant else f"{name}, memory-bound", tuned))
    return out
