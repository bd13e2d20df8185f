"""Device scales: how much slower or faster each device computes than the GPU the cost
model describes.

The simulators time compute with one cost model, that of ``cluster.gpu`` (the first node
group's; a profile DB or the catalog roofline). A device of another type gets a compute
scale: one layer's forward + backward under its GPU's roofline over the same under
``cluster.gpu``'s roofline (the ratio carries over to a profiled cost model). Straggler
factors are a separate list; the two multiply (:func:`combine_scales`).

>>> from sim.spec.cluster import load_cluster
>>> from sim.spec.zoo import load_model
>>> from sim.spec.plan import Plan
>>> c = load_cluster("dgx-a100:1+dgx-h100:1")
>>> s = gpu_compute_scales(load_model("llama3-8b"), c, Plan(16, 2048, dp=16))
>>> s[0], round(s[8], 2)
(1.0, 0.39)
"""

from __future__ import annotations

from collections.abc import Sequence

from sim.cost import compute as cm
from sim.cost.costmodel import roofline_for
from sim.spec.cluster import ClusterSpec
from sim.spec.hardware import HardwareSpec
from sim.spec.model import ModelSpec
from sim.spec.plan import Plan

__all__ = ["gpu_compute_scales", "combine_scales", "mean_peak_tflops"]


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


def mean_peak_tflops(cluster: ClusterSpec, dtype: str) -> float:
    """Peak dense TFLOP/s per device, averaged over the cluster's devices."""
    if not cluster.node_groups:
        return cluster.gpu.peak_tflops(dtype)
    return sum(g.nodes * g.gpu.peak_tflops(dtype) for g in cluster.node_groups) / cluster.nodes
