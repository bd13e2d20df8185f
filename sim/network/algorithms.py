"""Collective algorithms, one table: for each algorithm a plan may name, the collectives it
runs, its closed-form time on the fabric a group spans (the analytic tier; formulas in
:mod:`sim.network.alphabeta`) and its expansion into flow phases on the topology (the
discrete-event tier; :mod:`sim.network.collectives`), side by side. Which parallel groups
may choose which algorithm is the plan's vocabulary (``sim.spec.plan.ALGORITHMS``, checked
when a plan is validated, below this floor); a test holds it and this table in step.

An algorithm asked for a collective it does not implement runs what it always ran: a
reduction as a ring (a direct or pairwise all-reduce), an all-to-all as direct. A tree or
NVLS all-gather or reduce-scatter is a ring too, except that as flows, on a group with
several ranks on each of several nodes, it runs hierarchically (node rings, then a ring
across nodes): there the two tiers differ, as they did before this table existed.

>>> sorted(TABLE) == sorted(["ring", "tree", "hierarchical", "halving-doubling", "nvls",
...                          "direct", "pairwise"])
True
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sim.errors import SpecError
from sim.network.alphabeta import (
    Fabric,
    all_to_all_s,
    broadcast_s,
    default_algorithm,
    dispatch_nvl_s,
    dispatch_rdma_s,
    flat_rates,
    halving_doubling_s,
    hierarchical_s,
    nvls_s,
    ring_latency_s,
    send_recv_s,
    tree_s,
)
from sim.network.collectives import (
    FlowSpec,
    Phase,
    all_to_all_phases,
    chain_phases,
    dispatch_nvl_phases,
    dispatch_rdma_phases,
    double_tree_phases,
    halving_doubling_phases,
    hierarchical_phases,
    nvls_phases,
    ring_phases,
)
from sim.spec.plan import Plan

__all__ = ["Algorithm", "TABLE", "REDUCTIONS", "DISPATCH", "collective_time", "expand",
           "nccl_env"]

REDUCTIONS = ("all_reduce", "all_gather", "reduce_scatter")
Nodes = list[list[int]] | None  # a group's indices per node (None: not known / one node)


@dataclass(frozen=True)
class Algorithm:
    """One collective algorithm: ``seconds(collective, fabric, bytes)`` in closed form,
    ``phases(collective, ranks, bytes, nodes)`` as flows."""

    name: str
    collectives: tuple[str, ...]
    seconds: Callable[[str, Fabric, float], float]
    phases: Callable[[str, int, float, Nodes], list[Phase]]


def _passes(collective: str) -> int:
    """2 for an all-reduce (reduce-scatter then all-gather), 1 otherwise."""
    return 2 if collective == "all_reduce" else 1


def _layered(f: Fabric) -> bool:
    return f.span.nodes > 1 and f.span.per_node > 1


# Algorithms whose closed forms take every node to hold as many of the group's ranks (a
# step inside each node, then across; halving-doubling's partners inside a node): a group
# whose nodes hold unequal numbers of its ranks runs NCCL's rings instead, in both tiers.
EQUAL_NODES = ("hierarchical", "tree", "nvls", "halving-doubling")


def _layered_nodes(nodes: Nodes) -> bool:
    return nodes is not None and len(nodes) > 1 and len(nodes[0]) > 1


# Closed forms -------------------------------------------------------------------------------
def _ring_s(coll: str, f: Fabric, size: float) -> float:
    bw, _ = flat_rates(f)
    n, passes = f.span.size, _passes(coll)
    return ring_latency_s(f, passes) + passes * (n - 1) / n * size / bw


def _hierarchical_s(coll: str, f: Fabric, size: float) -> float:
    return hierarchical_s(f, size, _passes(coll))


def _tree_s(coll: str, f: Fabric, size: float) -> float:
    if coll != "all_reduce":
        return _ring_s(coll, f, size)
    if _layered(f):
        return hierarchical_s(f, size, 2, tree=True)
    bw, alpha = flat_rates(f)
    return tree_s(f.span.size, alpha, bw, size)


def _nvls_s(coll: str, f: Fabric, size: float) -> float:
    if coll != "all_reduce" or f.nvls_Bps <= 0:
        return _ring_s(coll, f, size)
    if f.span.nodes > 1:
        return hierarchical_s(f, size, 2, nvls=True)
    return nvls_s(f.span.size, f.intra_alpha_s, f.nvls_Bps, size)


def _halving_doubling_s(coll: str, f: Fabric, size: float) -> float:
    return halving_doubling_s(f, coll, size)


# Flow expansions ----------------------------------------------------------------------------
def _ring_phases(kind: str, n: int, size: float, nodes: Nodes) -> list[Phase]:
    return ring_phases(n, size, _passes(kind), nodes)


def _node_rings(kind: str, n: int, size: float, nodes: Nodes, nvls: bool = False,
                tree: bool = False) -> list[Phase]:
    """Hierarchical where every node holds as many of the group's ranks, else a flat ring."""
    if nodes and len({len(x) for x in nodes}) == 1:
        return hierarchical_phases(nodes, size, _passes(kind), nvls, tree)
    return ring_phases(n, size, _passes(kind))


