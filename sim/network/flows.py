"""Flow-level network in SimPy: transfers share every link max-min fairly.

A flow is ``bytes`` over a routed path of link ids. It waits for the path's latency, then
joins the active set; whenever flows join or leave, every active flow is re-rated by
progressive filling (weighted max-min), and the network wakes up at the next completion.
Changes are batched: every flow that joins or ends at one simulated time is applied by one
re-rating, run after all the other events of that time (:class:`_Flush`; a collective's
flows start together, so this is one re-rating per phase, not one per flow), which changes
no time: no simulated time passes between the changes and the re-rating.

``weights`` let one simulated flow stand for several identical ones: a flow with weight
``w`` on a link uses ``w x rate`` of it (the symmetric copies it represents, or, below 1, a
flow the link serves faster, as in-switch reduction). Per-link bytes (weighted) and busy
time are recorded. The arithmetic is vectorised with numpy over the active (flow, link)
pairs and the flows' remaining bytes, so a flow that stands for thousands of links costs one
array, not a loop."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import simpy
from simpy.events import EventPriority

__all__ = ["Network", "Flow", "Members", "AsymmetricFlows", "max_min_rates",
           "check_aggregates"]

_EPS = 1e-12
_NONE = np.zeros(0, dtype=np.int64)


class AsymmetricFlows(RuntimeError):
    """An aggregate flow's members would not all run at its rate: the reduction is not
    exact here (the step is run again unreduced; ``events`` it had simulated)."""

    events = 0


@dataclass
class Members:
    """The flows an aggregate stands for: each member's path, the copy of the collective
    (or transfer) it belongs to, and one member's weight on a link (``scale``).
    ``coupled``: the members of one copy move in lock step (a ring), so the copy is one
    flow; ``check``: a reduction's aggregate, checked (:func:`check_aggregates`)."""

    paths: list[tuple[int, ...]]
    copy: np.ndarray
    scale: float = 1.0
    coupled: bool = False
    check: bool = True
    flat: np.ndarray = field(init=False, repr=False)  # every member's links, concatenated
    member_of: np.ndarray = field(init=False, repr=False)  # -> member index

    def __post_init__(self) -> None:
        self.index()

    def index(self) -> None:
        self.flat = np.concatenate([np.asarray(p, dtype=np.int64) for p in self.paths])
        self.member_of = np.repeat(np.arange(len(self.paths)), [len(p) for p in self.paths])

    def union(self) -> tuple[np.ndarray, np.ndarray]:
        """(links, weights) of the aggregate: every link any member crosses, weighted by
        the members crossing it."""
        links, count = np.unique(self.flat, return_counts=True)
        return links, self.scale * count


@dataclass(eq=False)
class Flow:
    links: Sequence[int] | np.ndarray  # link ids (a tuple, or an int array)
    weights: Sequence[float] | np.ndarray
    remaining: float
    done: simpy.Event | None
    rate: float = 0.0
    members: Members | None = None  # what an aggregate flow stands for
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


def fill_few(flows: Sequence[Flow], cap: np.ndarray) -> list[float]:
    """:func:`_fill` in plain Python, for a handful of flows (numpy's per-call overhead
    dominates there): the same weighted progressive filling, link by link."""
    load: dict[int, float] = {}
    for f in flows:
        for link, w in zip(f.links, f.weights, strict=True):
            load[int(link)] = load.get(int(link), 0.0) + float(w)
    left = {link: float(cap[link]) for link in load}
    rate = [0.0] * len(flows)
    active = set(range(len(flows)))
    level = 0.0
    while active:
        used = {link: x for link, x in load.items() if x > _EPS}
        if not used:
            break
        step = min(left[link] / x for link, x in used.items())
        level += step
        full = set()
        for link, x in used.items():
            left[link] -= step * x
            if left[link] <= _EPS * float(cap[link]):
                full.add(link)
        for i in sorted(active):
            f = flows[i]
            if any(int(link) in full for link in f.links):
                rate[i] = level
                active.discard(i)
                for link, w in zip(f.links, f.weights, strict=True):
                    load[int(link)] -= float(w)
    return rate


