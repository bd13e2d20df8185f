"""Closed forms of data-parallel synchronisation, where they exist (the multi-step DES,
:mod:`sim.des.workers`, is the reference; ``tests/test_sync_sim.py`` checks them against it).

With ``c_i`` worker ``i``'s step, ``n`` workers and an idle network:

- BSP over all-reduce: ``max c + exposed``; local SGD / DiLoCo: ``(H max c + average) / H``
  a local step; two-stage: ``stage1 + max(max c, stage2)``.
- BSP with the gradient in partitions: a recursion over them (:func:`_partition_round`),
  exact for identical workers.
- BSP over servers: workers that finish computing together push together; the server sums
  each push (``b_s / cpu``, ``b_s`` the largest shard's bytes) as soon as it is in and in
  arrival order; then everyone pulls. A phase's time is its most loaded link's bytes over
  the link's capacity plus the longest path latency (exact when the flows of a phase are
  alike and phases of different groups do not overlap: identical workers, one straggler).
- ASP: ``min(sum_i 1 / cycle_i, cpu / b_s)`` updates/s with ``cycle_i = c_i + push_i + b_s
  / cpu + pull_i`` (each worker alone on the network: exact while pushes do not overlap);
  the mean staleness is then exactly ``n - 1`` (a worker's read-to-apply interval is its
  cycle, during which every other worker ``j`` applies ``cycle_i / cycle_j`` updates).
- SSP with ``0 < s < inf``: identical workers never reach the bound (ASP's rate); behind a
  persistent straggler the others wait at the bound and the straggler's push releases
  them together, so they pull with it: the BSP round's pace, ``n`` updates a round (the
  staleness then has no closed form).
- Backup workers: that round closed at the ``n - b``-th sum (the late pushes it drops
  still cross the network: approximate).
- Gossip (D-PSGD): ``max c + the exchange`` (each worker sends its parameters to every
  neighbour at once); SGP: one peer a step; AD-PSGD: a swap with one neighbour.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sim.network.workers import SyncSetup, sgp_peer
from sim.spec.sync import architecture

__all__ = ["SyncRates", "sync_closed_form"]


@dataclass(frozen=True)
class SyncRates:
    updates_per_s: float  # in the strategy's scope (sim.des.workers.SCOPES)
    samples_per_s: float
    staleness_mean: float


def _phase_s(s: SyncSetup, flows: list[tuple[tuple[int, ...], float]]) -> float:
    """Seconds until every flow of a phase that starts at once is done: the most loaded
    link's bytes over its capacity, plus the longest path's latency."""
    load: dict[int, float] = {}
    lat = 0.0
    for path, nbytes in flows:
        for link in path:
            load[link] = load.get(link, 0.0) + nbytes
        lat = max(lat, s.topo.path_latency(path))
    cap = s.topo.cap
    return max((b / cap[link] for link, b in load.items()), default=0.0) + lat


def _ps_phases(s: SyncSetup, workers: list[int]) -> tuple[float, float]:
    """(push, pull) phase seconds of ``workers`` pushing to every shard at once."""
    assert s.servers is not None
    push, pull = [], []
    for w in workers:
        ranks = s.devices[w]
        for shard, frac in enumerate(s.shards):
            for d in ranks:
                push.append((s.servers.push_route(d, shard), s.push_bytes * frac / len(ranks)))
                pull.append((s.servers.pull_route(d, shard), s.pull_bytes * frac / len(ranks)))
    return _phase_s(s, push), _phase_s(s, pull)


def _ps_round(s: SyncSetup, waited: int) -> float:
    """A BSP round over servers: workers that finish computing together push together (one
    phase); the server sums pushes in arrival order, each as soon as it is in; the round
    closes at the ``waited``-th sum and everyone pulls at once."""
    finish: dict[float, list[int]] = {}
    for w, c in enumerate(s.compute_s):
        finish.setdefault(c, []).append(w)
    arrivals = []
    for c, group in sorted(finish.items()):
        arrivals += [c + _ps_phases(s, group)[0]] * len(group)
    done = 0.0
    for a in sorted(arrivals)[:waited]:
        done = max(done, a) + _sum_s(s)
    return done + _ps_phases(s, list(range(s.workers)))[1]


def _partition_round(s: SyncSetup) -> float:
    """A BSP step with the gradient in partitions (:mod:`sim.des.partitions`), identical
    workers: partition ``j`` is ready ``c (f + (1 - f)(j + 1) / P)`` in; pushes go one at a
    time, spread over the servers; each server's CPU sums the ``n`` pieces in turn; pulls
    go one at a time in order."""
    assert s.servers is not None
    c, parts, f, n = max(s.compute_s), s.partitions, s.forward_share, s.workers
    half = s.local_reduce_s / 2 / parts
    shards = len(s.shards)
    push, pull = [], []
    for w in range(n):
        ranks = s.devices[w]
        for d in ranks:
            for shard in range(shards):
                push.append((s.servers.push_route(d, shard), s.push_bytes / parts / shards
                             / len(ranks)))
                pull.append((s.servers.pull_route(d, shard), s.pull_bytes / parts / shards
                             / len(ranks)))
    push_s, pull_s = _phase_s(s, push), _phase_s(s, pull)
    sums_s = n * s.server_bytes / parts / shards / s.servers.cpu_Bps
    free = pushed = pulled = 0.0
    for j in range(parts):
        pushed = max(c * (f + (1 - f) * (j + 1) / parts), pushed) + half + push_s
        free = max(pushed, free) + sums_s
        pulled = max(free, pulled) + pull_s + half
    return pulled


def _sum_s(s: SyncSetup) -> float:
    assert s.servers is not None
    return s.server_bytes * max(s.shards) / s.servers.cpu_Bps


def _pair_flows(s: SyncSetup, src: int, dst: int) -> list[tuple[tuple[int, ...], float]]:
    per_rank = s.push_bytes / len(s.devices[src])
    return [(s.topo.route(a, b), per_rank)
            for a, b in zip(s.devices[src], s.devices[dst], strict=True)]


def _gossip_s(s: SyncSetup) -> float:
    """One step's exchange: D-PSGD every neighbour at once; SGP one peer, averaged over its
    cycle of distances; AD-PSGD one swap alone on the network."""
    mode, n = s.plan.sync.gossip_mode, s.workers
    if mode == "ad-psgd":
        j = s.neighbours(0)[0]
        return _phase_s(s, _pair_flows(s, 0, j) + _pair_flows(s, j, 0))
    if mode == "d-psgd":
        return _phase_s(s, [f for w in range(n) for j in s.neighbours(w)
                            for f in _pair_flows(s, w, j)])
    hops = max(1, math.ceil(math.log2(n)))
    return sum(_phase_s(s, [f for w in range(n) for f in _pair_flows(s, w, sgp_peer(w, k, n))])
               for k in range(hops)) / hops


def sync_closed_form(s: SyncSetup) -> SyncRates:
    """Steady-state rates of ``s``'s strategy on an idle network."""
    sync, n, c = s.plan.sync, s.workers, s.compute_s
    spp = s.samples_per_step
    slow = max(c)
    arch = architecture(s.plan)
    if arch == "ps":
        return _ps_rates(s)
    if sync.kind == "gossip":
        step = slow + _gossip_s(s) if sync.gossip_mode != "ad-psgd" else \
            sum(1 / (x + _gossip_s(s)) for x in c) / n
        if sync.gossip_mode == "ad-psgd":
            return SyncRates(step, step * n * spp, 0.0)
        return SyncRates(1 / step, n * spp / step, 0.0)
    if sync.kind == "bsp":
        step = slow + s.exposed_s
        return SyncRates(1 / step, n * spp / step, 0.0)
    if sync.kind == "two-stage":
        step = s.stage1_s + max(slow, s.stage2_s)
        return SyncRates(1 / step, n * spp / step, 0.0)
    period = sync.period * slow + s.average_s  # local-sgd, diloco
    return SyncRates(sync.period / period, n * spp * sync.period / period, 0.0)


def _ps_rates(s: SyncSetup) -> SyncRates:
    sync, n, c, spp = s.plan.sync, s.workers, s.compute_s, s.samples_per_step
    everyone = list(range(n))
    if sync.kind in ("bsp", "backup-workers") or (sync.kind == "ssp" and sync.staleness == 0):
        k = n - sync.backups
        step = _partition_round(s) if s.partitions else _ps_round(s, k)
        if sync.kind == "ssp":
            return SyncRates(n / step, n * spp / step, (n - 1) / 2)
        return SyncRates(1 / step, k * spp / step, 0.0)
    cycles = []
    for w in everyone:
        push, pull = _ps_phases(s, [w])
        cycles.append(c[w] + push + _sum_s(s) + pull)
    capacity = 1 / _sum_s(s)
    if sync.kind == "asp" or sync.staleness == math.inf or len(set(c)) == 1:
        rate = min(sum(1 / x for x in cycles), capacity)
        return SyncRates(rate, rate * spp, n - 1.0)
    rate = min(n / _ps_round(s, n), capacity)  # SSP behind a persistent straggler
    return SyncRates(rate, rate * spp, math.nan)
