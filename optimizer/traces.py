"""Iteration times from PyTorch profiler (Kineto) traces, for ``trainsim calibrate``.

A trace taken with ``torch.profiler.profile(schedule=..., record_shapes=True)`` and
``prof.step()`` once an iteration marks every recorded iteration with a ``ProfilerStep#N``
span on the CPU (``export_chrome_trace`` writes it; with a schedule that repeats, the
profiler keeps only the last cycle's events unless ``acc_events=True``). The iteration time
is the median of those spans, the first left out when there are more than two (as for logs,
:mod:`optimizer.logs`: the profiler's own start-up lands there). One rank's trace is one
run: ranks wait for each other every iteration, so any rank's steps time the iteration.

A trace is checked against the run's model and plan: with recorded shapes, some GEMM
(``aten::mm``, ``addmm``, ``bmm``, ``matmul``, ``linear``) must have a two-dimensional
operand of the model's hidden size by one of its layer widths split over the plan's TP
degree (attention's query, key/value or fused projection, the MLP's, the vocabulary), as a
weight of the model has; a trace with none is of another model, and is refused. A token
count that happens to equal another model's sizes could still pass. Without recorded shapes
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
from sim.spec.plan import Plan
from sim.spec.workload import Workload

__all__ = ["iteration_s_from_trace", "trace_shapes"]

_STEP = re.compile(r"ProfilerStep#(\d+)$")
_GEMMS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::linear")


def trace_shapes(events: list[dict[str, Any]]) -> set[tuple[int, int]] | None:
    """Every two-dimensional GEMM operand the trace recorded; None without shapes."""
    out: set[tuple[int, int]] = set()
    seen = False
    for e in events:
        if e.get("name") not in _GEMMS:
            continue
        shapes = (e.get("args") or {}).get("Input Dims")
        if not isinstance(shapes, list):
            continue
        seen = True
        for shape in shapes:
            if isinstance(shape, list) and len(shape) == 2 \
                    and all(isinstance(d, int) for d in shape):
                out.add((shape[0], shape[1]))
    return out if seen else None


def _weights(m: ModelSpec, plan: Plan) -> set[tuple[int, int]]:
    """The (hidden, width / tp) shapes of the model's weights, either way round."""
    up = 2 if m.gated_mlp else 1
    widths = {m.q_dim, m.kv_dim, m.q_dim + 2 * m.kv_dim, m.ffn_hidden_size,
              up * m.ffn_hidden_size, m.vocab_size, m.hidden_size}
    if m.is_moe:
        widths |= {m.expert_ffn, up * m.expert_ffn, m.num_experts}
    split = {w // plan.tp for w in widths if w % plan.tp == 0} | widths
    h = m.hidden_size
    return {(h, w) for w in split} | {(w, h) for w in split}


def _steps(events: list[dict[str, Any]]) -> list[float]:
    """Seconds of each ``ProfilerStep#N`` on the CPU, in step order."""
    spans: dict[int, float] = {}
    for e in events:
        m = _STEP.match(str(e.get("name", "")))
        dur = e.get("dur")
        if m and e.get("cat") != "gpu_user_annotation" and isinstance(dur, int | float):
            spans[int(m.group(1))] = float(dur) / 1e6
    return [spans[n] for n in sorted(spans)]


def iteration_s_from_trace(path: Path, model: ModelSpec | Workload, plan: Plan,
                           field: str = "trace") -> float:
    """The median iteration time (s) of a Kineto trace, checked against ``model``."""
    events = read_chrome_trace(path, field)
    times = _steps(events)
    if not times:
        raise SpecError(field, f"{path.name} has no ProfilerStep#N spans: profile with "
                        "torch.profiler's schedule and call prof.step() every iteration")
    if any(t <= 0 for t in times):
        raise SpecError(field, f"{path.name} has a ProfilerStep#N span of no duration")
    shapes = trace_shapes(events)
    if isinstance(model, ModelSpec) and shapes is not None \
            and not shapes & _weights(model, plan):
        raise SpecError(field, f"{path.name} is a trace of another model: none of its GEMMs "
                        f"has a weight of model {model.name!r} (hidden {model.hidden_size}) "
                        f"at tp {plan.tp}")
    if len(times) > 2:
        times = times[1:]
    return statistics.median(times)
