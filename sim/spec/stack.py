"""Software-stack profiles: named overhead models of training frameworks
(``sim/data/stacks.toml``), each value with its source.

A stack sets these fields of every device of a cluster (:class:`~sim.spec.hardware.
HardwareSpec`), which both tiers read through the roofline cost model
(:mod:`sim.cost.costmodel`): a layer's fixed cost (``layer_overhead_us``), a step's fixed
cost beside the optimizer (``step_overhead_ms``), element-wise time relative to one kernel
per op (``elementwise_scale``: fusion by a compiler), the bytes of fp8 casts per GEMM operand
(``fp8_cast_bytes``: the scaling recipe), the share of data-parallel communication compute
can hide (``comm_overlap``) and of the NICs' line rate the stack's collectives reach
(``nic_eff``); these two never above the device's own (a CPU's 0 overlap stays 0); and how
biased experts add their biases (``expert_bias_up_fwd`` ... ``expert_bias_down_bwd``: the
element streams their code runs, 0 in a GEMM's epilogue).

A stack is applied once: the device records its name (``HardwareSpec.stack``), so building
the cluster again (``dataclasses.replace``) does not apply it twice, and a calibration
(:mod:`sim.spec.calibration`) fitted on top replaces the stack's values it fits. Stacks act
on the catalog's roofline; a profiled cost model measures what it measures instead.
"""

from __future__ import annotations

import dataclasses
import math
import tomllib
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from sim.errors import SpecError
from sim.spec.hardware import HardwareSpec, catalog

__all__ = ["StackSpec", "STACK_FIELDS", "CAPS", "stacks", "get_stack", "apply_stack",
           "stack_devices"]

# field -> (low, high)
STACK_FIELDS = {"layer_overhead_us": (0.0, 5000.0), "step_overhead_ms": (0.0, 60000.0),
                "elementwise_scale": (0.05, 4.0), "fp8_cast_bytes": (0.0, 16.0),
                "comm_overlap": (0.0, 1.0), "nic_eff": (0.02, 1.0),
                "expert_bias_up_fwd": (0.0, 16.0), "expert_bias_up_bwd": (0.0, 16.0),
                "expert_bias_down_fwd": (0.0, 16.0), "expert_bias_down_bwd": (0.0, 16.0),
                "tp_overlap_eff": (0.0, 1.0)}
# a stack can lower these below the device's, never raise
CAPS = ("comm_overlap", "nic_eff", "tp_overlap_eff")


@dataclass(frozen=True)
class StackSpec:
    name: str
    description: str
    values: dict[str, float]  # every field of STACK_FIELDS
    sources: dict[str, str]  # where each value comes from


def _stack(name: str, table: Any) -> StackSpec:
    where = f"stacks.toml[{name}]"
    if not isinstance(table, dict):
        raise SpecError(where, "must be a table")
    values = {}
    for f, (lo, hi) in STACK_FIELDS.items():
        v = table.get(f)
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) \
                or not lo <= v <= hi:
            raise SpecError(f"{where}.{f}", f"must be a number in [{lo}, {hi}], got {v!r}")
        values[f] = float(v)
    sources = table.get("sources", {})
    missing = [f for f in STACK_FIELDS if not isinstance(sources.get(f), str)]
    if missing:
        raise SpecError(f"{where}.sources.{missing[0]}", "every value names its source")
    return StackSpec(name, str(table.get("description", "")), values, dict(sources))


@cache
def stacks() -> dict[str, StackSpec]:
    """Every stack of the catalog, by name."""
    text = resources.files("sim").joinpath("data/stacks.toml").read_text()
    return {name: _stack(name, t) for name, t in tomllib.loads(text).items()}


def get_stack(name: str, field: str = "stack") -> StackSpec:
    known = stacks()
    if name not in known:
        raise SpecError(field, f"unknown stack {name!r} (known: {', '.join(known)})")
    return known[name]


def apply_stack(hw: HardwareSpec, name: str) -> HardwareSpec:
    """``hw`` with the stack's values (once: a device that carries the stack is returned);
    ``name`` "" takes a stack off (the catalog's values back)."""
    if hw.stack == name:
        return hw
    if not name:
        base = catalog().get(hw.name, hw)
        return dataclasses.replace(hw, stack="", **{f: getattr(base, f) for f in STACK_FIELDS})
    values: dict[str, Any] = dict(get_stack(name).values)
    base = catalog().get(hw.name, hw)
    for f in CAPS:
        values[f] = min(values[f], getattr(base, f))
    values["stack"] = name
    return dataclasses.replace(hw, **values)


def stack_devices(cluster: Any) -> None:
    """Put the cluster's stack on its devices, or take one off that the cluster no longer
    names (from ``ClusterSpec.__post_init__``)."""
    if cluster.stack:
        get_stack(cluster.stack)
    elif not any(d.stack for d in [cluster.gpu, *(g.gpu for g in cluster.node_groups),
                                   *(s.gpu for s in cluster.sites if s.gpu)]):
        return  # no stack, none to take off
    object.__setattr__(cluster, "gpu", apply_stack(cluster.gpu, cluster.stack))
    object.__setattr__(cluster, "node_groups", tuple(
        dataclasses.replace(g, gpu=apply_stack(g.gpu, cluster.stack))
        for g in cluster.node_groups))
    object.__setattr__(cluster, "sites", tuple(
        dataclasses.replace(s, gpu=apply_stack(s.gpu, cluster.stack)) if s.gpu else s
        for s in cluster.sites))
