"""One link shared max-min fairly by transfers that each have their own rate cap: a server's
ingress (or egress) and the clients' access links of a star network.

On a star whose only shared link is the server's, progressive filling gives each active
transfer ``min(cap, L)``, the water level ``L`` solving ``sum(min(cap_i, L)) = capacity``
(every transfer at its cap when the caps sum to less). :class:`SharedLink` keeps that
allocation exactly as transfers join and finish, in ``O(log n)`` a change amortised instead
of re-filling every transfer (:class:`sim.network.flows.Network` does the general case; the
tests check the two agree on stars):

- transfers below the level (*capped*) run at their cap: each has a fixed finish time while
  it stays capped (a heap of them);
- the others (*levelled*) all run at ``L``: one shared counter ``V`` of the bytes a levelled
  transfer has received since the link started orders them by ``V`` at entry plus bytes
  left (a heap), so advancing time touches no transfer;
- when the level moves, only the transfers whose cap it crosses change sides (heaps by cap
  on both sides), their bytes left settled at that moment.

Times are seconds, sizes bytes, rates bytes/s. A transfer with ``math.inf`` as its cap is
limited by the shared link alone.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field

__all__ = ["SharedLink", "share_transfers"]

_REL = 1e-10  # relative rounding below which a transfer counts as done


@dataclass
class _Side:
    """One side of the split: finish keys and caps in heaps, with lazy deletion."""

    finish: list[tuple[float, int]] = field(default_factory=list)
    by_cap: list[tuple[float, int]] = field(default_factory=list)  # levelled: min; capped: max


class SharedLink:
    """A link of ``capacity`` bytes/s; :meth:`add` transfers, :meth:`pop_done` finished ones
    in order of finish time (``next_finish`` says when the next one ends)."""

    def __init__(self, capacity: float) -> None:
        if not capacity > 0 or not math.isfinite(capacity):
            raise ValueError(f"capacity must be a positive finite rate, got {capacity!r}")
        self.capacity = float(capacity)
        self.now = 0.0
        self._v = 0.0  # bytes a levelled transfer has received since the start
        self._level = math.inf
        self._cap: dict[int, float] = {}
        self._capped: dict[int, tuple[float, float]] = {}  # id -> (bytes left, at time)
        self._levelled: dict[int, float] = {}  # id -> V at which it finishes
        self._sum_capped = 0.0
        self._lev = _Side()
        self._cpd = _Side()

    def __len__(self) -> int:
        return len(self._cap)

    @property
    def level(self) -> float:
        """The rate every uncapped transfer gets now (``inf`` when all run at their caps)."""
        return self._level if self._levelled else math.inf

    def rate(self, tid: int) -> float:
        return self._cap[tid] if tid in self._capped else self._level

    def add(self, tid: int, size: float, cap: float = math.inf) -> None:
        """Transfer ``tid`` of ``size`` bytes joins now, limited to ``cap`` bytes/s alone."""
        if tid in self._cap:
            raise ValueError(f"transfer {tid} is already on the link")
        if not cap > 0:
            raise ValueError(f"transfer {tid}: cap must be positive, got {cap!r}")
        self._cap[tid] = float(cap)
        self._to_levelled(tid, float(size))
        self._balance()

    def remove(self, tid: int) -> float:
        """Take ``tid`` off the link before it finished (cancelled); its bytes left."""
        left = self._left(tid)
        self._drop(tid)
        self._balance()
        return left

    def advance(self, t: float) -> None:
        """Move the clock to ``t`` (no later than :attr:`next_finish`)."""
        if t < self.now:
            raise ValueError(f"time runs forward: {t} < {self.now}")
        if self._levelled:
            self._v += self._level * (t - self.now)
        self.now = t

    @property
    def next_finish(self) -> float:
        """When the next transfer finishes at today's rates (``inf`` with none)."""
        best = math.inf
        top = self._top_capped()
        if top is not None:
            best = top[0]
        top = self._top_levelled()
        if top is not None:
            best = min(best, self.now + max(top[0] - self._v, 0.0) / self._level)
        return best

    def pop_done(self) -> list[int]:
        """Advance to the next finish and return every transfer ending then."""
        t = self.next_finish
        if not math.isfinite(t):
            return []
        self.advance(t)
        done: dict[int, None] = {}  # in order, once (a heap may hold a transfer twice)
        while (top := self._top_capped()) is not None and top[0] <= t + _REL * max(t, 1.0):
            heapq.heappop(self._cpd.finish)
            done[top[1]] = None
        slack = _REL * max(abs(self._v), 1.0)
        while (top := self._top_levelled()) is not None and top[0] - self._v <= slack:
            heapq.heappop(self._lev.finish)
            done[top[1]] = None
        for tid in done:
            self._drop(tid)
        self._balance()
        return list(done)

    # internals ---------------------------------------------------------------------------
    def _left(self, tid: int) -> float:
        if tid in self._capped:
            left, at = self._capped[tid]
            return left - self._cap[tid] * (self.now - at)
        return self._levelled[tid] - self._v

    def _top_capped(self) -> tuple[float, int] | None:
        heap = self._cpd.finish
        while heap:
            key, tid = heap[0]
            if tid in self._capped and self._finish_of(tid) == key:
                return key, tid
            heapq.heappop(heap)
        return None

    def _top_levelled(self) -> tuple[float, int] | None:
        heap = self._lev.finish
        while heap:
            key, tid = heap[0]
            if self._levelled.get(tid) == key:
                return key, tid
            heapq.heappop(heap)
        return None

    def _finish_of(self, tid: int) -> float:
        left, at = self._capped[tid]
        return at + left / self._cap[tid]

    def _to_levelled(self, tid: int, left: float) -> None:
        key = self._v + left
        self._levelled[tid] = key
        heapq.heappush(self._lev.finish, (key, tid))
        heapq.heappush(self._lev.by_cap, (self._cap[tid], tid))

    def _to_capped(self, tid: int, left: float) -> None:
        self._capped[tid] = (left, self.now)
        self._sum_capped += self._cap[tid]
        heapq.heappush(self._cpd.finish, (self._finish_of(tid), tid))
        heapq.heappush(self._cpd.by_cap, (-self._cap[tid], tid))

    def _drop(self, tid: int) -> None:
        if tid in self._capped:
            del self._capped[tid]
            self._sum_capped -= self._cap[tid]
        else:
            del self._levelled[tid]
        del self._cap[tid]
        if not self._capped:
            self._sum_capped = 0.0  # no drift from adding and taking away caps

    def _cap_top(self, side: _Side, live: dict) -> tuple[float, int] | None:
        """The smallest cap among levelled, or the largest among capped, transfers."""
        while side.by_cap:
            key, tid = side.by_cap[0]
            if tid in live:
                return abs(key), tid
            heapq.heappop(side.by_cap)
        return None

    def _balance(self) -> None:
        """Move transfers across until capped caps <= level <= levelled caps."""
        while True:
            n = len(self._levelled)
            self._level = (self.capacity - self._sum_capped) / n if n else math.inf
            low = self._cap_top(self._lev, self._levelled)
            if low is not None and low[0] < self._level:
                tid = low[1]
                left = self._levelled.pop(tid) - self._v
                self._to_capped(tid, left)
                continue
            high = self._cap_top(self._cpd, self._capped)
            if high is not None and (high[0] > self._level or (
                    not n and self._sum_capped > self.capacity)):
                tid = high[1]
                left = self._left(tid)
                del self._capped[tid]
                self._sum_capped -= self._cap[tid]
                self._to_levelled(tid, left)
                continue
            return


def share_transfers(capacity: float, starts: list[float], sizes: list[float],
                    caps: list[float]) -> list[float]:
    """Finish times of transfers starting at ``starts`` on one shared link (an offline
    batch: every start known in advance)."""
    order = sorted(range(len(starts)), key=lambda i: starts[i])
    link = SharedLink(capacity)
    done = [math.nan] * len(starts)
    k = 0
    while k < len(order) or len(link):
        t_next = starts[order[k]] if k < len(order) else math.inf
        if link.next_finish <= t_next:
            for tid in link.pop_done():
                done[tid] = link.now
            continue
        link.advance(t_next)
        while k < len(order) and starts[order[k]] <= t_next:
            i = order[k]
            if sizes[i] <= 0:
                done[i] = t_next
            else:
                link.add(i, sizes[i], caps[i])
            k += 1
    return done