def max_min_rates(flows: Sequence[Flow], cap: Sequence[float]) -> None:
    """Set every flow's ``rate`` (weighted max-min fair share)."""
    if not flows:
        return
    rates = _fill(_Pairs.of(list(flows)), np.asarray(cap, dtype=np.float64))
    for f, r in zip(flows, rates, strict=True):
        f.rate = float(r)


def check_aggregates(p: _Pairs, rates: np.ndarray, cap: np.ndarray, now: float) -> None:
    """Raise :class:`AsymmetricFlows` unless every aggregate's members would get its rate
    unreduced. Max-min rates are unique, and the unreduced flows at the aggregates' rates
    carry the same load on every link, so they are the unreduced allocation if every
    unreduced flow has a bottleneck: a full link on which no flow runs faster. A coupled
    aggregate's unreduced flows are its copies (each in lock step): each copy needs a
    member so held; an independent aggregate's members are one flow of each copy: each
    needs to be held itself."""
    capu = cap[p.uniq]
    load = np.bincount(p.inv, weights=p.w * rates[p.owner], minlength=len(p.uniq))
    full = load >= capu * (1 - 1e-9)
    fastest = np.zeros(len(p.uniq))
    np.maximum.at(fastest, p.inv, rates[p.owner])
    where = np.zeros(len(cap), dtype=np.int64)  # link id -> index into p.uniq (a gather
    where[p.uniq] = np.arange(len(p.uniq))  # per member link, not a search)
    for i, f in enumerate(p.flows):
        m = f.members
        if m is None or not m.check or len(m.paths) < 2:
            continue
        at = where[m.flat]
        neck = full[at] & (fastest[at] <= rates[i] * (1 + 1e-9))
        held = np.bincount(m.member_of, weights=neck, minlength=len(m.paths)) > 0
        if m.coupled:
            held = (np.bincount(m.copy, weights=held) > 0)[m.copy]
        if not held.all():
            bad = int(np.flatnonzero(~held)[0])
            raise AsymmetricFlows(
                f"at {now:.6g} s a flow standing for {len(m.paths)} would run faster on "
                f"member {bad}'s path (links {list(m.paths[bad])}) than the others")


@dataclass
class _LinkStats:
    bytes: np.ndarray
    busy_s: np.ndarray


class _Flush(simpy.Event):
    """An event processed after every other event already due at the current time (SimPy
    orders a time's events by priority: URGENT 0, NORMAL 1; this is 2)."""

    def __init__(self, env: simpy.Environment) -> None:
        super().__init__(env)
        self._ok, self._value = True, None
        env.schedule(self, EventPriority(2))


