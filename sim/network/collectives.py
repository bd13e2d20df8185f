"""Collective algorithms as flows over the topology (the discrete-event tier;
:mod:`sim.network.algorithms` puts them in one table with their closed forms).

Each algorithm is a plain function from a group (device ids, in group order) and a size
to a list of :class:`Phase`: flows that start together, plus the latency of the steps the
phase stands for. Pipelined algorithms (ring, tree, chain broadcast) are one phase whose
flows carry everything a link carries over the whole collective — the limit of fine
chunking — plus one step latency per step (and, for trees and chains, the pipeline fill
of ``chunk_bytes``), so on an idle network a ring all-reduce takes exactly
``2(n-1)·α + 2(n-1)/n · bytes / bandwidth``.

``size_bytes`` follows the analytic tier: the full buffer (all-gather output,
reduce-scatter input, what one rank sends in an all-to-all).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

__all__ = ["Phase", "FlowSpec", "tree_load_factor", "CHUNK_BYTES", "ring_phases",
           "double_tree_phases", "halving_doubling_phases", "nvls_phases", "all_to_all_phases",
           "chain_phases", "hierarchical_phases"]

CHUNK_BYTES = 4 * 1024 * 1024  # pipelining unit of trees and chains (NCCL-like buffer)


@dataclass(frozen=True)
class FlowSpec:
    src: int  # index into the group
    dst: int
    size_bytes: float
    to_switch: bool = False  # NVLS: device -> its node switch (dst unused) or back
    from_switch: bool = False


@dataclass
class Phase:
    flows: list[FlowSpec] = field(default_factory=list)
    steps: int = 1  # sequential steps the phase stands for (each pays the hop latency)
    fill_steps: int = 0  # chunk hops before the pipeline is full (trees and chains)
    # Of ``steps``, those that pay the phase's shortest hop latency, the rest its longest: a
    # ring's steps inside a node (as NCCL's tuning model charges a ring across nodes).
    near_steps: int = 0

    @property
    def largest(self) -> float:
        """Bytes of the phase's largest flow (a pipeline fills one chunk of it per step)."""
        return max((f.size_bytes for f in self.flows), default=0.0)


def ring_phases(n: int, size: float, passes: int, nodes: list[list[int]] | None = None
          ) -> list[Phase]:
    """Pipelined ring. Across nodes holding ``g`` ranks each, ``g`` rings (NCCL's channels)
    each carry ``1/g`` of the data, and ring ``c`` leaves every node from its ``c``-th
    rank, so every rank's NIC carries one ring. A ring of one rank sends nothing (the
    node-local rings of a hierarchical collective with one rank per node)."""
    if n == 1:
        return []
    steps = passes * (n - 1)
    orders = _channels(n, nodes)
    crossings = _crossings(orders[0], nodes)
    return [Phase([FlowSpec(a, b, steps / n * size / len(orders))
                   for order in orders for a, b in zip(order, order[1:] + order[:1],
                                                       strict=True)], steps,
                  near_steps=passes * (n - crossings) if crossings else 0)]


def _crossings(order: list[int], nodes: list[list[int]] | None) -> int:
    """Hops of a ring in ``order`` between nodes (0 without ``nodes`` or on one node).
    Of each pass's ``n - 1`` steps, ``crossings - 1`` cross nodes and the rest stay inside
    one, as NCCL's tuning model counts a ring's latency (``nInterSteps``)."""
    if not nodes or len(nodes) < 2:
        return 0
    node_of = {r: j for j, members in enumerate(nodes) for r in members}
    return sum(node_of[a] != node_of[b] for a, b in zip(order, order[1:] + order[:1],
                                                         strict=True))


def _channels(n: int, nodes: list[list[int]] | None) -> list[list[int]]:
    """Rank orders of the rings: one plain ring, or one per local rank across nodes. Ring
    ``c`` enters even nodes at local rank ``c`` and walks up, odd nodes at ``c-1`` and walks
    down, so every node-to-node hop joins ranks of the same local index (the same rail of
    a rail-optimized network); only the closing hop of an odd number of nodes does not.
    Where the nodes hold different numbers of ranks, as many rings as the emptiest node
    holds (each entering and leaving every node through ranks of its own)."""
    if not nodes or len(nodes) == 1:
        return [list(range(n))]

    def walk(members: list[int], j: int, c: int) -> list[int]:
        g = len(members)
        if j % 2 == 0:
            return [members[(c + i) % g] for i in range(g)]
        return [members[(c - 1 - i) % g] for i in range(g)]

    return [[r for j, members in enumerate(nodes) for r in walk(members, j, c)]
            for c in range(min(len(x) for x in nodes))]


