"""BytePS-style refinements of parameter-server synchronisation (Jiang et al., OSDI 2020):

- ``aggregate = "node"``: the workers of a node sum their gradients over the node fabric
  first (a reduce-scatter), the node pushes one gradient's worth from all its ranks and
  pulls it back, and an all-gather spreads the parameters. The servers then see one worker
  per node: staleness and updates count nodes. The node's local sum and broadcast take
  one all-reduce of the gradient over the node fabric (closed form,
  :func:`sim.network.algorithms.collective_time`): after the step when the gradient goes
  whole, split over the partitions (half before each push, half after each pull) when it
  is partitioned.
- ``partition_MB > 0`` (BSP only): the gradient goes in partitions of that size (at most
  :data:`MAX_PARTITIONS`, larger ones past that), each pushed as soon as the backward
  has produced it, spread evenly over the servers (BytePS hashes many small keys over
  them; ``sharding`` is not used), and pulled once every worker's is summed; a worker sends one
  partition at a time and pulls them in order (:mod:`sim.des.partitions`). The backward
  starts a third of the way into the local step (it does twice the forward's FLOPs) and
  produces the partitions evenly (``SyncSetup.forward_share``).
"""

from __future__ import annotations

import math

from sim.errors import SpecError
from sim.layout.placement import GroupSpan
from sim.network.algorithms import collective_time
from sim.network.alphabeta import fabric_for
from sim.network.workers import SyncSetup
from sim.spec.cluster import ClusterSpec

__all__ = ["aggregate_nodes", "partition_count", "partition_note", "MAX_PARTITIONS"]

MAX_PARTITIONS = 64  # per step: the pipelining is then within 1/64 of the backward


def partition_note(s: SyncSetup) -> None:
    """The closed form's limit with colocated servers, said in the result."""
    if s.partitions and s.plan.communication.placement == "colocated":
        s.notes.append("partitions with colocated servers: pushes and pulls share the "
                       "nodes' NICs, which the closed form does not see (it is exact for "
                       "dedicated servers): use the des tier")


def partition_count(raw_bytes: float, partition_MB: float) -> int:
    """Partitions of the gradient (0: none)."""
    if not partition_MB:
        return 0
    return max(1, min(MAX_PARTITIONS, math.ceil(raw_bytes / (partition_MB * 1e6))))


def aggregate_nodes(s: SyncSetup, cluster: ClusterSpec, raw_bytes: float) -> None:
    """Make each node's workers one worker (``aggregate = "node"``): its ranks all theirs,
    its samples their sum, its step their slowest one's, plus the node's local sum and
    broadcast unless the partitions carry them."""
    groups: dict[int, list[int]] = {}
    for w, devices in enumerate(s.devices):
        groups.setdefault(s.topo.node_of(devices[0]), []).append(w)
    sizes = sorted({len(g) for g in groups.values()})
    if len(sizes) > 1:
        raise SpecError("plan.communication.aggregate", f"node needs as many workers on "
                        f"every node, got {sizes[0]} to {sizes[-1]}")
    per_node = sizes[0]
    ranks = len(s.devices[0])
    if per_node > 1:
        span = GroupSpan(per_node, per_node, 1, False)
        s.local_reduce_s = collective_time("all_reduce", fabric_for(cluster, span),
                                           raw_bytes / ranks)
    order = [groups[node] for node in sorted(groups)]
    s.devices = [[d for w in ws for d in s.devices[w]] for ws in order]
    s.compute_s = [max(s.compute_s[w] for w in ws) + (0.0 if s.partitions else
                                                       s.local_reduce_s) for ws in order]
    s.samples_per_step *= per_node
    if per_node > 1:
        s.notes.append(f"aggregate=node: {per_node} workers a node sum their gradients "
                       f"first ({s.local_reduce_s * 1e3:.3g} ms a step over the node "
                       "fabric); the servers see one worker per node")
