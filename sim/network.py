"""Flow-level network in SimPy: transfers share every link max-min fairly.

A flow is ``bytes`` over a routed path of link ids. It waits for the path's latency, then
joins the active set; whenever a flow joins or leaves, every active flow is re-rated by
progressive filling (weighted max-min), and the network wakes up at the next completion.

``weights`` let one simulated flow stand for several identical ones: a flow with weight
``w`` on a link uses ``w x rate`` of it (the symmetric copies it represents, or, below 1, a
flow the link serves faster, as in-switch reduction). Per-link bytes (weighted) and busy
time are recorded.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from dataclasses import dataclass
from typing import Any

import simpy

__all__ = ["Network", "Flow", "max_min_rates"]

_EPS = 1e-12


@dataclass(eq=False)
class Flow:
    links: tuple[int, ...]
    weights: tuple[float, ...]
    remaining: float
    done: simpy.Event
    rate: float = 0.0


def max_min_rates(flows: Sequence[Flow], cap: Sequence[float]) -> None:
    """Set every flow's rate: weighted progressive filling. All unfrozen flows' rates grow
    alike until some link is full; the flows on it freeze at that level, and their weight
    leaves every other link they cross (``load`` is the unfrozen weight per link)."""
    left: dict[int, float] = {}
    load: dict[int, float] = {}
    users: dict[int, list[Flow]] = {}
    for f in flows:
        for link, w in zip(f.links, f.weights, strict=True):
            if link not in left:
                left[link], load[link], users[link] = cap[link], 0.0, []
            load[link] += w
            users[link].append(f)
    frozen: set[int] = set()
    level = 0.0
    while load:
        step = min(left[lk] / w for lk, w in load.items())
        level += step
        full = []
        for lk, w in load.items():
            left[lk] -= step * w
            if left[lk] <= _EPS * cap[lk] or left[lk] <= 0:
                full.append(lk)
        for lk in full:
            for f in users[lk]:
                if id(f) in frozen:
                    continue
                frozen.add(id(f))
                f.rate = level
                for link, w in zip(f.links, f.weights, strict=True):
                    if link in load:
                        load[link] -= w
            load.pop(lk, None)
        for lk in [lk for lk, w in load.items() if w <= _EPS]:
            del load[lk]


@dataclass
class _LinkStats:
    bytes: list[float]
    busy_s: list[float]


class Network:
    """Active flows of one simulation over a topology's links."""

    def __init__(self, env: simpy.Environment, cap: Sequence[float], lat: Sequence[float]):
        self.env, self.cap, self.lat = env, cap, lat
        self.flows: list[Flow] = []
        self.stats = _LinkStats([0.0] * len(cap), [0.0] * len(cap))
        self._last = 0.0
        self._on_link: dict[int, set[Flow]] = {}
        self._wake: simpy.Event | None = None
        self.events = 0

    def transfer(self, links: tuple[int, ...], size_bytes: float,
                 weights: tuple[float, ...] | None = None, latency_s: float | None = None
                 ) -> simpy.Event:
        """An event that succeeds when ``size_bytes`` have crossed ``links``, after the
        path's latency (default: the sum over ``links``)."""
        done = self.env.event()
        w = weights or (1.0,) * len(links)
        if not links or size_bytes <= 0:
            done.succeed()
            return done
        lat = sum(self.lat[i] for i in links) if latency_s is None else latency_s
        self.env.process(self._start(Flow(links, w, float(size_bytes), done), lat))
        return done

    def _start(self, flow: Flow, latency_s: float) -> Generator[simpy.Event, Any, None]:
        yield self.env.timeout(latency_s)
        self._advance()
        self.flows.append(flow)
        for link in flow.links:
            self._on_link.setdefault(link, set()).add(flow)
        self._rerate([flow])

    def _advance(self) -> None:
        dt = self.env.now - self._last
        self._last = self.env.now
        if dt <= 0:
            return
        busy: set[int] = set()
        for f in self.flows:
            f.remaining -= f.rate * dt
            for link, w in zip(f.links, f.weights, strict=True):
                self.stats.bytes[link] += w * f.rate * dt
                busy.add(link)
        for link in busy:
            self.stats.busy_s[link] += dt

    def _component(self, seeds: list[Flow]) -> list[Flow]:
        """Active flows connected to ``seeds`` through shared links: only their rates can
        change when the seeds start or finish."""
        seen: dict[int, Flow] = {}
        links = [link for f in seeds for link in f.links]
        done_links: set[int] = set()
        while links:
            link = links.pop()
            if link in done_links:
                continue
            done_links.add(link)
            for f in self._on_link.get(link, ()):
                if id(f) not in seen:
                    seen[id(f)] = f
                    links.extend(f.links)
        return list(seen.values())

    def _rerate(self, changed: list[Flow]) -> None:
        """Re-rate the flows connected to those that started (``changed``) or finished."""
        self.events += 1
        finished = [f for f in self.flows if f.remaining <= _EPS * max(1.0, f.rate)]
        for f in finished:
            self.flows.remove(f)
            for link in f.links:
                self._on_link[link].discard(f)
            f.done.succeed()
        if not self.flows:
            return
        affected = self._component(changed + finished)
        if affected:
            max_min_rates(affected, self.cap)
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
        self._rerate([])
