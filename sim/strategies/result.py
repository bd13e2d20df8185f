"""What a multi-step synchronisation run predicts
(:func:`sim.strategies.simulate.simulate_sync`), and its Perfetto trace."""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from sim.io import atomic_write_text
from sim.network.workers import SyncSetup
from sim.spec.sync import architecture

if TYPE_CHECKING:
    from sim.analytic.sync import SyncRates
    from sim.des.workers import Record

__all__ = ["SyncResult", "summarise", "write_sync_trace", "strategy_label", "SCOPES",
           "samples_per_update"]

# What one update is: a global step of all workers, one push a server applies, or one
# worker's local step (updates_per_s then counts an average worker's).
SCOPES = {"bsp": "global", "two-stage": "global", "backup-workers": "global", "asp": "server",
          "ssp": "server", "local-sgd": "local", "diloco": "local", "gossip": "local"}


_SHOWN = ("staleness", "period", "backups", "graph")


def samples_per_update(plan: Any, scope: str) -> float:
    """Samples one update of ``scope`` applies: a BSP step's (the ``n - b`` pushes backup
    workers keep), one worker's batch (a server update), or every worker's local step."""
    batch = plan.global_batch_size / plan.dp
    return {"global": batch * (plan.dp - plan.sync.backups), "server": batch,
            "local": batch * plan.dp}[scope]


def strategy_label(plan: Any) -> str:
    """``ssp(staleness=2) over ps x2 dedicated, int8``."""
    sync, default = plan.sync.to_dict(), type(plan.sync)()
    kind = sync.pop("kind")
    args = ",".join(f"{k}={v}" for k, v in sync.items() if k != "edges" and (
        getattr(plan.sync, k) != getattr(default, k) or k in _SHOWN))
    arch = architecture(plan)
    where = arch
    if arch == "ps":
        c = plan.communication
        where = f"ps x{c.servers} {c.placement}"
    comp = plan.compression.kind
    return f"{kind}{f'({args})' if args else ''} over {where}" + (
        f", {comp}" if comp != "none" else "")


@dataclass(frozen=True)
class SyncResult:
    fidelity: str  # `analytic` (closed form) or `des` (multi-step)
    model: str
    cluster: str
    strategy: str  # strategy_label
    workers: int  # data-parallel replicas
    update_scope: str  # global, server or local (SCOPES)
    updates_per_s: float  # updates in update_scope a second (local: one worker's)
    samples_per_s: float  # samples (sequences, images) whose gradients were applied, a second
    step_time_s: float  # seconds an update takes (1 / updates_per_s; server scope: x workers)
    bsp_iteration_s: float  # the one-step tier's BSP iteration, for reference
    staleness: dict[str, Any]  # mean, p99, max, histogram {updates missed: count}
    idle_fraction: list[float]  # per worker: share of the time not computing
    servers: list[dict[str, float]]  # per server: cpu and ingress utilisation
    links: list[dict[str, Any]] = field(default_factory=list)  # busiest links (DES)
    steps: int = 0  # local steps every worker ran (DES; the fewest any ran)
    warmup_updates_dropped: int = 0  # updates before the steady window (MSER-5; DES)
    dropped_fraction: float = 0.0  # backup workers: pushes that came too late
    warnings: list[str] = field(default_factory=list)
    simulation: dict[str, Any] = field(default_factory=dict)
    # updates and seconds to a target accuracy from a measured model (sim.strategies.accuracy)
    time_to_target: dict[str, Any] = field(default_factory=dict)
    fits_in_memory: bool = True  # the one-step tier's verdict on the plan's memory
    wire_ratio: float = 1.0  # the gradient's bytes uncompressed over those on the wire

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def _staleness(values: list[int]) -> dict[str, Any]:
    if not values:
        return {"mean": 0.0, "p99": 0.0, "max": 0, "histogram": {}}
    arr = np.asarray(values)
    hist = Counter(values)
    return {"mean": float(arr.mean()), "p99": float(np.percentile(arr, 99)),
            "max": int(arr.max()), "histogram": {str(k): hist[k] for k in sorted(hist)}}


def summarise(s: SyncSetup, tier: Any, fidelity: str, *, rates: SyncRates | None = None,
              record: Record | None = None, wall_s: float, model: Any, cluster: Any
              ) -> SyncResult:
    scope = SCOPES[s.plan.sync.kind]
    base = dict(fidelity=fidelity, fits_in_memory=bool(getattr(tier, "fits_in_memory", True)),
                wire_ratio=s.server_bytes / s.push_bytes if s.push_bytes else 1.0,
                model=model.name, cluster=cluster.name,
                strategy=strategy_label(s.plan), workers=s.workers, update_scope=scope,
                bsp_iteration_s=tier.iteration_time_s, warnings=list(s.notes))
    if rates is not None:
        per = rates.updates_per_s
        busy = [c * per for c in s.compute_s]  # a step of c_i every 1 / per seconds
        return SyncResult(**base, updates_per_s=per, samples_per_s=rates.samples_per_s,
                          step_time_s=_step(per, scope, s.workers),
                          staleness={"mean": None if math.isnan(rates.staleness_mean)
                                     else rates.staleness_mean},
                          idle_fraction=[max(0.0, 1 - b) for b in busy] if scope != "server"
                          else [], servers=[], simulation={"wall_s": wall_s})
    assert record is not None
    return _from_record(s, record, base, wall_s)


