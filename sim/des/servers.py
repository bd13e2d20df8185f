"""Parameter-server synchronisation in the multi-step DES (:mod:`sim.des.workers`):
``bsp``, ``asp``, ``ssp`` and ``backup-workers`` over sharded CPU servers."""

from __future__ import annotations

import math
from collections.abc import Callable, Generator
from typing import Any

import numpy as np
import simpy

from sim.des.worker_run import WorkerRun

__all__ = ["start", "server_sum"]


class _Shards:
    """Server-side state: pushes applied per (shard, worker), versions, SSP waiters,
    and for backup workers the steps each shard closed."""

    def __init__(self, run: WorkerRun) -> None:
        n, servers = run.s.workers, len(run.s.shards)
        self.applied = np.zeros((servers, n), dtype=np.int64)
        self.version = [0] * servers
        self.waiters: list[list[tuple[int, simpy.Event]]] = [[] for _ in range(servers)]
        self.read = [0] * n  # shard-0 version each worker last read
        self.closed = [0] * servers  # backup workers: steps closed per shard
        self.finished = 0  # backup workers: workers done with their steps
        self.count: list[dict[int, int]] = [{} for _ in range(servers)]
        self.step_done: list[dict[int, simpy.Event]] = [{} for _ in range(servers)]

    def wait_min(self, env: simpy.Environment, shard: int, clocks: float) -> simpy.Event:
        """An event that succeeds once every worker has ``clocks`` pushes applied on
        ``shard``."""
        ev = env.event()
        if self.applied[shard].min() >= clocks:
            ev.succeed()
        else:
            self.waiters[shard].append((int(clocks), ev))
        return ev

    def applied_one(self, shard: int, w: int, marks: list[float], now: float) -> None:
        before = int(self.applied[shard].min())
        self.applied[shard, w] += 1
        low = int(self.applied[shard].min())
        if shard == 0 and low > before:  # every worker has this clock in: a renewal point
            marks.append(now)
        if self.waiters[shard] and low >= min(c for c, _ in self.waiters[shard]):
            keep = []
            for clocks, ev in self.waiters[shard]:
                if low >= clocks:
                    ev.succeed()
                else:
                    keep.append((clocks, ev))
            self.waiters[shard] = keep

    def step_event(self, env: simpy.Environment, shard: int, step: int) -> simpy.Event:
        d = self.step_done[shard]
        if step not in d:
            d[step] = env.event()
        return d[step]


def start(run: WorkerRun) -> None:
    state = _Shards(run)
    body = _backup_worker if run.s.plan.sync.kind == "backup-workers" else _worker
    for w in range(run.s.workers):
        run.env.process(body(run, state, w))


def server_sum(run: WorkerRun, shard: int, skip: Callable[[], bool] | None = None,
               share: float | None = None, step: int = 0
               ) -> Generator[simpy.Event, Any, bool]:
    """The shard's CPU sums (or applies) one push of ``share`` of the gradient (default:
    the shard's); with ``skip``, asked once the CPU is free, a push it says is stale is
    dropped unsummed. ``step`` labels the trace span."""
    s = run.s
    if share is None:
        share = s.shards[shard]
    with run.cpus[shard].request() as turn:
        yield turn
        if skip is not None and skip():
            return False
        t0 = run.env.now
        busy = s.server_bytes * share / s.servers.cpu_Bps  # type: ignore[union-attr]
        yield run.env.timeout(busy)
        run.rec.server_busy_s[shard] += busy
        run.span(f"server{shard}", "sum", t0, step)
    return True


def _transfer(run: WorkerRun, w: int, shard: int, step: int, push: bool
              ) -> Generator[simpy.Event, Any, None]:
    """Worker ``w``'s share of the gradient to server ``shard`` (``push``) or of the
    parameters back, over the network."""
    s = run.s
    servers = s.servers
    assert servers is not None
    route = servers.push_route if push else servers.pull_route
    t0 = run.env.now
    yield run.flows(w, lambda d: route(d, shard),
                    (s.push_bytes if push else s.pull_bytes) * s.shards[shard])
    run.span(f"worker{w}", f"{'push' if push else 'pull'}{shard}", t0, step)


def _send_push(run: WorkerRun, w: int, shard: int, step: int
               ) -> Generator[simpy.Event, Any, None]:
    yield from _transfer(run, w, shard, step, True)


