"""Where each parallel group's ranks sit: how many share a node, how many nodes, pods.

Ranks are laid out by ``plan.placement``, innermost dimension first: with the default
``tp-cp-ep-dp-pp`` the ``tp`` ranks of a group are consecutive devices. The ``ep`` dimension
is the inner part of ``dp`` that one expert block spans (``dp = ep_inner * dp_outer``,
:mod:`sim.spec.experts`; ``ep_inner = ep`` unless the expert grid is folded), so the ``dp``
group spans both, while expert weights are reduced over ``edp`` (the outer part only). A
folded plan's ``ep`` and ``edp`` groups follow Megatron-LM's expert grid rank by rank.
``emb`` is Megatron-LM's embedding group: the first and the last rank of each pipeline group
(they all-reduce the tied word embedding's gradient).
"""

from __future__ import annotations

import bisect
import functools
import itertools
from collections import Counter
from dataclasses import dataclass

from sim.spec.cluster import ClusterSpec
from sim.spec.experts import ep_inner, expert_tp, is_folded
from sim.spec.plan import DEFAULT_PLACEMENT, DIMS, Plan

__all__ = ["site_aware", "wan_crossings", "SITE_PLACEMENT", "GroupSpan", "GROUP_DIMS", "group_span",
           "dim_sizes", "rank_coords", "groups_of", "framework_rank_table", "stage_devices"]

# Parallel group -> the placement dimensions it spans.
GROUP_DIMS = {
    "tp": ("tp",), "cp": ("cp",), "ep": ("ep",), "pp": ("pp",),
    "dp": ("ep", "dp", "cp"),  # dense gradients: every replica of a weight (dp and cp)
    "edp": ("dp", "cp"),  # expert gradients: replicas of one expert shard
    "emb": ("pp",),  # tied embedding gradients: the pipeline group's two ends only
}


@dataclass(frozen=True)
class GroupSpan:
    """The worst-placed group of a kind: ``size`` ranks, at most ``per_node`` on a node,
    spread over ``nodes`` nodes; ``cross_pod`` when it leaves a full-bisection pod;
    ``least`` ranks on its emptiest node (0: as many as ``per_node``)."""

    size: int
    per_node: int
    nodes: int
    cross_pod: bool
    least: int = 0

    @property
    def channels(self) -> int:
        """Rings a collective across the group's nodes runs side by side (NCCL's
        channels): each leaves every node through a NIC of its own, so as many as the
        emptiest node has ranks."""
        return self.least or self.per_node


SITE_PLACEMENT = "tp-cp-ep-pp-dp"  # data parallelism outermost: whole replicas a site


def site_aware(plan: Plan, cluster: ClusterSpec) -> Plan:
    """On a cluster of sites, a plan at the default rank order gets data parallelism
    outermost, so each site holds whole replicas (tensor, pipeline and context parallelism
    stay inside a site; only data-parallel groups cross the WAN). Any other order, or an
    explicit rank table, is the user's and is kept."""
    if cluster.sites and plan.placement == DEFAULT_PLACEMENT and plan.pp > 1:
        import dataclasses

        return dataclasses.replace(plan, placement=SITE_PLACEMENT)
    return plan


def wan_crossings(plan: Plan, cluster: ClusterSpec) -> list[str]:
    """The model-parallel groups (tp, cp, pp, ep) that leave a site: with sites, their
    traffic crosses the WAN."""
    if not cluster.sites:
        return []
    sizes = {"tp": plan.tp, "cp": plan.cp, "pp": plan.pp, "ep": plan.ep}
    return [g for g, n in sizes.items() if n > 1 and group_span(plan, cluster, g).cross_pod]


