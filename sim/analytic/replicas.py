"""The analytic tier replica by replica: on heterogeneous clusters, with stragglers, or
when data-parallel replicas run different numbers of micro-batches, each replica (each
stage at its slowest device's scale, :mod:`sim.cost.scales`) is evaluated as an even plan
of its own and the slowest one sets the iteration.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence

from sim.analytic.iteration import analytic_iteration
from sim.cost.costmodel import CostModel
from sim.cost.scales import gpu_compute_scales
from sim.layout.placement import stage_devices
from sim.result import Timing
from sim.spec.cluster import ClusterSpec
from sim.spec.model import ModelSpec
from sim.spec.plan import Plan, replica_plan

__all__ = ["replica_stage_scales", "replica_analytic", "replica_timings", "analytic_timing",
           "fabrics_differ",
           "analytic_lower_bound", "bounds_below"]


def replica_stage_scales(plan: Plan, scales: Sequence[float] | None) -> list[list[float]]:
    """``[replica][stage]``: the slowest device's scale (a stage runs at its slowest rank;
    TP and CP ranks wait for each other every layer). All ones without scales."""
    if scales is None:
        return [[1.0] * plan.pp for _ in range(plan.dp)]
    pl = plan.placement

    def dev(r: int) -> int:
        return r if isinstance(pl, str) else pl[r]

    return [[max(scales[dev(r)] for r in stage_devices(plan, d, s)) for s in range(plan.pp)]
            for d in range(plan.dp)]


def replica_timings(model: ModelSpec, cluster: ClusterSpec, plan: Plan, cost: CostModel,
                    scales: Sequence[float] | None) -> list[Timing]:
    """The analytic tier replica by replica: each replica (its micro-batch count, each stage
    at its slowest device's scale) runs as an even plan of its own; alike replicas share
    one evaluation."""
    per_stage = replica_stage_scales(plan, scales)
    seen: dict[tuple, Timing] = {}
    out = []
    differ = fabrics_differ(cluster)
    for d, m in enumerate(plan.replica_microbatches):
        local = _own_fabric(cluster, plan, d) if differ else None
        key = (m, tuple(per_stage[d]), local)
        if key not in seen:
            seen[key] = analytic_iteration(model, cluster, replica_plan(plan, d), cost,
                                           per_stage[d] if scales is not None else None,
                                           local=local)
        out.append(seen[key])
    return out


def fabrics_differ(cluster: ClusterSpec) -> bool:
    """Whether node groups differ in their node fabric (the closed form then times each
    replica's tensor, context and pipeline groups on its own nodes' fabric)."""
    return len({g.intra_GBps for g in cluster.node_groups}) > 1


def _own_fabric(cluster: ClusterSpec, plan: Plan, replica: int) -> ClusterSpec | None:
    """The cluster as replica ``replica``'s own groups see it: every node's fabric its
    slowest node's (as the flow network runs them; the collective's algorithm and
    efficiency stay the cluster's, its first group's device's, in both tiers); None where
    the replica's is the slowest anyway (node fabrics differ: :func:`fabrics_differ`)."""
    pl, g = plan.placement, cluster.gpus_per_node
    nodes = {(r if isinstance(pl, str) else pl[r]) // g for s in range(plan.pp)
             for r in stage_devices(plan, replica, s)}
    return _with_fabric(cluster, min(cluster.node_intra_GBps(n) for n in nodes))


@functools.lru_cache(maxsize=256)
def _with_fabric(cluster: ClusterSpec, intra_GBps: float) -> ClusterSpec | None:
    if intra_GBps == cluster.intra_GBps:
        return None
    return dataclasses.replace(cluster, node_groups=tuple(
        dataclasses.replace(x, intra_GBps=intra_GBps) for x in cluster.node_groups))


def replica_analytic(model: ModelSpec, cluster: ClusterSpec, plan: Plan, cost: CostModel,
                     scales: Sequence[float] | None) -> Timing:
    """The slowest replica's :func:`replica_timings`: the gradient reduction waits for
    every replica (each one's reduction is taken to overlap its own last backward: the
    documented approximation)."""
    return max(replica_timings(model, cluster, plan, cost, scales),
               key=lambda t: t.iteration_s)


def bounds_below(model: ModelSpec, cluster: ClusterSpec, plan: Plan) -> bool:
    """Whether :func:`analytic_lower_bound` gives a bound rather than the time: DualPipeV
    with even replicas on devices of one compute speed."""
    return plan.schedule == "dualpipev" and plan.micro_batches_per_replica is None \
        and gpu_compute_scales(model, cluster, plan) is None and not fabrics_differ(cluster)


def analytic_lower_bound(model: ModelSpec, cluster: ClusterSpec, plan: Plan,
                         cost: CostModel) -> float:
    """At most :func:`analytic_timing`'s iteration seconds, and cheaper where
    :func:`bounds_below` (a DualPipeV pipeline phase bounded by its ranks' work, in time
    independent of the micro-batches); the time itself otherwise."""
    if bounds_below(model, cluster, plan):
        return analytic_iteration(model, cluster, plan, cost, dualpipev_bound=True).iteration_s
    return analytic_timing(model, cluster, plan, cost).iteration_s


def analytic_timing(model: ModelSpec, cluster: ClusterSpec, plan: Plan, cost: CostModel
                    ) -> Timing:
    """The analytic tier on any cluster: per replica where devices or replicas differ."""
    scales = gpu_compute_scales(model, cluster, plan)
    if scales is None and plan.micro_batches_per_replica is None \
            and not fabrics_differ(cluster):
        return analytic_iteration(model, cluster, plan, cost)
    return replica_analytic(model, cluster, plan, cost, scales)
