"""Multi-step DES of data-parallel synchronisation: a clock per worker.

Every worker runs its own loop of local steps (:class:`sim.network.workers.SyncSetup`'s
``compute_s`` times a per-step jitter draw) and synchronises as its strategy says:

- **all-reduce strategies** (``bsp``, ``local-sgd``, ``diloco``): a barrier, then the
  reduction's time (BSP: what the one-step tier exposes; an average: the whole all-reduce
  and DiLoCo's outer step); ``two-stage``: the important part's all-reduce blocks, the rest
  runs on the communication stream under the next step's compute and must end before the
  next first stage starts.
- **parameter servers** (``bsp``, ``asp``, ``ssp``, ``backup-workers``): pushes and pulls are
  flows from each of the worker's ranks to each server shard over the topology, sharing
  links max-min fairly (:class:`sim.network.flows.Network`); a shard's CPU sums one push
  at a time. A worker pulls shard ``s`` once every worker has ``k + 1 - staleness`` pushes
  applied there (SSP; ``bsp`` is the same wait with the pushes summed into one update;
  ``asp`` never waits). ``backup-workers``: a shard closes step ``t`` at its ``n - b``-th
  push; later pushes of ``t`` are dropped, and their workers go on from the newest step.
  BSP with the gradient in partitions pipelines them with the backward
  (:mod:`sim.des.partitions`).
- **gossip**: ``d-psgd`` sends the worker's parameters to every neighbour and waits for
  theirs of the same step; ``sgp`` pushes to one peer a step (distance ``2^(k mod log n)``)
  and waits for its in-peer; ``ad-psgd`` swaps with a random neighbour without waiting for
  its progress.

Staleness of an update: the updates a server shard applied between the worker's read (the
start of its pull of shard 0) and this update's application there.
"""

from __future__ import annotations

import math
from collections.abc import Generator
from typing import Any

import numpy as np
import simpy

from sim.des import gossip, partitions, servers
from sim.des.worker_run import Record, WorkerRun
from sim.network.workers import SyncSetup
from sim.spec.sync import architecture

__all__ = ["Record", "run_workers", "steady_window"]

def run_workers(s: SyncSetup, steps: int, trace_steps: int = 0) -> Record:
    """Simulate ``steps`` local steps of every worker (the last worker's last step ends the
    run); ``trace_steps``: record spans of the first steps for a trace."""
    run = WorkerRun(s, steps, trace_steps)
    kind, arch = s.plan.sync.kind, architecture(s.plan)
    if s.failures:
        from sim.network.failures import install_failures

        install_failures(run.env, run.net, s.topo, s.failures)
    if arch == "ps":
        (partitions if s.partitions else servers).start(run)
    elif kind == "gossip":
        gossip.start(run)
    elif kind == "two-stage":
        run.env.process(_two_stage_coordinator(run))
        for w in range(s.workers):
            run.env.process(_two_stage_worker(run, w))
    else:
        for w in range(s.workers):
            run.env.process(_collective_worker(run, w))
    from sim.network.failures import CannotComplete

    try:
        run.env.run()
    except CannotComplete as exc:  # a flow or a reduction with no path left
        run.rec.stalled = f"{exc}; the run stalls at {run.env.now:.6g} s"
    run.rec.end_s = run.env.now
    run.rec.events = run.env.processed
    run.rec.link_bytes = run.net.stats.bytes
    run.rec.link_busy_s = run.net.stats.busy_s
    return run.rec


def cost(run: WorkerRun, name: str) -> float:
    """``name``'s seconds (a :class:`SyncSetup` field) now: after the first link failure,
    the failed network's (:mod:`sim.strategies.failures`)."""
    s = run.s
    if run.env.now < s.fail_at or not s.after:
        return float(getattr(s, name))
    if "stalled" in s.after:
        from sim.network.failures import CannotComplete

        raise CannotComplete("the data-parallel reduction has no path left")
    return s.after[name]


def _sync_cost(run: WorkerRun, k: int) -> float | None:
    """Seconds of the synchronisation after step ``k`` (None: a local step)."""
    sync = run.s.plan.sync
    if sync.kind == "bsp":
        return cost(run, "exposed_s")
    if k < sync.warmup_steps:  # post-local SGD: BSP first
        return cost(run, "exposed_s")
    return cost(run, "average_s") if (k + 1 - sync.warmup_steps) % sync.period == 0 else None


def _collective_worker(run: WorkerRun, w: int) -> Generator[simpy.Event, Any, None]:
    s, env = run.s, run.env
    local = s.plan.sync.kind != "bsp"
    for k in range(run.steps):
        yield from run.compute(w, k)
        cost = _sync_cost(run, k)
        if cost is None or local:
            run.done(s.samples_per_step, update=local)
        if cost is None:
            continue
        t0 = env.now
        yield run.barrier.arrive(k)
        run.span(f"worker{w}", "wait", t0, k)
        t0 = env.now
        yield env.timeout(cost)
        run.span(f"worker{w}", "allreduce", t0, k)
        if w == 0:
            run.rec.marks.append(env.now)
        if not local:
            run.done(s.samples_per_step, update=w == 0)


def _two_stage_coordinator(run: WorkerRun) -> Generator[simpy.Event, Any, None]:
    """The shared communication stream: stage 1 of step ``k`` after every worker's compute
    and the previous stage 2; then stage 2 runs while the workers compute."""
    s, env = run.s, run.env
    stage2_end = 0.0
    for k in range(run.steps):
        yield run.barrier.event(k)
        if stage2_end > env.now:
            yield env.timeout(stage2_end - env.now)
        t0 = env.now
        yield env.timeout(cost(run, "stage1_s"))
        run.span("stream", "stage1", t0, k)
        run.done(s.samples_per_step * s.workers)
        run.rec.marks.append(env.now)
        run.barrier.event(("go", k)).succeed()
        stage2_end = env.now + cost(run, "stage2_s")
        if k < run.trace_steps:
            run.rec.spans.append({"who": "stream", "what": "stage2", "start": env.now,
                                  "end": stage2_end, "step": k})
    if stage2_end > env.now:
        yield env.timeout(stage2_end - env.now)


def _two_stage_worker(run: WorkerRun, w: int) -> Generator[simpy.Event, Any, None]:
    for k in range(run.steps):
        yield from run.compute(w, k)
        t0 = run.env.now
        run.barrier.arrive(k)
        yield run.barrier.event(("go", k))
        run.span(f"worker{w}", "wait", t0, k)


def steady_window(times: list[float]) -> tuple[int, float, float]:
    """(first kept index, start, end) of the steady part of a series of event times:
    MSER-5 (White 1997) on the gaps between them drops the warm-up."""
    ts = sorted(times)
    if len(ts) < 3:
        return 0, ts[0] if ts else 0.0, ts[-1] if ts else 0.0
    gaps = [b - a for a, b in zip(ts, ts[1:], strict=False)]
    cut = _mser5(gaps)
    return cut, ts[cut], ts[-1]


def _mser5(samples: list[float]) -> int:
    """Warm-up samples to drop: batch means of 5, the cut ``d`` (over the first half)
    minimising the variance of the rest's mean, ``sum((x - mean)^2) / (n - d)^2``."""
    batches = [sum(samples[i:i + 5]) / 5 for i in range(0, len(samples) - 4, 5)]
    if len(batches) < 4:
        return 0
    best, cut = math.inf, 0
    for d in range(len(batches) // 2):
        rest = np.asarray(batches[d:])
        score = float(((rest - rest.mean()) ** 2).sum()) / len(rest) ** 2
        if score < best * (1 - 1e-9):
            best, cut = score, d
    return cut * 5
