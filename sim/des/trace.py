"""Chrome trace JSON of a DES timeline (opens in Perfetto / chrome://tracing; times in µs).

``pid`` is the node, ``tid`` a device's stream (compute, tp, cp, ep, pp, dp, send); a send
is drawn as an arrow from the sender's ``send`` slice to the receiver's ``pp`` stream.

A timeline holds one device per simulated unit: a tensor-parallel group runs in lock step
and is drawn as its first GPU, and a reduced run simulates one data-parallel replica per
symmetry class (one on a healthy cluster). When
fewer GPUs are drawn than the cluster has, the trace's ``otherData`` says so
(``gpus_shown``, ``gpus_total``, ``note``: "showing 4 of 256 GPUs: ...").
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sim.io import atomic_write_text
from sim.spec.cluster import ClusterSpec

__all__ = ["chrome_trace", "write_chrome_trace", "coverage", "STREAMS"]

STREAMS = ("compute", "tp", "cp", "ep", "pp", "dp", "optimizer", "send")


def _tid(device: int, stream: str) -> int:
    return device * len(STREAMS) + STREAMS.index(stream if stream in STREAMS else "compute")


def coverage(timeline: list[dict[str, Any]], cluster: ClusterSpec,
             classes: int | None = None) -> dict[str, Any]:
    """How many of the cluster's GPUs the timeline draws, and why not all (empty when all
    are drawn); ``classes``: the symmetry classes of a reduced run."""
    shown, total = len({item["device"] for item in timeline}), cluster.world_size
    if not timeline or shown >= total:
        return {}
    why = "a tensor-parallel group runs in lock step (drawn as its first GPU)"
    replicas = {(item["unit"].dp, item["unit"].cp) for item in timeline}
    if replicas == {(0, 0)}:
        why = f"data-parallel replicas are identical (one simulated), and {why}"
    elif classes is not None and classes > 1:
        why = f"one data-parallel replica per symmetry class ({classes} simulated), " \
            f"and {why}"
    return {"gpus_shown": shown, "gpus_total": total,
            "note": f"showing {shown} of {total} GPUs: {why}"}


def chrome_trace(timeline: list[dict[str, Any]], cluster: ClusterSpec,
                 classes: int | None = None) -> dict[str, Any]:
    g = cluster.gpus_per_node
    events: list[dict[str, Any]] = []
    named: set[tuple[int, int]] = set()
    for n, item in enumerate(sorted(timeline, key=lambda e: (e["start"], e["device"]))):
        dev, stream = item["device"], item["stream"]
        pid, tid = dev // g, _tid(dev, stream)
        if (pid, tid) not in named:
            named.add((pid, tid))
            events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                           "args": {"name": f"gpu{dev} {stream}"}})
            events.append({"ph": "M", "name": "process_name", "pid": pid, "tid": tid,
                           "args": {"name": f"node {pid}"}})
        ts, dur = item["start"] * 1e6, (item["end"] - item["start"]) * 1e6
        events.append({"ph": "X", "name": item["name"], "cat": stream, "pid": pid, "tid": tid,
                       "ts": ts, "dur": dur})
        if "to_device" in item:
            dst = item["to_device"]
            events.append({"ph": "s", "id": n, "name": "p2p", "cat": "p2p", "pid": pid,
                           "tid": tid, "ts": ts})
            events.append({"ph": "f", "bp": "e", "id": n, "name": "p2p", "cat": "p2p",
                           "pid": dst // g, "tid": _tid(dst, "pp"), "ts": ts + dur})
    note = coverage(timeline, cluster, classes)
    return {"traceEvents": events, "displayTimeUnit": "ms", **({"otherData": note} if note
                                                                else {})}


def write_chrome_trace(path: str | Path, timeline: list[dict[str, Any]],
                       cluster: ClusterSpec, classes: int | None = None) -> None:
    atomic_write_text(Path(path), json.dumps(chrome_trace(timeline, cluster, classes)) + "\n")
