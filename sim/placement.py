"""Where each parallel group's ranks sit: how many share a node, how many nodes, pods.

Ranks are laid out by ``plan.placement``, innermost dimension first: with the default
``tp-cp-ep-dp-pp`` the ``tp`` ranks of a group are consecutive devices. ``ep`` is the inner
part of ``dp`` (``dp = ep * dp_outer``), so the ``dp`` group spans both the ``ep`` and the
outer ``dp`` dimension, while expert weights are reduced over ``edp`` (the outer part only).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from sim.cluster import ClusterSpec
from sim.plan import DIMS, Plan

__all__ = ["GroupSpan", "GROUP_DIMS", "group_span", "dim_sizes"]

# Parallel group -> the placement dimensions it spans.
GROUP_DIMS = {
    "tp": ("tp",), "cp": ("cp",), "ep": ("ep",), "pp": ("pp",),
    "dp": ("ep", "dp", "cp"),  # dense gradients: every replica of a weight (dp and cp)
    "edp": ("dp", "cp"),  # expert gradients: replicas of one expert shard
}


@dataclass(frozen=True)
class GroupSpan:
    """The worst-placed group of a kind: ``size`` ranks, at most ``per_node`` on a node,
    spread over ``nodes`` nodes; ``cross_pod`` when it leaves a full-bisection pod."""

    size: int
    per_node: int
    nodes: int
    cross_pod: bool


def dim_sizes(plan: Plan) -> dict[str, int]:
    return {"tp": plan.tp, "cp": plan.cp, "ep": plan.ep, "dp": plan.dp // plan.ep, "pp": plan.pp}


def _strides(plan: Plan) -> dict[str, int]:
    sizes, strides, stride = dim_sizes(plan), {}, 1
    for d in plan.placement_order:
        strides[d] = stride
        stride *= sizes[d]
    return strides


def _ranks(plan: Plan, dims: tuple[str, ...], base: int) -> list[int]:
    sizes, strides = dim_sizes(plan), _strides(plan)
    ranges = [range(0, sizes[d] * strides[d], strides[d]) for d in dims]
    return [base + sum(c) for c in itertools.product(*ranges)]


def _span(devices: list[int], cluster: ClusterSpec) -> GroupSpan:
    per_node: dict[int, int] = {}
    for d in devices:
        per_node[d // cluster.gpus_per_node] = per_node.get(d // cluster.gpus_per_node, 0) + 1
    pods = {d // cluster.pod_size for d in devices}
    return GroupSpan(len(devices), max(per_node.values()), len(per_node), len(pods) > 1)


def _bases(plan: Plan, dims: tuple[str, ...]) -> list[int]:
    others = tuple(d for d in DIMS if d not in dims)
    return _ranks(plan, others, 0)


def group_span(plan: Plan, cluster: ClusterSpec, group: str) -> GroupSpan:
    """Span of the ``group`` groups. With a rank-order placement all groups of a kind are
    alike up to translation, so group 0 is measured; with an explicit rank table every group
    is measured and the one over the most nodes (fewest per node) is returned."""
    dims = tuple(d for d in GROUP_DIMS[group] if dim_sizes(plan)[d] > 1) or ("tp",)[:0]
    if isinstance(plan.placement, str):
        return _span(_ranks(plan, dims, 0), cluster)
    table = plan.placement
    spans = [_span([table[r] for r in _ranks(plan, dims, b)], cluster)
             for b in _bases(plan, dims)]
    return max(spans, key=lambda s: (s.cross_pod, s.nodes, -s.per_node))
