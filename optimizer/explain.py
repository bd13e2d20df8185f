"""Which inputs and assumptions move a prediction most: each one moved by +-``delta``
(10% by default) alone, the plan simulated again, the iteration time's change reported.

Two kinds of knob:

- *assumptions* of the hardware catalog (``sim/data/hardware.csv``): the best GEMM
  efficiency, the GEMM size at which it halves, attention and HBM efficiencies, the
  collectives' bus efficiency and NVLS's; a fraction of a peak is capped at 1 (the move
  says so; NVLS's bus-bandwidth ratio may exceed 1 and is not);
- *inputs* of the cluster: NIC rate, node-fabric bandwidth, and the latencies of both; with
  sites, every WAN link's bandwidth and latency.

A knob whose move changes nothing is reported too (a profiled cluster times compute from
its profile, so the GEMM assumptions do not apply there): what to measure is where the
effect is largest. ``elasticity`` is the relative change of the iteration time over the
relative change of the knob, averaged over both directions.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sim import simulate
from sim.errors import SpecError
from sim.spec.cluster import ClusterSpec
from sim.spec.hardware import HardwareSpec
from sim.spec.model import ModelSpec
from sim.spec.plan import Plan
from sim.spec.workload import Workload

__all__ = ["Sensitivity", "explain", "KNOBS"]

GPU_KNOBS = ("gemm_eff_max", "gemm_dim_half", "attention_eff", "hbm_eff", "comm_eff",
             "nvls_eff", "nic_eff")
CLUSTER_KNOBS = ("inter_node.nic_Gbps", "inter_node.latency_us", "intra_node.bandwidth_GBps",
                 "intra_node.latency_us")
KNOBS = tuple(f"gpu.{k}" for k in GPU_KNOBS) + CLUSTER_KNOBS
CAPPED = ("gemm_eff_max", "attention_eff", "hbm_eff", "comm_eff", "nic_eff")  # of a peak
# (nvls_eff is a bus-bandwidth ratio that may exceed 1: not capped)


@dataclass
class Sensitivity:
    knob: str
    kind: str  # assumption or input
    value: float
    minus_s: float  # iteration time with the knob at (1 - delta) x
    plus_s: float  # at (1 + delta) x (efficiencies capped at 1)
    elasticity: float
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _gpu(cluster: ClusterSpec, field: str, factor: float) -> tuple[ClusterSpec, str]:
    """Every GPU of the cluster with ``field`` times ``factor`` (an efficiency at most 1)."""
    note = ""

    def moved(g: HardwareSpec) -> HardwareSpec:
        nonlocal note
        v = getattr(g, field) * factor
        if field in CAPPED:
            if v > 1.0:
                note = "capped at 1"
            v = min(v, 1.0)
        return dataclasses.replace(g, **{field: v})

    groups = tuple(dataclasses.replace(n, gpu=moved(n.gpu)) for n in cluster.node_groups)
    return dataclasses.replace(cluster, gpu=moved(cluster.gpu), node_groups=groups), note


def _fabric(cluster: ClusterSpec, key: str, factor: float) -> ClusterSpec:
    table, field = key.split(".")
    sub = getattr(cluster, table)
    moved = dataclasses.replace(sub, **{field: getattr(sub, field) * factor})
    out = dataclasses.replace(cluster, **{table: moved})
    if key == "intra_node.bandwidth_GBps" and cluster.node_groups:
        out = dataclasses.replace(out, node_groups=tuple(
            dataclasses.replace(g, intra_GBps=(g.intra_GBps or 0) * factor)
            for g in cluster.node_groups))
    if key == "inter_node.nic_Gbps" and cluster.node_groups:
        out = dataclasses.replace(out, node_groups=tuple(
            dataclasses.replace(g, nic_Gbps=(g.nic_Gbps or 0) * factor)
            for g in cluster.node_groups))
    return out


def _wan(cluster: ClusterSpec, i: int, field: str, factor: float) -> ClusterSpec:
    wan = list(cluster.wan)
    w = wan[i]
    changes: dict[str, Any] = {field: getattr(w, field) * factor}
    if field == "Gbps":
        changes["bandwidth_by_hour"] = tuple(x * factor for x in w.bandwidth_by_hour)
    wan[i] = dataclasses.replace(w, **changes)
    return dataclasses.replace(cluster, wan=tuple(wan))


Move = Callable[[float], tuple[ClusterSpec, str]]


def _knobs(cluster: ClusterSpec) -> list[tuple[str, str, float, Move]]:
    """(name, kind, value, move) for every knob of this cluster."""
    out: list[tuple[str, str, float, Move]] = []
    for f in GPU_KNOBS:
        v = getattr(cluster.gpu, f)
        if (f == "nvls_eff" and not v) or (f == "nic_eff" and cluster.nodes == 1):
            continue
        out.append((f"gpu.{f}", "assumption", v, functools.partial(_gpu, cluster, f)))
    for key in CLUSTER_KNOBS:
        table, field = key.split(".")
        v = getattr(getattr(cluster, table), field)
        if (cluster.nodes == 1 and table == "inter_node") or not v:
            continue
        out.append((key, "input", v, functools.partial(_noted, _fabric, cluster, key)))
    for i, w in enumerate(cluster.wan):
        for field in ("Gbps", "latency_ms"):
            out.append((f"wan[{w.a}-{w.b}].{field}", "input", getattr(w, field),
                        functools.partial(_noted, _wan, cluster, i, field)))
    return out


def _noted(move: Callable[..., ClusterSpec], *args: Any) -> tuple[ClusterSpec, str]:
    return move(*args), ""


def explain(model: ModelSpec | Workload, cluster: ClusterSpec, plan: Plan,
            fidelity: str = "analytic", delta: float = 0.1) -> tuple[float, list[Sensitivity]]:
    """The base iteration time and every knob's effect, largest first."""
    if not 0 < delta < 1:
        raise SpecError("--explain-delta", f"must be a fraction in (0, 1), got {delta!r}")
    base = simulate(model, cluster, plan, fidelity=fidelity).iteration_time_s
    rows = []
    for name, kind, value, move in _knobs(cluster):
        times, notes = [], []
        for factor in (1 - delta, 1 + delta):
            moved, note = move(factor)
            times.append(simulate(model, moved, plan, fidelity=fidelity).iteration_time_s)
            notes.append(note)
        up = notes[1] == "capped at 1"
        span = (1 - delta) - (min(1.0, value * (1 + delta)) / value if up else 1 + delta)
        el = (times[0] - times[1]) / base / span if span else 0.0
        rows.append(Sensitivity(name, kind, value, times[0], times[1], el,
                                "+: capped at 1" if up else ""))
    rows.sort(key=lambda r: abs(r.plus_s - r.minus_s), reverse=True)
    return base, rows
