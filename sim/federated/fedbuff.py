"""FedBuff (Nguyen et al., AISTATS 2022): asynchronous federated training with a buffer.

``concurrency`` clients train at any time. Each downloads the current model (the server's
egress, shared), trains, and uploads its update (the ingress, shared; or each at its own
bandwidth with ``network = "scalar"``). The server adds arriving updates to a buffer and,
once ``buffer`` are in, applies their average as one server step (taking the aggregation
time; updates arriving meanwhile wait for the next buffer). Each client that reports or
drops out is replaced at once by a newly sampled online client that is not training.
An update's staleness is the number of server steps applied between its download and its
use.
"""

from __future__ import annotations

import bisect
import heapq
import math
from typing import Any

import numpy as np

from sim.errors import SpecError
from sim.federated.clients import Fleet
from sim.network.shared_link import SharedLink

__all__ = ["run_fedbuff"]


class _Links:
    """The server's egress and ingress; with ``scalar`` each transfer alone at its cap."""

    def __init__(self, fleet: Fleet) -> None:
        s = fleet.job.server
        self.scalar = fleet.job.training.network == "scalar"
        self.down = SharedLink(s.egress_Gbps * 1e9 / 8)
        self.up = SharedLink(s.ingress_Gbps * 1e9 / 8)

    def next_time(self) -> float:
        return min(self.down.next_finish, self.up.next_finish)

    def advance(self, t: float) -> None:
        self.down.advance(t)
        self.up.advance(t)


class _Server:
    def __init__(self, fleet: Fleet, counts: dict[str, int]) -> None:
        tr = fleet.job.training
        self.fleet, self.K, self.counts = fleet, tr.buffer_size, counts
        self.buffer: list[int] = []
        self.busy_until = 0.0
        self.ends: list[float] = []  # when each server step was applied (sorted)
        self.steps: list[dict[str, Any]] = []
        self.agg_s = tr.buffer_size * tr.model_bytes / (fleet.job.server.aggregate_GBps * 1e9)

    def version_at(self, t: float) -> int:
        """The model version a client downloading at ``t`` gets: steps applied by then."""
        return bisect.bisect_right(self.ends, t)

    def arrive(self, t: float, version: int) -> bool:
        """An update trained from ``version`` arrives; True if it fills the buffer."""
        self.buffer.append(version)
        if len(self.buffer) < self.K:
            return False
        start = max(t, self.busy_until)
        self.busy_until = start + self.agg_s
        used, self.buffer = self.buffer[:self.K], self.buffer[self.K:]
        step = len(self.steps)  # this step applies on top of version `step`
        stale = [step - v for v in used]
        self.steps.append({"round": step, "start_s": self.ends[-1] if self.ends else 0.0,
                           "end_s": self.busy_until, "updates": self.K,
                           "staleness_mean": float(np.mean(stale)),
                           "staleness_max": int(max(stale)), "aggregate_s": self.agg_s,
                           "failed": False, **self.counts})
        self.ends.append(self.busy_until)
        return True


class _Loop:
    """The event loop: timed events in a heap, the two links' finishes between them."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet, self.tr, self.c = fleet, fleet.job.training, fleet.c
        self.counts = {"sampled": 0, "dropped": 0}  # so far (each step row keeps totals)
        self.links, self.server = _Links(fleet), _Server(fleet, self.counts)
        self.busy = np.zeros(len(self.c.ids), dtype=bool)
        self.events: list[tuple[float, int, str, int]] = []  # (time, seq, what, client)
        self.version_of: dict[int, int] = {}
        self.seq = 0
        self.empty_hours = 0  # dispatches in a row that found nobody online

    def push(self, t: float, what: str, client: int) -> None:
        heapq.heappush(self.events, (t, self.seq, what, client))
        self.seq += 1

    def dispatch(self, t: float, count: int) -> None:
        picked = self.fleet.sample(t, count, self.busy)
        self.empty_hours = self.empty_hours + 1 if not len(picked) else 0
        if self.empty_hours > 24 * 7:
            raise SpecError("population.availability", "no client came online in a week "
                            "of virtual time")
        if len(picked) < count:  # too few online: try again at the next hour
            self.push(self.fleet.next_hour(t), "dispatch", count - len(picked))
        for cl in picked:
            self.busy[cl] = True
            self.counts["sampled"] += 1
            self.push(t + self.fleet.latency_s, "download", int(cl))

    def transfer(self, t: float, link: SharedLink, cl: int, cap: float, done: str) -> None:
        if self.links.scalar:
            self.push(t + self.tr.model_bytes / cap, done, cl)
        else:
            link.add(cl, self.tr.model_bytes, cap)

    def handle(self, t: float, what: str, cl: int, progress: Any) -> None:
        fleet = self.fleet
        if what == "dispatch":
            self.dispatch(t, cl)
        elif what == "download":
            self.version_of[cl] = self.server.version_at(t)
            self.transfer(t, self.links.down, cl, float(self.c.down_Bps[cl]), "downloaded")
        elif what == "downloaded":
            if fleet.drops(1)[0]:  # leaves during training: replaced when it would report
                self.counts["dropped"] += 1
                self.push(t + fleet.compute_s[cl], "left", cl)
            else:
                self.push(t + fleet.compute_s[cl] + fleet.latency_s, "upload", cl)
        elif what == "upload":
            self.transfer(t, self.links.up, cl, float(self.c.up_Bps[cl]), "uploaded")
        else:  # uploaded or left: the client is free, a new one starts
            self.busy[cl] = False
            if what == "uploaded" and self.server.arrive(t, self.version_of[cl]) and progress:
                progress(len(self.server.steps))
            self.dispatch(t, 1)

    def run(self, progress: Any) -> list[dict[str, Any]]:
        links, events = self.links, self.events
        self.dispatch(0.0, self.tr.in_flight)
        while len(self.server.steps) < self.tr.rounds:
            t_ev = events[0][0] if events else math.inf
            t_link = links.next_time()
            if not math.isfinite(min(t_ev, t_link)):
                break
            if t_link < t_ev:
                links.advance(t_link)
                for link, what in ((links.down, "downloaded"), (links.up, "uploaded")):
                    if link.next_finish <= t_link:
                        for cl in link.pop_done():
                            self.push(t_link, what, cl)
                continue
            t, _, what, cl = heapq.heappop(events)
            links.advance(t)
            self.handle(t, what, cl, progress)
        done = {"sampled": 0, "dropped": 0}
        for row in self.server.steps:  # totals so far -> this step's own counts
            row["duration_s"] = row["end_s"] - row["start_s"]
            for key in done:
                row[key], done[key] = row[key] - done[key], row[key]
        return self.server.steps


def run_fedbuff(fleet: Fleet, progress: Any = None) -> list[dict[str, Any]]:
    """Server steps of a FedBuff job until ``rounds`` of them are applied."""
    return _Loop(fleet).run(progress)
