"""BSP over parameter servers with the gradient in partitions, pipelined with the backward
(BytePS; set up by :mod:`sim.strategies.byteps`), in the multi-step DES.

Worker ``w``'s step ``k`` starts its local step at ``t0``; partition ``j`` of ``P`` is ready
at ``t0 + c (f + (1 - f)(j + 1) / P)`` (``c`` the jittered step, ``f`` the forward's
share). The worker pushes its partitions one at a time, in that order, each spread evenly
over the servers (BytePS hashes many small keys over them) as flows from every one of its
ranks (after its share of the node's local sum); each server's CPU sums its pieces in
arrival order; once every worker's partition ``j`` of step ``k`` is summed everywhere, the
workers pull it, in partition order, one at a time (then their share of the node's
broadcast). The next step starts when the last partition is pulled.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import simpy

from sim.des.servers import server_sum
from sim.des.worker_run import WorkerRun

__all__ = ["start"]


def start(run: WorkerRun) -> None:
    summed: dict[tuple[int, int], int] = {}
    ready: dict[tuple[int, int], simpy.Event] = {}
    for w in range(run.s.workers):
        run.env.process(_worker(run, w, summed, ready))


def _worker(run: WorkerRun, w: int, summed: dict[tuple[int, int], int],
            ready: dict[tuple[int, int], simpy.Event]) -> Generator[simpy.Event, Any, None]:
    env, s = run.env, run.s
    parts, f, shards = s.partitions, s.forward_share, len(run.cpus)
    servers = s.servers
    assert servers is not None
    for k in range(run.steps):
        t0 = env.now
        c = s.compute_s[w] * float(run.jit[w, k])
        run.rec.compute_s[w] += c
        run.rec.steps[w] += 1
        last: simpy.Process | None = None
        for j in range(parts):
            due = t0 + c * (f + (1 - f) * (j + 1) / parts)
            if due > env.now:
                yield env.timeout(due - env.now)
            if j == parts - 1:
                run.rec.finish_s[w] = env.now
                run.span(f"worker{w}", "compute", t0, k)
            if s.local_reduce_s:
                yield env.timeout(s.local_reduce_s / 2 / parts)
            p0 = env.now
            yield env.all_of([run.flows(w, lambda d, sh=shard: servers.push_route(d, sh),
                                        s.push_bytes / parts / shards)
                              for shard in range(shards)])
            run.span(f"worker{w}", f"push{j}", p0, k)
            sums = [env.process(_sum(run, k, j, shard, summed, ready))
                    for shard in range(shards)]
            last = env.process(_pull(run, w, k, j, sums, last, ready))
        assert last is not None
        yield last
        run.done(s.samples_per_step, update=w == 0)
        if w == 0:
            run.rec.marks.append(env.now)


def _ready(run: WorkerRun, ready: dict[tuple[int, int], simpy.Event], key: tuple[int, int]
           ) -> simpy.Event:
    if key not in ready:
        ready[key] = run.env.event()
    return ready[key]


def _sum(run: WorkerRun, k: int, j: int, shard: int, summed: dict[tuple[int, int], int],
         ready: dict[tuple[int, int], simpy.Event]) -> Generator[simpy.Event, Any, None]:
    """Server ``shard``'s CPU sums its piece of the worker's push of partition ``j``; the
    last of every worker's pieces makes the partition ready to pull."""
    s = run.s
    key, shards = (k, j), len(run.cpus)
    yield from server_sum(run, shard, share=1 / s.partitions / shards, step=k)
    summed[key] = summed.get(key, 0) + 1
    if summed[key] == s.workers * shards:
        del summed[key]
        _ready(run, ready, key).succeed()


def _pull(run: WorkerRun, w: int, k: int, j: int, sums: list[simpy.Process],
          before: simpy.Process | None, ready: dict[tuple[int, int], simpy.Event]
          ) -> Generator[simpy.Event, Any, None]:
    """Once every worker's partition ``j`` is summed and this worker has pulled the one
    before, pull its pieces from every server."""
    env, s = run.env, run.s
    servers = s.servers
    assert servers is not None
    yield env.all_of(sums)
    yield _ready(run, ready, (k, j))
    if before is not None:
        yield before
    t0 = env.now
    shards = len(run.cpus)
    yield env.all_of([run.flows(w, lambda d, sh=shard: servers.pull_route(d, sh),
                                s.pull_bytes / s.partitions / shards)
                      for shard in range(shards)])
    if s.local_reduce_s:
        yield env.timeout(s.local_reduce_s / 2 / s.partitions)
    run.span(f"worker{w}", f"pull{j}", t0, k)
