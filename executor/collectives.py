"""The collectives a step really issues, recorded at torch's dispatcher.

Every c10d collective — DTensor's functional collectives, DDP's and FSDP2's bucket
reductions, the pipeline's send/recv — passes torch's dispatcher as a ``c10d`` or
``_c10d_functional`` op with its tensors and process group; a ``TorchDispatchMode`` (the hook
torch's own ``CommDebugMode`` uses) sees each with its group. Gloo's profiler events carry no
group, which is why the group comes from here and not from the Kineto trace.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["CollectiveRecorder", "KINDS", "summarize", "trace_collectives", "attribute"]

# op name -> (kind, index of the argument whose bytes are the full buffer). Functional
# all-gathers pass only their shard (index marked negative: times the group size they pass).
KINDS = {
    "allreduce_": ("all_reduce", 0), "allreduce_coalesced_": ("all_reduce", 0),
    "all_reduce": ("all_reduce", 0), "all_reduce_coalesced": ("all_reduce", 0),
    "allgather_": ("all_gather", 0), "_allgather_base_": ("all_gather", 0),
    "allgather_into_tensor_coalesced_": ("all_gather", 0),
    "all_gather_into_tensor": ("all_gather", -1),
    "all_gather_into_tensor_coalesced": ("all_gather", -1),
    "reduce_scatter_": ("reduce_scatter", 1), "_reduce_scatter_base_": ("reduce_scatter", 1),
    "reduce_scatter_tensor_coalesced_": ("reduce_scatter", 1),
    "reduce_scatter_tensor": ("reduce_scatter", 0),
    "reduce_scatter_tensor_coalesced": ("reduce_scatter", 0),
    "alltoall_": ("all_to_all", 1), "alltoall_base_": ("all_to_all", 1),
    "all_to_all_single": ("all_to_all", 0),
    "broadcast_": ("broadcast", 0), "broadcast": ("broadcast", 0),
    "send": ("send", 0), "recv_": ("recv", 0), "recv_any_source_": ("recv", 0),
}


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    return []


def _group_name(args: tuple, kwargs: dict) -> str | None:
    """The process group's name: c10d ops pass the group, functional ops its name (their
    last string argument; an earlier one is the reduce op)."""
    names = [a for a in (*args, *kwargs.values()) if isinstance(a, str)]
    if names:
        return names[-1]
    for a in (*args, *kwargs.values()):
        if isinstance(a, dist.ProcessGroup):
            return a.group_name
        if isinstance(a, torch.ScriptObject):
            try:
                return dist.ProcessGroup.unbox(a).group_name
            except RuntimeError:  # a ReduceOp or another custom class
                continue
    return None


def _op_numel(index: int, args: tuple) -> int:
    tensors = _tensors(args[abs(index)] if index >= 0 else args[0])
    size = sum(t.numel() for t in tensors)
    return size * int(args[1]) if index < 0 else size


def _op_bytes(index: int, args: tuple) -> int:
    tensors = _tensors(args[abs(index)] if index >= 0 else args[0])
    size = sum(t.numel() * t.element_size() for t in tensors)
    return size * int(args[1]) if index < 0 else size


class CollectiveRecorder(TorchDispatchMode):
    """Records (kind, group label, bytes) of every collective issued while active.
    ``labels`` maps process-group names to group labels (``tp``, ``dp`` ...)."""

    def __init__(self, labels: dict[str, str]) -> None:
        super().__init__()
        self.labels = labels
        self.log: list[tuple[str, str, int, int]] = []  # kind, group, bytes, elements

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func.namespace in ("c10d", "_c10d_functional"):
            found = KINDS.get(func._opname)
            if found is not None:
                kind, index = found
                name = _group_name(args, kwargs)
                label = self.labels.get(name or "", f"group {name}")
                self.log.append((kind, label, _op_bytes(index, args), _op_numel(index, args)))
        return func(*args, **kwargs)


_ELEMENT_BYTES = {"float": 4, "c10::BFloat16": 2, "c10::Half": 2, "double": 8, "long int": 8,
                  "int": 4, "long": 8, "bool": 1, "unsigned char": 1, "signed char": 1}


def _numel(dims: Any) -> int:
    """Elements of a profiler 'Input Dims' entry: one shape, or a list of shapes."""
    if dims and isinstance(dims[0], list):
        return sum(_numel(d) for d in dims)
    out = 1
    for d in dims:
        out *= d
    return out


def _kind(name: str) -> tuple[str, int] | None:
    space, _, op = name.partition("::")
    return KINDS.get(op) if space in ("c10d", "_c10d_functional") else None


def trace_collectives(trace: dict[str, Any]) -> list[tuple[str, int, int | None]]:
    """(kind, elements, bytes or None) of every collective in a Kineto Chrome trace of the
    torch profiler: functional collectives (they name their dtype) and the c10d ops not
    issued by one of those."""
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X"
              and _kind(e["name"]) is not None]
    order = {id(e): (e["ts"], -e["dur"], i) for i, e in enumerate(events)}
    out: list[tuple[str, int, int | None]] = []
    for e in events:
        if any(f["tid"] == e["tid"] and order[id(f)] < order[id(e)] and
               e["ts"] + e["dur"] <= f["ts"] + f["dur"] for f in events):
            continue  # issued by an enclosing collective (functional -> c10d): counted once
        found = _kind(e["name"])
        assert found is not None
        kind, index = found
        args = e.get("args", {})
        dims, types = args.get("Input Dims", []), args.get("Input type", [])
        i = abs(index) if index >= 0 else 0
        n = _numel(dims[i]) if i < len(dims) and dims[i] else 0
        if index < 0:
            n *= int(args.get("Concrete Inputs", ["", "1"])[1] or 1)
        size = _ELEMENT_BYTES.get(types[i]) if i < len(types) else None
        out.append((kind, n, None if size is None else n * size))
    return out


def attribute(log: list[tuple[str, str, int, int]], traced: list[tuple[str, int, int | None]],
              nested_group: str) -> list[tuple[str, str, int, int]]:
    """The recorder's log plus the traced collectives it could not see (those issued inside
    another operator — DTensor's, whose mesh is ``nested_group``)."""
    seen = Counter((kind, numel) for kind, _, _, numel in log)
    extra = []
    for kind, numel, size in traced:
        if seen[(kind, numel)] > 0:
            seen[(kind, numel)] -= 1
            continue
        extra.append((kind, nested_group, size if size is not None else 0, numel))
    return log + extra


def summarize(log: list[tuple[str, str, int, int]]) -> list[dict[str, Any]]:
    """One row per (group, kind): count and total bytes, sorted."""
    count: Counter = Counter()
    total: Counter = Counter()
    for kind, group, size, _ in log:
        count[(group, kind)] += 1
        total[(group, kind)] += size
    return [{"group": g, "kind": k, "count": count[(g, k)], "bytes": total[(g, k)]}
            for g, k in sorted(count)]