def _hierarchical_phases(kind: str, n: int, size: float, nodes: Nodes) -> list[Phase]:
    return _node_rings(kind, n, size, nodes)


def _tree_phases(kind: str, n: int, size: float, nodes: Nodes) -> list[Phase]:
    if _layered_nodes(nodes):
        return _node_rings(kind, n, size, nodes, tree=True)
    if kind == "all_reduce":
        return double_tree_phases(n, size)
    return ring_phases(n, size, _passes(kind), nodes)


def _nvls_phases(kind: str, n: int, size: float, nodes: Nodes) -> list[Phase]:
    if _layered_nodes(nodes):
        return _node_rings(kind, n, size, nodes, nvls=True)
    if kind == "all_reduce" and not (nodes is not None and len(nodes) > 1):
        return nvls_phases(n, size)
    return ring_phases(n, size, _passes(kind), nodes)


def _halving_doubling_phases(kind: str, n: int, size: float, nodes: Nodes) -> list[Phase]:
    return halving_doubling_phases(n, size, kind, nodes)


TABLE: dict[str, Algorithm] = {a.name: a for a in (
    Algorithm("ring", REDUCTIONS, _ring_s, _ring_phases),
    Algorithm("tree", REDUCTIONS, _tree_s, _tree_phases),
    Algorithm("hierarchical", REDUCTIONS, _hierarchical_s, _hierarchical_phases),
    Algorithm("halving-doubling", REDUCTIONS, _halving_doubling_s, _halving_doubling_phases),
    Algorithm("nvls", REDUCTIONS, _nvls_s, _nvls_phases),
    Algorithm("direct", ("all_to_all",), lambda c, f, s: all_to_all_s(f, s, "direct"),
              lambda k, n, s, nodes: all_to_all_phases(n, s, False)),
    Algorithm("pairwise", ("all_to_all",), lambda c, f, s: all_to_all_s(f, s, "pairwise"),
              lambda k, n, s, nodes: all_to_all_phases(n, s, True)),
)}


# DeepEP's two parts of one dispatch (or combine), which run at once: a kind of collective
# with one way to run it (closed form, flows), as send_recv and broadcast.
DISPATCH: dict[str, tuple[Callable[[Fabric, float], float],
                          Callable[[float, list[list[int]]], list[Phase]]]] = {
    "dispatch_rdma": (dispatch_rdma_s, dispatch_rdma_phases),
    "dispatch_nvl": (dispatch_nvl_s, dispatch_nvl_phases),
}


def _entry(collective: str, name: str) -> Algorithm:
    """The table's algorithm that runs ``collective`` when ``name`` is asked for."""
    if name not in TABLE:
        raise ValueError(f"unknown collective algorithm {name!r} (known: {', '.join(TABLE)})")
    entry = TABLE[name]
    if collective in entry.collectives:
        return entry
    return TABLE["direct" if collective == "all_to_all" else "ring"]


