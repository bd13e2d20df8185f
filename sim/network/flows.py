"""Flow-level network in SimPy: transfers share every link max-min fairly.

A flow is ``bytes`` over a routed path of link ids. It waits for the path's latency, then
joins the active set; whenever a flow joins or leaves, every active flow is re-rated by
progressive filling (weighted max-min), and the network wakes up at the next completion.

``weights`` let one simulated flow stand for several identical ones: a flow with weight
``w`` on a link uses ``w x rate`` of it (the symmetric copies it represents, or, below 1, a
flow the link serves faster, as in-switch reduction). Per-link bytes (weighted) and busy
time are recorded. The arithmetic is vectorised with numpy over the active (flow, link)
pairs, so a flow that stands for thousands of links costs one array, not a loop.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import simpy

__all__ = ["Network", "Flow", "max_min_rates"]

_EPS = 1e-12


@dataclass(eq=False)
class Flow:
    links: Sequence[int] | np.ndarray  # link ids (a tuple, or an int array)
    weights: Sequence[float] | np.ndarray
    remaining: float
    done: simpy.Event | None
    rate: float = 0.0
    lid: np.ndarray = field(init=False, repr=False)
    w: np.ndarray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.lid = np.asarray(self.links, dtype=np.int64)
        self.w = np.asarray(self.weights, dtype=np.float64)


@dataclass
class _Pairs:
    """The active flows' (flow, link) pairs as arrays."""

    flows: list[Flow]
    owner: np.ndarray  # pair -> flow index
    links: np.ndarray  # pair -> link id
    w: np.ndarray  # pair -> weight
    uniq: np.ndarray  # distinct links
    inv: np.ndarray  # pair -> index into uniq

    @classmethod
    def of(cls, flows: list[Flow]) -> _Pairs:
        links = np.concatenate([f.lid for f in flows])
        w = np.concatenate([f.w for f in flows])
        owner = np.repeat(np.arange(len(flows)), [len(f.lid) for f in flows])
        uniq, inv = np.unique(links, return_inverse=True)
        return cls(flows, owner, links, w, uniq, inv)


def _fill(p: _Pairs, cap: np.ndarray) -> np.ndarray:
    """Weighted progressive filling: all unfrozen rates grow alike until a link is full;
    the flows crossing it freeze at that level."""
    capu = cap[p.uniq]
    left = capu.copy()
    active = np.ones(len(p.flows), dtype=bool)
    rate = np.zeros(len(p.flows))
    level = 0.0
    while active.any():
        load = np.bincount(p.inv, weights=p.w * active[p.owner], minlength=len(p.uniq))
        used = load > _EPS
        if not used.any():
            break
        step = float(np.min(left[used] / load[used]))
        level += step
        left -= step * load
        full = used & (left <= _EPS * capu)
        hit = np.unique(p.owner[full[p.inv]])
        hit = hit[active[hit]]
        rate[hit] = level
        active[hit] = False
    return rate


def max_min_rates(flows: Sequence[Flow], cap: Sequence[float]) -> None:
    """Set every flow's ``rate`` (weighted max-min fair share)."""
    if not flows:
        return
    rates = _fill(_Pairs.of(list(flows)), np.asarray(cap, dtype=np.float64))
    for f, r in zip(flows, rates, strict=True):
        f.rate = float(r)


@dataclass
class _LinkStats:
    bytes: np.ndarray
    busy_s: np.ndarray


class Network:
    """Active flows of one simulation over a topology's links."""

    def __init__(self, env: simpy.Environment, cap: Sequence[float], lat: Sequence[float]):
        self.env, self.lat = env, lat
        self.cap = np.asarray(cap, dtype=np.float64)
        self.flows: list[Flow] = []
        self.stats = _LinkStats(np.zeros(len(cap)), np.zeros(len(cap)))
        self._pairs: _Pairs | None = None
        self._rates = np.zeros(0)
        self._last = 0.0
        self._wake: simpy.Event | None = None
        self.detour: Callable[[Flow], None] | None = None  # re-routes a flow in place

    def transfer(self, links: Sequence[int] | np.ndarray, size_bytes: float,
                 weights: Sequence[float] | np.ndarray | None = None,
                 latency_s: float | None = None) -> simpy.Event:
        """An event that succeeds when ``size_bytes`` have crossed ``links``, after the
        path's latency (default: the sum over ``links``)."""
        done = self.env.event()
        w = (1.0,) * len(links) if weights is None else weights
        if len(links) == 0 or size_bytes <= 0:
            done.succeed()
            return done
        lat = sum(self.lat[i] for i in links) if latency_s is None else latency_s
        self.env.process(self._start(Flow(links, w, float(size_bytes), done), lat))
        return done

    def _start(self, flow: Flow, latency_s: float) -> Generator[simpy.Event, Any, None]:
        yield self.env.timeout(latency_s)
        self._advance()
        if self.detour is not None:
            self.detour(flow)
        self.flows.append(flow)
        self._rerate()

    def reroute(self, detour: Callable[[Flow], None]) -> None:
        """From now on ``detour`` re-routes every flow (those in flight now, and each new
        one as it joins); the flows are re-rated on their new paths."""
        self._advance()
        self.detour = detour
        for f in self.flows:
            detour(f)
        self._rerate()

    def _advance(self) -> None:
        dt = self.env.now - self._last
        self._last = self.env.now
        if dt <= 0 or self._pairs is None:
            return
        p = self._pairs
        for f, r in zip(p.flows, self._rates, strict=True):
            f.remaining -= r * dt
        np.add.at(self.stats.bytes, p.links, p.w * self._rates[p.owner] * dt)
        self.stats.busy_s[p.uniq] += dt

    def _rerate(self) -> None:
        finished = [f for f in self.flows if f.remaining <= _EPS * max(1.0, f.rate)]
        for f in finished:
            self.flows.remove(f)
            assert f.done is not None
            f.done.succeed()
        if not self.flows:
            self._pairs = None
            return
        self._pairs = _Pairs.of(self.flows)
        self._rates = _fill(self._pairs, self.cap)
        for f, r in zip(self.flows, self._rates, strict=True):
            f.rate = float(r)
        wait = min(f.remaining / f.rate for f in self.flows)
        self._wake = self.env.timeout(max(wait, 0.0))
        self._wake.callbacks.append(self._on_wake)

    def _on_wake(self, event: simpy.Event) -> None:
        if event is not self._wake:
            return  # superseded by a later re-rating
        self._advance()
        for f in self.flows:  # absorb rounding so the earliest flow(s) finish now
            if f.rate > 0 and f.remaining / f.rate <= 1e-15 + 1e-9 * self.env.now:
                f.remaining = 0.0
        self._rerate()
