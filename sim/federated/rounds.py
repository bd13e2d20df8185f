"""Synchronous federated rounds (FedAvg, FedProx) on a virtual clock.

A round at time ``t0``: the server samples ``ceil(K x overcommit)`` online clients; each
downloads the model, trains, and uploads its update; the round ends when ``K`` updates have
arrived (later ones are cut off), at the deadline, or when every survivor has reported, and
the server then sums the updates (and, with secure aggregation, unmasks them).

- ``network = "shared"``: downloads share the server's egress and uploads its ingress
  max-min fairly, each capped by its client's link (:class:`sim.network.shared_link.
  SharedLink`); an upload cut off at the round's end leaves the link then.
- ``network = "scalar"``: FedScale's model, exactly: a client's time is ``compute +
  (up + down) / bandwidth`` (its own bandwidth, no sharing; a client with different up and
  down rates pays each direction at its own), the round lasts until the K-th fastest of the
  sample.

When no client is online (an hour of zero availability) the server waits for the next hour;
the wait is the round's ``waited_s``, not part of its duration.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from sim.errors import SpecError
from sim.federated.clients import Fleet, SecAggCost
from sim.network.shared_link import SharedLink, share_transfers

__all__ = ["run_rounds", "scalar_times", "shared_times"]


def scalar_times(fleet: Fleet, idx: np.ndarray, sec: SecAggCost) -> np.ndarray:
    """Each sampled client's time from the round's start without contention (FedScale's
    ``computation + communication``, plus latencies and secure-aggregation extras)."""
    c, m = fleet.c, fleet.job.training.model_bytes
    up_b, down_b = m + sec.up_bytes, m + sec.down_bytes
    ub, db = c.up_Bps[idx], c.down_Bps[idx]
    comm = np.where(ub == db, (up_b + down_b) / ub, up_b / ub + down_b / db)
    extra = 2.0 * fleet.latency_s * (1 + sec.round_trips) + sec.client_mask_s
    return fleet.compute_s[idx] + comm + extra


def shared_times(fleet: Fleet, idx: np.ndarray, lost: np.ndarray, sec: SecAggCost,
                 keep: int, deadline: float) -> tuple[np.ndarray, float]:
    """Each sampled client's upload finish (``inf``: cut off or dropped) with the server's
    links shared, and the round's end; times from the round's start."""
    job, c = fleet.job, fleet.c
    m, lat = job.training.model_bytes, fleet.latency_s
    n = len(idx)
    pre = 2.0 * lat * sec.round_trips  # the key rounds before the model goes out
    down = share_transfers(job.server.egress_Gbps * 1e9 / 8, [pre + lat] * n,
                           [m + sec.down_bytes] * n, list(c.down_Bps[idx]))
    ready = np.asarray(down) + fleet.compute_s[idx] + sec.client_mask_s + lat
    done = np.full(n, math.inf)
    link = SharedLink(job.server.ingress_Gbps * 1e9 / 8)
    order = [int(i) for i in np.argsort(ready, kind="stable") if not lost[i]]
    k, got, stop = 0, 0, deadline if deadline > 0 else math.inf
    end = 0.0
    while got < keep and (k < len(order) or len(link)):
        t_join = ready[order[k]] if k < len(order) else math.inf
        if min(t_join, link.next_finish) > stop:
            end = stop  # survivors still out at the deadline
            break
        if link.next_finish <= t_join:
            for tid in link.pop_done():
                done[tid] = end = link.now
                got += 1
            continue
        link.advance(t_join)
        link.add(order[k], m + sec.up_bytes, float(c.up_Bps[idx[order[k]]]))
        k += 1
    return done, float(end)


def _scalar_round(fleet: Fleet, idx: np.ndarray, lost: np.ndarray, sec: SecAggCost,
                  keep: int, deadline: float) -> tuple[np.ndarray, float]:
    """FedScale's round: survivors sorted by their uncontended times, the K-th ends it."""
    times = np.where(lost, math.inf, scalar_times(fleet, idx, sec))
    ok = times[np.argsort(times, kind="stable")]
    ok = ok[np.isfinite(ok)]
    stop = deadline if deadline > 0 else math.inf
    if len(ok) >= keep and ok[keep - 1] <= stop:
        end = float(ok[keep - 1])
    else:
        end = min(stop, float(ok[-1])) if len(ok) else 0.0
    return np.where(times <= end, times, math.inf), end


def _one_round(fleet: Fleet, t0: float) -> dict[str, Any]:
    job, tr = fleet.job, fleet.job.training
    idx = fleet.sample(t0, tr.sampled)
    waited = 0
    while len(idx) == 0:  # nobody online: the server waits for the next hour
        waited += 1
        if waited > 24 * 7:
            raise SpecError("population.availability", "no client came online in a week "
                            "of virtual time")
        t0 = fleet.next_hour(t0)
        idx = fleet.sample(t0, tr.sampled)
    row: dict[str, Any] = {"start_s": t0, "sampled": len(idx)}
    sec = SecAggCost.of(job, len(idx))
    keep = min(tr.clients_per_round, len(idx))
    lost = fleet.drops(len(idx))
    run = _scalar_round if tr.network == "scalar" else shared_times
    done, end = run(fleet, idx, lost, sec, keep, tr.deadline_s)
    client_s = np.sort(done[np.isfinite(done)])[:keep]
    used = len(client_s)
    failed = used < tr.min_clients
    agg = 0.0 if failed else used * tr.model_bytes / (job.server.aggregate_GBps * 1e9) \
        + sec.server_unmask_s(job, used, len(idx) - used)
    return row | {"end_s": t0 + end + agg, "collect_s": end, "updates": used,
                  "dropped": int(lost.sum()), "failed": failed, "aggregate_s": agg,
                  "client_s": client_s, "sampled_ids": fleet.c.ids[idx]}


def run_rounds(fleet: Fleet, progress: Any = None) -> list[dict[str, Any]]:
    """Every round of a FedAvg/FedProx job, in order."""
    rows, t = [], 0.0
    for r in range(fleet.job.training.rounds):
        row = _one_round(fleet, t)
        row["round"] = r
        row["duration_s"] = row["end_s"] - row["start_s"]
        row["waited_s"] = row["start_s"] - t
        rows.append(row)
        t = row["end_s"]
        if progress is not None:
            progress(r + 1)
    return rows
