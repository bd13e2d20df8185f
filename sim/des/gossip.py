"""Gossip synchronisation in the multi-step DES (:mod:`sim.des.workers`): D-PSGD, SGP
(push-sum over an exponential schedule) and AD-PSGD. A worker's message is its parameters
(``push_bytes``), sent from each of its ranks to the same rank of the peer."""

from __future__ import annotations

import math
from collections.abc import Generator
from typing import Any

import simpy

from sim.des.worker_run import WorkerRun
from sim.network.workers import sgp_peer

__all__ = ["start"]


class _Inbox:
    """Messages of step ``k`` each worker has received, and the event that fires when
    ``expect`` of them are in."""

    def __init__(self, env: simpy.Environment) -> None:
        self.env = env
        self.got: dict[tuple[int, int], int] = {}
        self.events: dict[tuple[int, int], simpy.Event] = {}

    def event(self, w: int, k: int) -> simpy.Event:
        if (w, k) not in self.events:
            self.events[(w, k)] = self.env.event()
        return self.events[(w, k)]

    def deliver(self, w: int, k: int, expect: int) -> None:
        key = (w, k)
        self.got[key] = self.got.get(key, 0) + 1
        if self.got[key] == expect:
            self.event(w, k).succeed()
            del self.got[key]


def start(run: WorkerRun) -> None:
    inbox = _Inbox(run.env)
    body = {"d-psgd": _dpsgd, "sgp": _sgp, "ad-psgd": _adpsgd}[run.s.plan.sync.gossip_mode]
    for w in range(run.s.workers):
        run.env.process(body(run, inbox, w))


def _send(run: WorkerRun, inbox: _Inbox, src: int, dst: int, k: int, expect: float
          ) -> Generator[simpy.Event, Any, None]:
    s = run.s
    pairs = zip(s.devices[src], s.devices[dst], strict=True)
    per_rank = s.push_bytes / len(s.devices[src])
    t0 = run.env.now
    yield run.env.all_of([run.net.transfer(s.topo.route(a, b), per_rank) for a, b in pairs])
    run.span(f"worker{src}", f"send{dst}", t0, k)
    if expect != math.inf:
        inbox.deliver(dst, k, int(expect))


def _dpsgd(run: WorkerRun, inbox: _Inbox, w: int) -> Generator[simpy.Event, Any, None]:
    env, s = run.env, run.s
    peers = s.neighbours(w)
    for k in range(run.steps):
        yield from run.compute(w, k)
        sends = [env.process(_send(run, inbox, w, j, k, len(s.neighbours(j)))) for j in peers]
        t0 = env.now
        yield env.all_of([*sends, inbox.event(w, k)])
        run.span(f"worker{w}", "wait", t0, k)
        run.done(s.samples_per_step)


def _sgp(run: WorkerRun, inbox: _Inbox, w: int) -> Generator[simpy.Event, Any, None]:
    env, s = run.env, run.s
    for k in range(run.steps):
        yield from run.compute(w, k)
        send = env.process(_send(run, inbox, w, sgp_peer(w, k, s.workers), k, 1))
        t0 = env.now
        yield env.all_of([send, inbox.event(w, k)])
        run.span(f"worker{w}", "wait", t0, k)
        run.done(s.samples_per_step)


def _adpsgd(run: WorkerRun, inbox: _Inbox, w: int) -> Generator[simpy.Event, Any, None]:
    """Swap parameters with a random neighbour (both directions at once), never waiting for
    its progress; the next step starts once the swap is done."""
    env, s = run.env, run.s
    peers = s.neighbours(w)
    for k in range(run.steps):
        yield from run.compute(w, k)
        j = peers[int(run.rng.integers(len(peers)))]
        t0 = env.now
        yield env.all_of([
            env.process(_send(run, inbox, w, j, k, math.inf)),
            env.process(_send(run, inbox, j, w, k, math.inf))])
        run.span(f"worker{w}", "swap", t0, k)
        run.done(s.samples_per_step)