def _tree_edges(n: int, shift: int) -> list[tuple[int, int]]:
    """(child, parent) edges of a binary heap over the ranks rotated by ``shift``."""
    order = [(i + shift) % n for i in range(n)]
    return [(order[i], order[(i - 1) // 2]) for i in range(1, n)]


def tree_load_factor(n: int) -> float:
    """Most bytes one rank sends in a double-binary-tree all-reduce, per byte of buffer
    (2 for large groups: interior in one tree, leaf in the other)."""
    sent = [0.0] * n
    for shift in (0, n // 2):
        for child, parent in _tree_edges(n, shift):
            sent[child] += 0.5
            sent[parent] += 0.5
    return max(sent)


def double_tree_phases(n: int, size: float) -> list[Phase]:
    """Two binary trees (the second rotated by half the group), each reducing half of the
    data up and broadcasting it down, pipelined."""
    flows = []
    for shift in (0, n // 2):
        for child, parent in _tree_edges(n, shift):
            flows += [FlowSpec(child, parent, size / 2), FlowSpec(parent, child, size / 2)]
    depth = math.ceil(math.log2(n))
    return [Phase(flows, 2 * depth, 2 * depth)]


def halving_doubling_phases(n: int, size: float, kind: str,
                            nodes: list[list[int]] | None = None) -> list[Phase]:
    """Recursive halving (reduce-scatter: exchange half the data with partner i xor 2^r)
    and/or doubling (all-gather, the mirror image); a ring unless n is a power of two
    (across nodes NCCL's rings, as the closed form's)."""
    rounds = int(math.log2(n))
    if 2**rounds != n:
        return ring_phases(n, size, 2 if kind == "all_reduce" else 1, nodes)
    def step(r: int) -> Phase:
        return Phase([FlowSpec(i, i ^ (1 << r), size / 2 ** (r + 1)) for i in range(n)])
    halving = [step(r) for r in range(rounds)] if kind != "all_gather" else []
    doubling = [step(r) for r in reversed(range(rounds))] if kind != "reduce_scatter" else []
    return halving + doubling


def nvls_phases(n: int, size: float) -> list[Phase]:
    """Up to the switch, which reduces, and back; the latency is charged as a ring's (one
    device-switch link is half a hop)."""
    part = (n - 1) / n * size
    return [Phase([FlowSpec(i, i, part, to_switch=True) for i in range(n)], 2 * (n - 1)),
            Phase([FlowSpec(i, i, part, from_switch=True) for i in range(n)], 2 * (n - 1))]


def all_to_all_phases(n: int, size: float, pairwise: bool) -> list[Phase]:
    if not pairwise:
        return [Phase([FlowSpec(i, j, size / n) for i in range(n) for j in range(n) if i != j])]
    return [Phase([FlowSpec(i, (i + k) % n, size / n) for i in range(n)]) for k in range(1, n)]


def dispatch_rdma_phases(size: float, nodes: list[list[int]]) -> list[Phase]:
    """DeepEP's inter-node flows: rank ``l`` of each node to rank ``l`` of every other node
    (where that node has one), ``size / nodes`` each."""
    share = size / len(nodes)
    flows = [FlowSpec(a[i], b[i], share) for a in nodes for b in nodes if a is not b
             for i in range(min(len(a), len(b)))]
    return [Phase(flows)] if flows else []


def dispatch_nvl_phases(size: float, nodes: list[list[int]]) -> list[Phase]:
    """DeepEP's intra-node flows: every pair of ranks on a node, ``size / g`` each."""
    flows = [FlowSpec(i, j, size / len(node)) for node in nodes for i in node for j in node
             if i != j]
    return [Phase(flows)] if flows else []


def chain_phases(n: int, size: float, nodes: list[list[int]] | None = None) -> list[Phase]:
    """Pipelined chain from rank 0 (one chain per channel across nodes, as rings)."""
    orders = _channels(n, nodes)
    share = size / len(orders)
    return [Phase([FlowSpec(o[i], o[i + 1], share) for o in orders for i in range(n - 1)],
                  n - 1, n - 2)]


def hierarchical_phases(nodes: list[list[int]], size: float, passes: int, nvls: bool,
                  tree: bool = False) -> list[Phase]:
    """Reduce-scatter inside each node, all-reduce (or gather) across nodes among ranks of
    the same local index (a ring, or with ``tree`` a double binary tree), all-gather inside
    each node (indices into the group)."""
    g, k = len(nodes[0]), len(nodes)
    if nvls and passes == 2:
        inside = [nvls_phases(g, size)[0], nvls_phases(g, size)[1]]
        intra_rs, intra_ag = [inside[0]], [inside[1]]
    else:
        intra_rs = ring_phases(g, size, 1) if passes == 2 else []
        intra_ag = ring_phases(g, size, 1)
    phases: list[Phase] = []
    for ph in intra_rs:
        phases.append(_map(ph, nodes))
    if k == 1:
        cross = Phase()
    elif tree and passes == 2:
        cross = double_tree_phases(k, size / g)[0]
    else:
        cross = ring_phases(k, size / g, passes)[0]
    phases.append(Phase([FlowSpec(nodes[f.src][i], nodes[f.dst][i], f.size_bytes)
                         for i in range(g) for f in cross.flows], cross.steps,
                        cross.fill_steps))
    for ph in intra_ag:
        phases.append(_map(ph, nodes))
    return [p for p in phases if p.flows]


def _map(phase: Phase, nodes: list[list[int]]) -> Phase:
    """One node-local phase (indices 0..g-1) applied in every node of the group."""
    flows = [FlowSpec(members[f.src], members[f.dst], f.size_bytes, f.to_switch, f.from_switch)
             for members in nodes for f in phase.flows]
    return Phase(flows, phase.steps, phase.fill_steps, phase.near_steps)
