"""Heterogeneous clusters: how much slower or faster each device computes than the GPU the
cost model describes, those scales per replica and pipeline stage, and the memory check
against each device's own GPU.

The simulators time compute with one cost model, that of ``cluster.gpu`` (the first node
group's; a profile DB or the catalog roofline). A device of another type gets a compute
scale: one layer's forward + backward under its GPU's roofline over the same under
``cluster.gpu``'s roofline (the ratio carries over to a profiled cost model). Straggler
factors are a separate list; the two multiply (:func:`combine_scales`).

>>> from sim.cluster import load_cluster
>>> from sim.model import load_model
>>> from sim.plan import Plan
>>> c = load_cluster("dgx-a100:1+dgx-h100:1")
>>> s = gpu_compute_scales(load_model("llama3-8b"), c, Plan(16, 2048, dp=16))
>>> s[0], round(s[8], 2)
(1.0, 0.39)
"""

from __future__ import annotations

from collections.abc import Sequence

from sim import compute as cm
from sim.cluster import ClusterSpec
from sim.costmodel import CostModel, roofline_for
from sim.hardware import HardwareSpec
from sim.memory import GIB, peak_memory
from sim.model import ModelSpec
from sim.placement import rank_coords
from sim.plan import Plan, replica_plan
from sim.result import Timing

__all__ = ["gpu_compute_scales", "combine_scales", "replica_stage_scales", "stage_devices",
           "memory_verdict", "mean_peak_tflops", "replica_analytic", "replica_timings",
           "analytic_timing"]


def _layer_s(gpu: HardwareSpec, model: ModelSpec, plan: Plan) -> float:
    cost = roofline_for(gpu)
    t = cm.layer_time(cost, model, plan, moe=model.is_moe)
    return t.forward + t.backward


def gpu_compute_scales(model: ModelSpec, cluster: ClusterSpec, plan: Plan
                       ) -> list[float] | None:
    """Per device: its GPU's layer time over ``cluster.gpu``'s (0.5: twice as fast);
    ``None`` when every device is a ``cluster.gpu``."""
    gpus = {g.gpu.name: g.gpu for g in cluster.node_groups}
    if set(gpus) <= {cluster.gpu.name}:
        return None
    ref = _layer_s(cluster.gpu, model, plan)
    ratio = {name: _layer_s(gpu, model, plan) / ref for name, gpu in gpus.items()}
    ratio[cluster.gpu.name] = 1.0
    return [ratio[cluster.gpu_of(d).name] for d in range(cluster.world_size)]


def combine_scales(*scales: Sequence[float] | None) -> list[float] | None:
    """Element-wise product of the given per-device scales (``None`` ones left out)."""
    given = [s for s in scales if s is not None]
    if not given:
        return None
    out = [1.0] * len(given[0])
    for s in given:
        out = [a * b for a, b in zip(out, s, strict=True)]
    return out


def stage_devices(plan: Plan, replica: int, stage: int) -> list[int]:
    """Logical ranks of one replica's pipeline stage: its TP and CP ranks (the replica is
    the data-parallel index, the expert-parallel one being ``replica % ep``)."""
    sizes, strides = rank_coords(plan)
    base = (stage * strides["pp"] + (replica % plan.ep) * strides["ep"]
            + (replica // plan.ep) * strides["dp"])
    return [base + t * strides["tp"] + c * strides["cp"]
            for t in range(sizes["tp"]) for c in range(sizes["cp"])]


def replica_stage_scales(plan: Plan, scales: Sequence[float] | None) -> list[list[float]]:
    """``[replica][stage]``: the slowest device's scale (a stage runs at its slowest rank;
    TP and CP ranks wait for each other every layer). All ones without scales."""
    if scales is None:
        return [[1.0] * plan.pp for _ in range(plan.dp)]
    pl = plan.placement

    def dev(r: int) -> int:
        return r if isinstance(pl, str) else pl[r]

    return [[max(scales[dev(r)] for r in stage_devices(plan, d, s)) for s in range(plan.pp)]
            for d in range(plan.dp)]


def _stage_gpus(cluster: ClusterSpec, plan: Plan, stage: int) -> set[HardwareSpec]:
    pl = plan.placement
    return {cluster.gpu_of(r if isinstance(pl, str) else pl[r])
            for d in range(plan.dp) for r in stage_devices(plan, d, stage)}


def memory_verdict(model: ModelSpec, cluster: ClusterSpec, plan: Plan) -> tuple[float, float]:
    """(peak GiB, capacity GiB) of the tightest pipeline stage, each stage held against the
    GPU type among its devices with the least room (own memory and reserve); the plan fits
    when peak <= capacity. On a homogeneous cluster: the largest peak and the GPU's memory."""
    ref = cluster.gpu.reserved_gib
    totals = [mb.total / GIB for mb in peak_memory(model, plan, ref)]
    if not cluster.heterogeneous:
        return max(totals), cluster.gpu.memory_gib
    rows = [t - ref for t in totals]
    best: tuple[float, float, float] | None = None
    for stage, need in enumerate(rows):
        gpu = min(_stage_gpus(cluster, plan, stage),
                  key=lambda g: (g.memory_gib - g.reserved_gib, g.name))
        slack = gpu.memory_gib - gpu.reserved_gib - need
        if best is None or slack < best[0]:
            best = (slack, need + gpu.reserved_gib, gpu.memory_gib)
    assert best is not None
    return best[1], best[2]


def mean_peak_tflops(cluster: ClusterSpec, dtype: str) -> float:
    """Peak dense TFLOP/s per device, averaged over the cluster's devices."""
    if not cluster.node_groups:
        return cluster.gpu.peak_tflops(dtype)
    return sum(g.nodes * g.gpu.peak_tflops(dtype) for g in cluster.node_groups) / cluster.nodes


def replica_timings(model: ModelSpec, cluster: ClusterSpec, plan: Plan, cost: CostModel,
                    scales: Sequence[float] | None) -> list[Timing]:
    """The analytic tier replica by replica: each replica (its micro-batch count, each stage
    at its slowest device's scale) runs as an even plan of its own; alike replicas share
    one evaluation."""
    from sim.analytic import analytic_iteration

    per_stage = replica_stage_scales(plan, scales)
    seen: dict[tuple, Timing] = {}
    out = []
    for d, m in enumerate(plan.replica_microbatches):
        key = (m, tuple(per_stage[d]))
        if key not in seen:
            seen[key] = analytic_iteration(model, cluster, replica_plan(plan, d), cost,
                                           per_stage[d] if scales is not None else None)
        out.append(seen[key])
    return out


def replica_analytic(model: ModelSpec, cluster: ClusterSpec, plan: Plan, cost: CostModel,
                     scales: Sequence[float] | None) -> Timing:
    """The slowest replica's :func:`replica_timings`: the gradient reduction waits for
    every replica (each one's reduction is taken to overlap its own last backward: the
    documented approximation)."""
    return max(replica_timings(model, cluster, plan, cost, scales),
               key=lambda t: t.iteration_s)


def analytic_timing(model: ModelSpec, cluster: ClusterSpec, plan: Plan, cost: CostModel
                    ) -> Timing:
    """The analytic tier on any cluster: per replica where devices or replicas differ."""
    from sim.analytic import analytic_iteration

    scales = gpu_compute_scales(model, cluster, plan)
    if scales is None and plan.micro_batches_per_replica is None:
        return analytic_iteration(model, cluster, plan, cost)
    return replica_analytic(model, cluster, plan, cost, scales)