def dim_sizes(plan: Plan) -> dict[str, int]:
    e = ep_inner(plan)
    return {"tp": plan.tp, "cp": plan.cp, "ep": e, "dp": plan.dp // e, "pp": plan.pp}


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


def _pod(device: int, pods: int | tuple[int, ...]) -> int:
    """The pod of ``device``: pods of ``pods`` devices, or starting at the devices listed."""
    return device // pods if isinstance(pods, int) else bisect.bisect_right(pods, device)


def _span(devices: list[int], gpus_per_node: int, pods: int | tuple[int, ...]) -> GroupSpan:
    per_node = Counter(d // gpus_per_node for d in devices)
    cross_pod = _pod(min(devices), pods) != _pod(max(devices), pods)
    most, least = max(per_node.values()), min(per_node.values())
    return GroupSpan(len(devices), most, len(per_node), cross_pod,
                     least if least < most else 0)


def _others(dims: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(d for d in DIMS if d not in dims)


def _residues(plan: Plan, dims: tuple[str, ...], modulus: int) -> set[int]:
    """First ranks of all groups spanning ``dims``, modulo ``modulus`` (a sum-set, so it
    costs at most ``modulus`` per dimension instead of one entry per group)."""
    sizes, strides = dim_sizes(plan), _strides(plan)
    out = {0}
    for d in _others(dims):
        steps = {c * strides[d] % modulus for c in range(min(sizes[d], modulus))}
        out = {(a + b) % modulus for a in out for b in steps}
    return out


def _worst(spans: list[GroupSpan]) -> GroupSpan:
    return max(spans, key=lambda s: (s.cross_pod, s.nodes, -s.channels, -s.per_node))


def _order_span(plan: Plan, dims: tuple[str, ...], g: int, pods: int | tuple[int, ...],
                world: int, offsets: list[int]) -> GroupSpan:
    """With a rank order, groups differ only by their first rank ``b``, and how a group
    falls on nodes depends only on ``b mod gpus_per_node``. ``offsets``: the members'
    ranks relative to ``b`` (the last the largest). Pods of one size are crossed as their
    residues say; pods of different sizes (sites) group by group."""
    worst = _worst([_span([r + o for o in offsets], g, pods)
                    for r in sorted(_residues(plan, dims, g))])
    if isinstance(pods, int):
        cross = pods < world and max(_residues(plan, dims, pods)) + offsets[-1] >= pods
    else:
        cross = any(_pod(b, pods) != _pod(b + offsets[-1], pods)
                    for b in _ranks(plan, _others(dims), 0))
    return GroupSpan(worst.size, worst.per_node, worst.nodes, cross, worst.least)


def group_span(plan: Plan, cluster: ClusterSpec, group: str) -> GroupSpan:
    """The worst-placed group of kind ``group`` (most nodes, then fewest ranks per node).
    An explicit rank table is checked group by group. Memoised on what it depends on, since
    a search evaluates many plans with the same degrees and placement."""
    layout = (plan.dp, plan.tp, plan.pp, plan.cp, plan.ep, plan.etp, plan.placement)
    return _group_span(layout, cluster.gpus_per_node, cluster.pods, cluster.world_size, group)


@functools.lru_cache(maxsize=4096)
def _group_span(layout: tuple, gpus_per_node: int, pods: int | tuple[int, ...],
                world_size: int, group: str) -> GroupSpan:
    dp, tp, pp, cp, ep, etp, placement = layout  # what placement depends on, as a Plan
    plan = Plan(global_batch_size=dp, seq_len=2 * cp * tp, dp=dp, tp=tp, pp=pp, cp=cp, ep=ep,
                etp=etp, sequence_parallel=tp > 1, placement=placement)
    if group in ("ep", "edp") and is_folded(plan):
        table = plan.placement if not isinstance(plan.placement, str) else range(world_size)
        return _worst([_span([table[r] for r in g], gpus_per_node, pods)
                       for s in range(pp) for g in _expert_groups(plan, group, s)])
    dims = tuple(d for d in GROUP_DIMS[group] if dim_sizes(plan)[d] > 1)
    offsets = _ranks(plan, dims, 0)
    if group == "emb":  # first and last pipeline stage
        offsets = sorted({offsets[0], offsets[-1]})
    if isinstance(plan.placement, str):
        return _order_span(plan, dims, gpus_per_node, pods, world_size, offsets)
    table = plan.placement
    return _worst([_span([table[b + o] for o in offsets], gpus_per_node, pods)
                   for b in _ranks(plan, _others(dims), 0)])


def _expert_groups(plan: Plan, group: str, stage: int) -> list[list[int]]:
    """A folded plan's ``ep`` or ``edp`` groups on one pipeline stage, in logical ranks,
    each in Megatron-LM's rank order (:mod:`sim.spec.experts`)."""
    sizes, strides = dim_sizes(plan), _strides(plan)
    width = plan.tp * plan.cp * sizes["ep"]  # ranks of one data-parallel-outer slice
    block = expert_tp(plan) * plan.ep

    def rank(outer: int, j: int) -> int:
        t, c, e = j % plan.tp, j // plan.tp % plan.cp, j // (plan.tp * plan.cp)
        return (stage * strides["pp"] + outer * strides["dp"] + t * strides["tp"]
                + c * strides["cp"] + e * strides["ep"])

    etp = expert_tp(plan)
    if group == "ep":
        return [[rank(o, b + a + etp * k) for k in range(plan.ep)]
                for o in range(sizes["dp"]) for b in range(0, width, block) for a in range(etp)]
    return [[rank(o, b + pos) for o in range(sizes["dp"]) for b in range(0, width, block)]
            for pos in range(block)]


def rank_coords(plan: Plan) -> tuple[dict[str, int], dict[str, int]]:
    """(sizes, strides) of the placement dimensions: rank = sum(coord[d] * stride[d])."""
    return dim_sizes(plan), _strides(plan)


def framework_rank_table(plan: Plan, gpus_per_node: int) -> list[dict[str, int]]:
    """Global rank in the frameworks' order (tp innermost, then cp, ep/dp, pp; Megatron-LM,
    torchtitan and torchrun alike) -> the node and local device the plan puts it on."""
    sizes, strides = rank_coords(plan)
    order = ("tp", "cp", "ep", "dp", "pp")
    rows = []
    for fw_rank in range(plan.world_size):
        coord, rest = {}, fw_rank
        for d in order:
            coord[d], rest = rest % sizes[d], rest // sizes[d]
        logical = sum(coord[d] * strides[d] for d in order)
        device = logical if isinstance(plan.placement, str) else plan.placement[logical]
        rows.append({"rank": fw_rank, "node": device // gpus_per_node,
                     "local_rank": device % gpus_per_node})
    return rows


def groups_of(plan: Plan, group: str, fixed: dict[str, int]) -> list[list[int]]:
    """Logical ranks of every group of kind ``group`` whose coordinates in the dimensions of
    ``fixed`` are as given (e.g. one pipeline stage), each in group order; the group
    containing the lowest rank first."""
    if group in ("ep", "edp") and is_folded(plan):
        return _folded_groups_of(plan, group, fixed)
    strides = _strides(plan)
    dims = GROUP_DIMS[group]
    base0 = sum(fixed[d] * strides[d] for d in fixed)
    free = tuple(d for d in DIMS if d not in dims and d not in fixed)
    offsets = _ranks(plan, dims, 0)
    if group == "emb":
        offsets = sorted({offsets[0], offsets[-1]})
    return [[b + o for o in offsets] for b in _ranks(plan, free, base0)]


def _folded_groups_of(plan: Plan, group: str, fixed: dict[str, int]) -> list[list[int]]:
    if set(fixed) - {"pp"}:
        raise ValueError(f"a folded plan's {group} groups are listed per pipeline stage only")
    stages = [fixed["pp"]] if "pp" in fixed else range(plan.pp)
    groups = [g for s in stages for g in _expert_groups(plan, group, s)]
    return sorted(groups, key=lambda g: min(g))


def stage_devices(plan: Plan, replica: int, stage: int) -> list[int]:
    """Logical ranks of one replica's pipeline stage: its TP and CP ranks (the replica is
    the data-parallel index, the expert-parallel one being ``replica % ep``)."""
    sizes, strides = rank_coords(plan)
    e = sizes["ep"]
    base = stage * strides["pp"] + (replica % e) * strides["ep"] + (replica // e) * strides["dp"]
    return [base + t * strides["tp"] + c * strides["cp"]
            for t in range(sizes["tp"]) for c in range(sizes["cp"])]
