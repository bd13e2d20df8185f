"""Chrome trace JSON of a DES timeline (opens in Perfetto / chrome://tracing; times in µs).

``pid`` is the node, ``tid`` a device's stream (compute, tp, cp, ep, pp, dp, send); a send
is drawn as an arrow from the sender's ``send`` slice to the receiver's ``pp`` stream.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sim.io import atomic_write_text
from sim.spec.cluster import ClusterSpec

__all__ = ["chrome_trace", "write_chrome_trace", "STREAMS"]

STREAMS = ("compute", "tp", "cp", "ep", "pp", "dp", "optimizer", "send")


def _tid(device: int, stream: str) -> int:
    return device * len(STREAMS) + STREAMS.index(stream if stream in STREAMS else "compute")


def chrome_trace(timeline: list[dict[str, Any]], cluster: ClusterSpec) -> dict[str, Any]:
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
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def write_chrome_trace(path: str | Path, timeline: list[dict[str, Any]],
                       cluster: ClusterSpec) -> None:
    atomic_write_text(Path(path), json.dumps(chrome_trace(timeline, cluster)) + "\n")
