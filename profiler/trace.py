"""Import a PyTorch profiler (Kineto) Chrome trace: per-kernel and per-collective times.

Collectives are recognised from the backend's own annotations (``gloo:all_reduce``,
``nccl:all_reduce``) and from NCCL kernels (``ncclDevKernel_AllReduce_...``); their sizes
come from the recorded input shapes when the trace has them (``record_shapes=True``).
Compute is the GPU kernels when the trace has any, else the CPU operators counted by their
self time (nested operators are not counted twice). Pure JSON parsing: no torch needed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sim.errors import SpecError
from sim.io import read_chrome_trace

__all__ = ["TraceSummary", "summarize_trace", "collective_kind"]

_NCCL_KINDS = (("allreduce", "all_reduce"), ("allgather", "all_gather"),
               ("reducescatter", "reduce_scatter"), ("alltoall", "all_to_all"),
               ("broadcast", "broadcast"), ("sendrecv", "send_recv"), ("send", "send_recv"),
               ("recv", "send_recv"))
_DTYPE_BYTES = {"float": 4, "c10::BFloat16": 2, "c10::Half": 2, "double": 8, "long int": 8,
                "int": 4}


def collective_kind(name: str) -> str | None:
    """``gloo:all_reduce`` / ``nccl:all_gather`` / ``ncclDevKernel_AllReduce_Sum_f32_RING_LL``
    -> the collective; None for anything else."""
    m = re.match(r"(?:gloo|nccl):(\w+)$", name)
    if m:
        return m.group(1)
    if name.startswith("nccl"):
        flat = name.lower().replace("_", "")
        for needle, kind in _NCCL_KINDS:
            if needle in flat:
                return kind
    return None


def _bytes(args: dict[str, Any]) -> int | None:
    dims, types = args.get("Input Dims"), args.get("Input type")
    if not dims or not types or not isinstance(dims[0], list):
        return None
    n = 1
    for d in dims[0]:
        n *= int(d)
    return n * _DTYPE_BYTES.get(types[0], 4)


@dataclass
class _Acc:
    count: int = 0
    total_us: float = 0.0
    sizes: set[int] = field(default_factory=set)

    def add(self, dur_us: float, size: int | None) -> None:
        self.count += 1
        self.total_us += dur_us
        if size is not None:
            self.sizes.add(size)


@dataclass
class TraceSummary:
    source: str
    span_us: float
    compute_kind: str  # "kernel" (GPU) or "cpu_op"
    compute: dict[str, _Acc]
    collectives: dict[str, _Acc]

    def rows(self, table: str, top: int | None = None) -> list[dict[str, Any]]:
        items = sorted(getattr(self, table).items(), key=lambda kv: -kv[1].total_us)[:top]
        return [{"name": k, "count": a.count, "total_ms": a.total_us / 1e3,
                 "mean_us": a.total_us / a.count, "bytes": sorted(a.sizes)} for k, a in items]

    def to_dict(self, top: int | None = None) -> dict[str, Any]:
        return {"source": self.source, "span_ms": self.span_us / 1e3,
                "compute_kind": self.compute_kind, "compute": self.rows("compute", top),
                "collectives": self.rows("collectives")}


def _self_times(events: list[dict[str, Any]]) -> list[float]:
    """Each event's duration minus that of the events directly nested in it (same thread)."""
    order = sorted(range(len(events)), key=lambda i: (events[i].get("pid"), events[i].get("tid"),
                                                      float(events[i]["ts"]),
                                                      -float(events[i]["dur"])))
    self_us = [float(e["dur"]) for e in events]
    stack: list[int] = []
    for i in order:
        e = events[i]
        thread, ts = (e.get("pid"), e.get("tid")), float(e["ts"])
        while stack and ((events[stack[-1]].get("pid"), events[stack[-1]].get("tid")) != thread
                         or float(events[stack[-1]]["ts"]) + float(events[stack[-1]]["dur"])
                         <= ts):
            stack.pop()
        if stack:
            self_us[stack[-1]] -= float(e["dur"])
        stack.append(i)
    return self_us


def summarize_trace(path: str | Path) -> TraceSummary:
    events = read_chrome_trace(Path(path), "trace")
    if not events:
        raise SpecError("trace", f"{path} holds no complete ('X') events")
    kind = "kernel" if any(e.get("cat") == "kernel" for e in events) else "cpu_op"
    compute: dict[str, _Acc] = {}
    colls: dict[str, _Acc] = {}
    ops = [e for e in events if e.get("cat") == kind]
    own = dict(zip(map(id, ops), _self_times(ops) if kind == "cpu_op" else
                   [float(e["dur"]) for e in ops], strict=True))
    for e in events:
        name, cat, dur = str(e.get("name", "")), e.get("cat"), float(e["dur"])
        coll = collective_kind(name) if cat in ("user_annotation", "kernel") else None
        if coll:
            colls.setdefault(coll, _Acc()).add(dur, _bytes(e.get("args", {})))
        elif cat == kind and not name.startswith("c10d::"):
            compute.setdefault(name, _Acc()).add(own[id(e)], None)
    start = min(float(e["ts"]) for e in events)
    end = max(float(e["ts"]) + float(e["dur"]) for e in events)
    return TraceSummary(str(path), end - start, kind, compute, colls)
