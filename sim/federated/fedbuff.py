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


def run_fedbuff(fleet: Fleet, progress: Any = None) -> list[dict[str, Any]]:
    """Server steps of a FedBuff job until ``rounds`` of them are applied."""
    tr, c = fleet.job.training, fleet.c
    counts = {"sampled": 0, "dropped": 0}  # so far (each step row keeps the totals)
    links, server = _Links(fleet), _Server(fleet, counts)
    busy = np.zeros(len(c.ids), dtype=bool)
    events: list[tuple[float, int, str, int]] = []  # (time, seq, what, client)
    version_of: dict[int, int] = {}
    seq = 0

    def push(t: float, what: str, client: int) -> None:
        nonlocal seq
        heapq.heappush(events, (t, seq, what, client))
        seq += 1

    def dispatch(t: float, count: int) -> None:
        picked = fleet.sample(t, count, busy)
        if len(picked) < count:  # too few online: try again at the next hour
            push(fleet.next_hour(t), "dispatch", count - len(picked))
        for cl in picked:
            busy[cl] = True
            counts["sampled"] += 1
            push(t + fleet.latency_s, "download", int(cl))

    def start_transfer(t: float, link: SharedLink, cl: int, cap: float, done: str) -> None:
        if links.scalar:
            push(t + tr.model_bytes / cap, done, cl)
        else:
            link.add(cl, tr.model_bytes, cap)

    dispatch(0.0, tr.in_flight)
    while len(server.steps) < tr.rounds:
        t_ev = events[0][0] if events else math.inf
        t_link = links.next_time()
        if not math.isfinite(min(t_ev, t_link)):
            break
        if t_link < t_ev:
            links.advance(t_link)
            for cl in links.down.pop_done() if links.down.next_finish <= t_link else []:
                push(t_link, "downloaded", cl)
            for cl in links.up.pop_done() if links.up.next_finish <= t_link else []:
                push(t_link, "uploaded", cl)
            continue
        t, _, what, cl = heapq.heappop(events)
        links.advance(t)
        if what == "dispatch":
            dispatch(t, cl)
        elif what == "download":
            version_of[cl] = server.version_at(t)
            start_transfer(t, links.down, cl, float(c.down_Bps[cl]), "downloaded")
        elif what == "downloaded":
            if fleet.drops(1)[0]:  # leaves during training: replaced when it would report
                counts["dropped"] += 1
                push(t + fleet.compute_s[cl], "left", cl)
            else:
                push(t + fleet.compute_s[cl] + fleet.latency_s, "upload", cl)
        elif what == "upload":
            start_transfer(t, links.up, cl, float(c.up_Bps[cl]), "uploaded")
        else:  # uploaded or left: the client is free, a new one starts
            busy[cl] = False
            if what == "uploaded" and server.arrive(t, version_of[cl]) and progress:
                progress(len(server.steps))
            dispatch(t, 1)
    for row in server.steps:
        row["duration_s"] = row["end_s"] - row["start_s"]
    return server.steps
