"""The state of one multi-step synchronisation run (:mod:`sim.des.workers`): the SimPy
environment and flow network, per-step jitter, barriers, and what the run records."""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import simpy

from sim.des.context import CountingEnv
from sim.network.flows import Network
from sim.network.workers import SyncSetup

__all__ = ["Record", "WorkerRun", "Barrier"]


@dataclass
class Record:
    """What a run recorded; times in seconds."""

    updates: list[float] = field(default_factory=list)  # time of each update
    marks: list[float] = field(default_factory=list)  # time of each global synchronisation
    samples: list[tuple[float, float]] = field(default_factory=list)  # (time, samples done)
    staleness: list[tuple[float, int]] = field(default_factory=list)  # (time, updates missed)
    compute_s: np.ndarray = field(default_factory=lambda: np.zeros(0))  # per worker
    steps: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=int))  # per worker
    finish_s: np.ndarray = field(default_factory=lambda: np.zeros(0))  # last compute's end
    link_bytes: np.ndarray = field(default_factory=lambda: np.zeros(0))  # per link id
    link_busy_s: np.ndarray = field(default_factory=lambda: np.zeros(0))
    server_busy_s: np.ndarray = field(default_factory=lambda: np.zeros(0))  # CPU, per server
    dropped: int = 0  # backup-workers: pushes that came too late
    stalled: str = ""  # why the run stopped early (a failed link left no path), if it did
    spans: list[dict[str, Any]] = field(default_factory=list)  # for the trace
    end_s: float = 0.0
    events: int = 0


class Barrier:
    """Succeeds step ``k``'s event when ``n`` arrivals for ``k`` are in."""

    def __init__(self, env: simpy.Environment, n: int) -> None:
        self.env, self.n = env, n
        self.count: dict[Any, int] = {}
        self.events: dict[Any, simpy.Event] = {}

    def event(self, k: Any) -> simpy.Event:
        if k not in self.events:
            self.events[k] = self.env.event()
        return self.events[k]

    def arrive(self, k: int) -> simpy.Event:
        ev = self.event(k)
        self.count[k] = self.count.get(k, 0) + 1
        if self.count[k] == self.n:
            ev.succeed()
            del self.count[k]
        return ev


class WorkerRun:
    def __init__(self, s: SyncSetup, steps: int, trace_steps: int) -> None:
        self.s, self.steps, self.trace_steps = s, steps, trace_steps
        self.env = CountingEnv()
        self.net = Network(self.env, s.topo.cap, s.topo.lat)
        self.net.check = False
        self.net.few = 16  # a worker's pushes and pulls: a few flows at a time
        n = s.workers
        rng = np.random.default_rng(s.seed)
        self.jit = np.ones((n, steps)) if s.jitter is None else \
            s.jitter.draw(rng, n * steps).reshape(n, steps)  # type: ignore[attr-defined]
        self.rng = rng
        servers = len(s.shards)
        self.rec = Record(compute_s=np.zeros(n), steps=np.zeros(n, dtype=int),
                          finish_s=np.zeros(n), server_busy_s=np.zeros(servers))
        self.barrier = Barrier(self.env, n)
        self.cpus = [simpy.Resource(self.env, 1) for _ in range(servers)]

    # helpers ------------------------------------------------------------------------------
    def span(self, who: str, what: str, t0: float, k: int) -> None:
        if k < self.trace_steps and self.env.now > t0:
            self.rec.spans.append({"who": who, "what": what, "start": t0, "end": self.env.now,
                                   "step": k})

    def compute(self, w: int, k: int) -> Generator[simpy.Event, Any, None]:
        d = self.s.compute_s[w] * float(self.jit[w, k])
        t0 = self.env.now
        yield self.env.timeout(d)
        self.rec.compute_s[w] += d
        self.rec.steps[w] += 1
        self.rec.finish_s[w] = self.env.now
        self.span(f"worker{w}", "compute", t0, k)

    def done(self, samples: float, update: bool = True) -> None:
        self.rec.samples.append((self.env.now, samples))
        if update:
            self.rec.updates.append(self.env.now)

    def flows(self, w: int, route: Any, total_bytes: float) -> simpy.Event:
        """``total_bytes`` from (or to) all ranks of worker ``w``, evenly."""
        ranks = self.s.devices[w]
        if len(ranks) == 1:
            return self.net.transfer(route(ranks[0]), total_bytes)
        return self.env.all_of([self.net.transfer(route(d), total_bytes / len(ranks))
                                for d in ranks])