def _pull_flows(run: WorkerRun, w: int, shard: int, step: int
                ) -> Generator[simpy.Event, Any, None]:
    yield from _transfer(run, w, shard, step, False)


def _round(run: WorkerRun, state: _Shards, w: int, k: int, shard: int
           ) -> Generator[simpy.Event, Any, None]:
    """Push to ``shard``, its CPU applies it, wait for the SSP bound, pull: each shard on
    its own, as the real servers answer (executor/sync/server.py)."""
    kind = run.s.plan.sync.kind
    yield from _send_push(run, w, shard, k)
    yield from server_sum(run, shard)
    if shard == 0 and kind != "bsp":
        run.rec.staleness.append((run.env.now, state.version[0] - state.read[w]))
        run.done(run.s.samples_per_step)  # an update: this push applied
    state.version[shard] += 1
    state.applied_one(shard, w, run.rec.marks if kind != "bsp" else [], run.env.now)
    bound = 0 if kind == "bsp" else math.inf if kind == "asp" else run.s.plan.sync.staleness
    t0 = run.env.now
    if bound != math.inf:
        yield state.wait_min(run.env, shard, k + 1 - bound)
    run.span(f"worker{w}", "wait", t0, k)
    if shard == 0:
        state.read[w] = state.version[0]
    yield from _pull_flows(run, w, shard, k)


def _worker(run: WorkerRun, state: _Shards, w: int) -> Generator[simpy.Event, Any, None]:
    env, shards = run.env, range(len(run.s.shards))
    bsp = run.s.plan.sync.kind == "bsp"
    for k in range(run.steps):
        yield from run.compute(w, k)
        if len(shards) == 1:  # no concurrent shards: no processes to join
            yield from _round(run, state, w, k, 0)
        else:
            yield env.all_of([env.process(_round(run, state, w, k, i)) for i in shards])
        if bsp:  # the summed update is in once every pull can start
            run.done(run.s.samples_per_step, update=w == 0)
            if w == 0:
                run.rec.marks.append(run.env.now)


# Backup workers ------------------------------------------------------------------------------
def _close(run: WorkerRun, state: _Shards, shard: int) -> None:
    """Close the shard's open step once ``n - b`` pushes of it are in (fewer once workers
    have finished their steps, as the real server does)."""
    s = run.s
    need = min(s.workers - s.plan.sync.backups, s.workers - state.finished)
    step = state.closed[shard]
    if state.count[shard].get(step, 0) >= max(1, need):
        state.closed[shard] = step + 1
        state.count[shard].pop(step, None)
        state.step_event(run.env, shard, step).succeed()
        if shard == 0:
            run.rec.updates.append(run.env.now)


def _backup_round(run: WorkerRun, state: _Shards, w: int, tags: list[int], k: int,
                  shard: int) -> Generator[simpy.Event, Any, None]:
    """Push a gradient of step ``tags[shard]``; the shard sums it unless that step is
    closed (on arrival, or by the time its CPU is free); wait for the step to close,
    pull, and go on from the shard's newest step."""
    s, tag = run.s, tags[shard]
    yield from _send_push(run, w, shard, k)
    summed = False
    if tag >= state.closed[shard]:
        summed = yield from server_sum(run, shard, lambda: tag < state.closed[shard])
    if not summed:
        if shard == 0:
            run.rec.dropped += 1
    else:
        if shard == 0:
            run.done(s.samples_per_step, update=False)
        state.count[shard][tag] = state.count[shard].get(tag, 0) + 1
        _close(run, state, shard)
    t0 = run.env.now
    yield state.step_event(run.env, shard, tag)
    run.span(f"worker{w}", "wait", t0, k)
    yield from _pull_flows(run, w, shard, k)
    tags[shard] = state.closed[shard]


def _backup_worker(run: WorkerRun, state: _Shards, w: int) -> Generator[simpy.Event, Any, None]:
    env, shards = run.env, range(len(run.s.shards))
    tags = [0] * len(shards)  # the step of each shard's parameters this worker holds
    for k in range(run.steps):
        yield from run.compute(w, k)
        yield env.all_of([env.process(_backup_round(run, state, w, tags, k, i))
                          for i in shards])
    state.finished += 1
    for i in shards:  # fewer workers left: a step may close with fewer pushes now
        _close(run, state, i)
