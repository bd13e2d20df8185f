"""Iteration times from PyTorch profiler (Kineto) traces, for ``trainsim calibrate``.

A trace taken with ``torch.profiler.profile(schedule=..., record_shapes=True)`` and
``prof.step()`` once an iteration marks every recorded iteration with a ``ProfilerStep#N``
span on the CPU (``export_chrome_trace`` writes it; with a schedule that repeats, the
profiler keeps only the last cycle's events unless ``acc_events=True``). The iteration time
is the median of those spans, the first left out when there are more than two (as for logs,
:mod:`optimizer.logs`: the profiler's own start-up lands there). One rank's trace is one
run: ranks wait for each other every iteration, so any rank's steps time the iteration.

A trace is checked against the run's model: with recorded shapes, at least one GEMM
(``aten::mm``, ``addmm``, ``bmm``, ``matmul``, ``linear``) must have the model's hidden size
as a dimension of an input (a layer's projections all do, whatever the TP split); a trace
none of whose GEMMs has it is of another model, and is refused. Without recorded shapes
(``record_shapes=False``) the check is skipped.
"""

from __future__ import annotations

import re
import statistics
from pathlib import Path
from typing import Any

from sim.errors import SpecError
from sim.io import read_chrome_trace
from sim.spec.model import ModelSpec
from sim.spec.workload import Workload

__all__ = ["iteration_s_from_trace", "trace_dims"]

_STEP = re.compile(r"ProfilerStep#(\d+)$")
_GEMMS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::linear")


def trace_dims(events: list[dict[str, Any]]) -> set[int] | None:
    """Every dimension of every GEMM input the trace recorded; None without shapes."""
    dims: set[int] = set()
    seen = False
    for e in events:
        if e.get("name") not in _GEMMS:
            continue
        shapes = (e.get("args") or {}).get("Input Dims")
        if not isinstance(shapes, list):
            continue
        seen = True
        for shape in shapes:
            if isinstance(shape, list):
                dims.update(int(d) for d in shape if isinstance(d, int))
    return dims if seen else None


def _steps(events: list[dict[str, Any]]) -> list[float]:
    """Seconds of each ``ProfilerStep#N`` on the CPU, in step order."""
    spans: dict[int, float] = {}
    for e in events:
        m = _STEP.match(str(e.get("name", "")))
        if m and e.get("cat") != "gpu_user_annotation":
            spans[int(m.group(1))] = float(e["dur"]) / 1e6
    return [spans[n] for n in sorted(spans)]


def iteration_s_from_trace(path: Path, model: ModelSpec | Workload, field: str = "trace"
                           ) -> float:
    """The median iteration time (s) of a Kineto trace, checked against ``model``."""
    events = read_chrome_trace(path, field)
    times = _steps(events)
    if not times or any(t <= 0 for t in times):
        raise SpecError(field, f"{path.name} has no ProfilerStep#N spans: profile with "
                        "torch.profiler's schedule and call prof.step() every iteration")
    dims = trace_dims(events)
    if isinstance(model, ModelSpec) and dims is not None and model.hidden_size not in dims:
        raise SpecError(field, f"{path.name} is a trace of another model: none of its GEMMs "
                        f"has model {model.name!r}'s hidden size {model.hidden_size}")
    if len(times) > 2:
        times = times[1:]
    return statistics.median(times)
