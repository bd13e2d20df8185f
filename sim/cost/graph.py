"""Seconds of each layer of a workload graph on one micro-batch: the layer's measured times
on this device in the plan's dtype (``trainsim profile compute``), interpolated in the
batch, when the workload holds them; else the hardware catalog's roofline —
``max(FLOPs / GEMM rate, bytes / memory rate)`` forward, the backward pass's FLOPs and twice
the bytes backward."""

from __future__ import annotations

from typing import Any

from sim.cost.costmodel import roofline_for
from sim.layout.graph import activation_scale
from sim.spec.cluster import ClusterSpec
from sim.spec.hardware import DTYPE_BYTES, cpu_device_name
from sim.spec.plan import Plan
from sim.spec.workload import Layer, Workload, measured_device, measured_times

__all__ = ["layer_times", "optimizer_time", "measured_note"]


def _measured(layer: Layer, device: str, b: int, dtype: str) -> tuple[float, float] | None:
    """Measured (forward, backward) seconds at batch ``b``: exact, else linear between the
    nearest measured batches, else proportional to the nearest one."""
    at = measured_times(layer, device, dtype)
    if not at:
        return None
    if b in at:
        return at[b]
    lo = max((k for k in at if k < b), default=None)
    hi = min((k for k in at if k > b), default=None)
    if lo is not None and hi is not None:
        f = (b - lo) / (hi - lo)
        return tuple(at[lo][i] + f * (at[hi][i] - at[lo][i]) for i in (0, 1))  # type: ignore
    near = lo if lo is not None else hi
    assert near is not None
    return at[near][0] * b / near, at[near][1] * b / near


def layer_times(w: Workload, cluster: ClusterSpec, plan: Plan) -> list[tuple[float, float]]:
    """(forward, backward) seconds of each layer on one micro-batch."""
    roof = roofline_for(cluster.gpu)
    rate, bw = roof.gemm_flops[plan.dtype], roof.mem_Bps
    b, s, e = plan.micro_batch_size, activation_scale(w, plan), DTYPE_BYTES[plan.dtype]
    device = measured_device({m.device for x in w.layers for m in x.measured
                              if m.dtype == plan.dtype}, cluster.gpu.name, cpu_device_name())
    out = []
    for layer in w.layers:
        got = _measured(layer, device, b, plan.dtype) if device is not None else None
        if got is None:
            moved = (layer.input_bytes + layer.output_bytes) * b * s
            weights = (layer.params + layer.frozen_params) * e
            got = (max(layer.forward_flops * b / rate, (moved + weights) / bw),
                   max(layer.backward_flops * b / rate, 2 * (moved + weights) / bw))
        out.append(got)
    return out


def optimizer_time(w: Workload, cluster: ClusterSpec, params: float, cost: Any) -> float:
    """One AdamW step over ``params`` of the workload's parameters: the measured whole-model
    step scaled to them where this device was measured, else the cost model's."""
    device = measured_device({d for d, _ in w.optimizer_s}, cluster.gpu.name,
                             cpu_device_name())
    fixed = getattr(cost, "step_overhead_s", 0.0)  # a software stack's, beside the step
    if device is None or not w.param_count:
        return cost.optimizer(params) + fixed
    return dict(w.optimizer_s)[device] * params / w.param_count + fixed


def measured_note(w: Workload, cluster: ClusterSpec, plan: Plan) -> str | None:
    """A warning when the workload was measured on this device, but not in the plan's dtype
    or at all of its layers: those layers are timed by the roofline."""
    host = cpu_device_name()
    dtypes = {m.dtype for x in w.layers for m in x.measured
              if measured_device({m.device}, cluster.gpu.name, host) is not None}
    if not dtypes or plan.dtype in dtypes:
        return None
    return (f"{w.name} was measured on this device in {', '.join(sorted(dtypes))} only: this "
            f"{plan.dtype} plan's layers are timed by the roofline (set the plan's dtype, or "
            f"profile with --dtype {plan.dtype})")