class Network:
    """Active flows of one simulation over a topology's links."""

    def __init__(self, env: simpy.Environment, cap: Sequence[float], lat: Sequence[float]):
        self.env, self.lat = env, lat
        self.cap = np.asarray(cap, dtype=np.float64)
        self.flows: list[Flow] = []
        self.stats = _LinkStats(np.zeros(len(cap)), np.zeros(len(cap)))
        self.rerates = 0  # re-ratings run (for benchmarks)
        self.check = True  # check aggregate flows (:func:`check_aggregates`)
        self.few = 0  # up to this many flows are rated by fill_few (plain Python)
        self._pairs: _Pairs | None = None
        self._rates = np.zeros(0)
        self._left = np.zeros(0)  # remaining bytes, aligned with self.flows
        self._link_Bps: np.ndarray = np.zeros(0)  # bytes/s on each of self._pairs.uniq
        self._joining: list[Flow] = []
        self._rebuild = False  # paths changed (a re-route)
        self._last = 0.0
        self._wake: simpy.Event | None = None
        self._flush: simpy.Event | None = None
        self._woke = False
        self.detour: Callable[[Flow], None] | None = None  # re-routes a flow in place

    def transfer(self, links: Sequence[int] | np.ndarray, size_bytes: float,
                 weights: Sequence[float] | np.ndarray | None = None,
                 latency_s: float | None = None, members: Members | None = None
                 ) -> simpy.Event:
        """An event that succeeds when ``size_bytes`` have crossed ``links``, after the
        path's latency (default: the sum over ``links``); ``members``: the flows an
        aggregate stands for (checked at every re-rating, :func:`check_aggregates`)."""
        done = self.env.event()
        w = (1.0,) * len(links) if weights is None else weights
        if len(links) == 0 or size_bytes <= 0:
            done.succeed()
            return done
        lat = sum(self.lat[i] for i in links) if latency_s is None else latency_s
        flow = Flow(links, w, float(size_bytes), done, members=members)
        self.env.timeout(lat).callbacks.append(lambda _e: self._join(flow))
        return done

    def _join(self, flow: Flow) -> None:
        if self.detour is not None:
            self.detour(flow)
        self._joining.append(flow)
        self._request()

    def reroute(self, detour: Callable[[Flow], None]) -> None:
        """From now on ``detour`` re-routes every flow (those in flight now, and each new
        one as it joins); the flows are re-rated on their new paths."""
        self._advance()
        self.detour = detour
        for f in self.flows + self._joining:
            detour(f)
        self._rebuild = True
        self._request()

    def _request(self) -> None:
        """Re-rate once every event of this time has run."""
        if self._flush is None:
            self._flush = _Flush(self.env)
            self._flush.callbacks.append(self._rerate)

    def _advance(self) -> None:
        dt = self.env.now - self._last
        self._last = self.env.now
        if dt <= 0 or self._pairs is None:
            return
        self._left -= self._rates * dt
        self.stats.bytes[self._pairs.uniq] += self._link_Bps * dt
        self.stats.busy_s[self._pairs.uniq] += dt

    def _rerate(self, _event: simpy.Event) -> None:
        self._flush = None
        self._advance()
        if self._woke:  # absorb rounding so the earliest flow(s) finish now
            self._woke = False
            with np.errstate(divide="ignore", invalid="ignore"):
                soon = (self._rates > 0) & (
                    self._left / self._rates <= 1e-15 + 1e-9 * self.env.now)
            self._left[soon] = 0.0
        changed = self._rebuild or bool(self._joining)
        if self.flows:
            over = self._left <= _EPS * np.maximum(1.0, self._rates)
            if over.any():
                changed = True
                keep = []
                for f, ended in zip(self.flows, over.tolist(), strict=True):
                    if ended:
                        assert f.done is not None
                        f.done.succeed()
                    else:
                        keep.append(f)
                self.flows = keep
                self._left = self._left[~over]
        if self._joining:
            self.flows += self._joining
            self._left = np.concatenate([self._left, [f.remaining for f in self._joining]])
            self._joining = []
        self._rebuild = False
        if not self.flows:
            self._pairs, self._wake = None, None
            return
        if changed:
            self._rates_for_flows()
        wait = float(np.min(self._left / self._rates))
        self._wake = self.env.timeout(max(wait, 0.0))
        self._wake.callbacks.append(self._on_wake)

    def _rates_for_flows(self) -> None:
        self.rerates += 1
        if len(self.flows) <= self.few and all(f.members is None for f in self.flows):
            self._few_rates()
            return
        p = self._pairs = _Pairs.of(self.flows)
        self._rates = _fill(p, self.cap)
        if self.check and any(f.members is not None for f in self.flows):
            check_aggregates(p, self._rates, self.cap, self.env.now)
        self._link_Bps = np.bincount(p.inv, weights=p.w * self._rates[p.owner],
                                     minlength=len(p.uniq)).astype(np.float64)
        for f, r in zip(self.flows, self._rates.tolist(), strict=True):
            f.rate = r

    def _few_rates(self) -> None:
        """:meth:`_rates_for_flows` for a handful of plain flows, in plain Python (only the
        links' ids and bytes/s are kept for the statistics)."""
        rates = fill_few(self.flows, self.cap)
        on: dict[int, float] = {}
        for f, r in zip(self.flows, rates, strict=True):
            f.rate = r
            for link, w in zip(f.links, f.weights, strict=True):
                on[int(link)] = on.get(int(link), 0.0) + float(w) * r
        links = sorted(on)
        self._pairs = _Pairs(self.flows, _NONE, _NONE, _NONE, np.array(links, dtype=np.int64),
                             _NONE)
        self._link_Bps = np.array([on[x] for x in links])
        self._rates = np.array(rates)

    def _on_wake(self, event: simpy.Event) -> None:
        if event is not self._wake:
            return  # superseded by a later re-rating
        self._woke = True
        self._request()