def _step(updates_per_s: float, scope: str, workers: int) -> float:
    if updates_per_s <= 0:
        return float("inf")
    return (workers if scope == "server" else 1) / updates_per_s


def _from_record(s: SyncSetup, rec: Record, base: dict[str, Any], wall_s: float
                 ) -> SyncResult:
    from sim.des.workers import steady_window
    from sim.network.links import link_table

    scope = base["update_scope"]
    # the steady window runs between renewal points: syncs where there are (an average of
    # local SGD, a BSP step), else updates
    # (while every worker still runs: a fast one that is done would leave the rest alone)
    busy_until = float(rec.finish_s.min())
    marks = [t for t in (rec.marks if len(rec.marks) >= 3 else rec.updates) if t <= busy_until]
    if len(marks) < 3:
        marks = rec.marks or rec.updates
    after = [t for t in marks if t > s.fail_at]
    if not rec.stalled and len(after) >= 3:  # a link failed mid-run: the rates after it
        marks = after
        base["warnings"] = [*base["warnings"], f"rates measured after the link failure at "
                            f"{s.fail_at:g} s"]
    cut, t0, t1 = steady_window(marks)
    span = t1 - t0
    kept = sum(1 for t in rec.updates if t0 < t <= t1)
    per = kept / span if span > 0 else 0.0
    if scope == "local":
        per /= s.workers
    samples = sum(x for t, x in rec.samples if t0 < t <= t1)
    stale = [tau for t, tau in rec.staleness if t0 < t <= t1]  # the steady window only
    servers = []
    if s.servers is not None:
        for i in range(len(s.shards)):
            ingress = s.servers.ingress(i)
            used = float(sum(rec.link_bytes[j] / (s.topo.cap[j] * rec.end_s) for j in ingress))
            servers.append({"server": i, "cpu": float(rec.server_busy_s[i] / rec.end_s),
                            "ingress": used / max(1, len(ingress))})
    pushes = rec.dropped + len(rec.samples)
    if rec.steps.min() < rec.steps.max():
        base["warnings"] = [*base["warnings"], f"some workers did not finish their steps "
                            f"({int(rec.steps.min())} of {int(rec.steps.max())}): the run "
                            "could not go on without them"]
    rate = samples / span if span > 0 else 0.0
    if rec.stalled:  # no progress from the stall on: the long-run rates are zero
        base["warnings"] = [*base["warnings"], f"cannot complete: {rec.stalled} (rates 0; "
                            f"{len(rec.updates)} updates before it)"]
        per = rate = 0.0
    return SyncResult(
        **base, updates_per_s=per, samples_per_s=rate,
        step_time_s=_step(per, scope, s.workers), staleness=_staleness(stale),
        idle_fraction=[float(1 - c / rec.end_s) for c in rec.compute_s], servers=servers,
        links=link_table(s.topo, rec.link_bytes, rec.link_busy_s, rec.end_s),
        steps=int(rec.steps.min()),
        warmup_updates_dropped=sum(1 for t in rec.updates if t <= t0),
        dropped_fraction=rec.dropped / pushes if rec.dropped else 0.0,
        simulation={"events": rec.events, "wall_s": wall_s, "simulated_s": rec.end_s,
                    **({"stalled_at_s": rec.end_s} if rec.stalled else {})})


def write_sync_trace(path: str | Path, rec: Record, s: SyncSetup) -> None:
    """Chrome trace JSON (Perfetto; µs): a process per worker and server, a thread per kind
    of span (compute, push/pull per shard, sends, waits)."""
    events: list[dict[str, Any]] = []
    pids: dict[str, int] = {}
    tids: dict[tuple[str, str], int] = {}
    for span in sorted(rec.spans, key=lambda x: (x["start"], x["who"])):
        who, what = span["who"], span["what"]
        if who not in pids:
            pids[who] = len(pids)
            events.append({"ph": "M", "name": "process_name", "pid": pids[who],
                           "args": {"name": who}})
        key = (who, what)
        if key not in tids:
            tids[key] = len(tids)
            events.append({"ph": "M", "name": "thread_name", "pid": pids[who],
                           "tid": tids[key], "args": {"name": what}})
        events.append({"ph": "X", "name": what, "pid": pids[who], "tid": tids[key],
                       "ts": span["start"] * 1e6, "dur": (span["end"] - span["start"]) * 1e6,
                       "args": {"step": span["step"]}})
    doc = {"traceEvents": events, "displayTimeUnit": "ms",
           "otherData": {"strategy": strategy_label(s.plan), "workers": s.workers}}
    atomic_write_text(Path(path), json.dumps(doc))
