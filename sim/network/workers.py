"""What the multi-step tiers share about a synchronisation run: the workers, their step
times, what they send and where (built by :mod:`sim.strategies`; simulated by
:mod:`sim.des.workers`, in closed form by :mod:`sim.analytic.sync`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from sim.network.servers import Servers
from sim.network.topology import Topology
from sim.spec.plan import Plan

__all__ = ["SyncSetup", "sgp_peer"]


@dataclass
class SyncSetup:
    """One synchronisation scenario, every time in seconds and every size in bytes.

    ``compute_s[w]``: worker ``w``'s local step (forward, backward, optimizer, compression
    encode/decode) with its speed factor applied; ``jitter`` multiplies it per step.
    ``exposed_s``: BSP's data-parallel reduction as the one-step tier exposes it (the rest
    overlaps the backward); ``allreduce_s``: one whole all-reduce of the wire gradient, not
    overlapped; ``average_s``: what a local-SGD / DiLoCo average takes (its all-reduce and
    DiLoCo's outer step); ``stage1_s`` / ``stage2_s``: two-stage's two all-reduces.
    ``push_bytes`` / ``pull_bytes``: per worker and step, all its ranks together;
    ``server_bytes``: what a server's CPU sums per push (uncompressed), all shards together.
    ``partitions``: BSP's gradient in this many partitions, pipelined with the backward (0:
    whole shards after the step), which starts ``forward_share`` into the local step and
    produces them evenly; ``local_reduce_s``: a node's sum of its workers' gradients
    and the broadcast back (``aggregate = node``: a worker is then a node's workers).
    """

    plan: Plan
    topo: Topology
    devices: list[list[int]]  # each worker's ranks
    compute_s: list[float]
    samples_per_step: float  # sequences (samples) one worker's local step takes
    exposed_s: float = 0.0
    allreduce_s: float = 0.0
    average_s: float = 0.0
    stage1_s: float = 0.0
    stage2_s: float = 0.0
    push_bytes: float = 0.0
    pull_bytes: float = 0.0
    server_bytes: float = 0.0
    shards: list[float] = field(default_factory=list)  # share of the parameters per server
    partitions: int = 0
    forward_share: float = 1 / 3  # of a local step: the backward does twice its FLOPs
    local_reduce_s: float = 0.0
    # links failing during the run (sim.network.perturbation.LinkFailure), and from the
    # first failure on, the all-reduce strategies' costs (sim.strategies.failures)
    failures: tuple = ()
    fail_at: float = math.inf
    after: dict[str, float] = field(default_factory=dict)
    servers: Servers | None = None
    edges: list[tuple[int, int]] = field(default_factory=list)  # gossip graph
    jitter: object | None = None  # a sim.spec.faults.Dist (scope ignored) drawn per step
    seed: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def workers(self) -> int:
        return len(self.devices)

    def neighbours(self, w: int) -> list[int]:
        return sorted({b if a == w else a for a, b in self.edges if w in (a, b)})


def sgp_peer(w: int, k: int, n: int) -> int:
    """SGP's out-peer of worker ``w`` at step ``k``: ``2^(k mod ceil(log2 n))`` ahead."""
    hops = max(1, math.ceil(math.log2(n)))
    return (w + 2 ** (k % hops)) % n