def collective_time(collective: str, f: Fabric, size_bytes: float, algorithm: str = "auto"
                    ) -> float:
    """Seconds one collective of ``size_bytes`` takes on fabric ``f`` (closed form)."""
    if f.span.size == 1 or size_bytes <= 0:
        return 0.0
    if collective == "send_recv":  # between neighbours of the group
        return send_recv_s(f, size_bytes)
    if collective == "kv_ring":  # n - 1 hops round one ring, each a neighbour's chunk
        return (f.span.size - 1) * send_recv_s(f, size_bytes / f.span.size)
    if collective == "broadcast":
        return broadcast_s(f, size_bytes)
    if collective in DISPATCH:
        return DISPATCH[collective][0](f, size_bytes)
    if algorithm == "auto":
        algorithm = default_algorithm(collective, f, size_bytes)
    if f.span.least and algorithm in EQUAL_NODES:  # nodes of unequal counts: NCCL's rings
        algorithm = "ring"
    return _entry(collective, algorithm).seconds(collective, f, size_bytes)


def expand(kind: str, algorithm: str, n: int, size: float, nodes: Nodes = None
           ) -> list[Phase]:
    """Phases of one collective on a group of ``n`` ranks (``nodes``: the group's indices
    per node, needed by hierarchical and multi-node NVLS)."""
    if n == 1 or size <= 0:
        return []
    if kind == "send_recv":
        return [Phase([FlowSpec(0, 1, size)])]
    if kind == "kv_ring":  # one ring in rank order, whatever the nodes (no NCCL channels)
        return ring_phases(n, size, 1)
    if kind == "p2p":  # pairs (0->1, 2->3, ...) sending at once: a pipeline boundary
        return [Phase([FlowSpec(i, i + 1, size) for i in range(0, n, 2)])]
    if kind == "broadcast":
        return chain_phases(n, size, nodes)
    if kind in DISPATCH:
        return DISPATCH[kind][1](size, nodes or [list(range(n))])
    if nodes and len({len(x) for x in nodes}) > 1 and algorithm in EQUAL_NODES:
        algorithm = "ring"  # nodes of unequal counts (as collective_time)
    return _entry(kind, algorithm).phases(kind, n, size, nodes)


# Our algorithm names -> NCCL_ALGO values; the others have no NCCL switch.
_NCCL_ALGO = {"ring": "Ring", "tree": "Tree", "nvls": "NVLS"}


def nccl_env(plan: Plan, runner: str) -> dict[str, str]:
    """``NCCL_ALGO`` for a plan's chosen collective algorithms, for ``runner`` (a framework
    or launcher). NCCL takes one algorithm per process, not per group: a plan giving two
    groups in use different algorithms, or one NCCL cannot be told to use, is refused."""
    chosen = {g: a for g, a in plan.collectives if a != "auto"}
    if not chosen:
        return {}
    degree = {"tp": plan.tp, "dp": plan.dp, "ep": plan.ep}
    used = {g: chosen.get(g, "auto") for g in degree if degree[g] > 1 or g in chosen}
    algos = set(used.values())
    if len(algos) != 1 or next(iter(algos)) not in _NCCL_ALGO:
        raise SpecError("plan.collectives", f"{dict(plan.collectives)} is not expressible in "
                        f"{runner}: NCCL_ALGO sets one algorithm ({'/'.join(_NCCL_ALGO)}) for "
                        f"every group of a process (groups in use: {', '.join(sorted(used))})")
    algo = algos.pop()
    gathers = [why for why, on in (("ZeRO's reduce-scatter/all-gather", plan.zero_stage > 0),
                                   ("sequence parallelism's", plan.sequence_parallel),
                                   ("context parallelism's all-gather",
                                    plan.cp > 1 and plan.cp_comm == "allgather")) if on]
    if algo == "tree" and gathers:  # NCCL's Tree implements all-reduce only
        raise SpecError("plan.collectives", f"tree is not expressible in {runner} for this "
                        f"plan: NCCL's Tree runs all-reduce only, and NCCL_ALGO=Tree would "
                        f"leave {gathers[0]} collectives without an algorithm")
    return {"NCCL_ALGO": _NCCL_ALGO[algo]}
