"""Result: what a simulation predicts for one training iteration."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Result", "Timing", "BREAKDOWN_KINDS"]

# Kinds of time on the critical path; they add up to the iteration time.
BREAKDOWN_KINDS = ("compute", "tp", "cp", "ep", "pp", "dp", "optimizer", "bubble")


@dataclass
class Timing:
    """What a simulator tier predicts, before the figures derived from it are added."""

    iteration_s: float
    pipeline_s: float  # forward/backward of every micro-batch, bubble included
    breakdown: dict[str, float]  # critical-path seconds by kind; sums to iteration_s
    communication: dict[str, dict[str, float]]  # group -> exposed_s / overlapped_s
    links: list[dict[str, Any]] = field(default_factory=list)
    simulation: dict[str, Any] = field(default_factory=dict)
    timeline: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class Result:
    fidelity: str
    model: str
    cluster: str
    gpus: int
    iteration_time_s: float
    tokens_per_s: float
    model_tflops_per_gpu: float
    hardware_tflops_per_gpu: float
    mfu: float
    peak_memory_gib: float
    memory_capacity_gib: float
    fits_in_memory: bool
    bubble_fraction: float
    num_microbatches: int
    breakdown: dict[str, float]  # seconds on the critical path, by kind
    communication: dict[str, dict[str, float]]  # group -> exposed_s / overlapped_s
    memory_gib: list[dict[str, float]]  # per pipeline rank
    extrapolated: list[str] = field(default_factory=list)  # operations outside a profile
    warnings: list[str] = field(default_factory=list)
    links: list[dict[str, Any]] = field(default_factory=list)  # busiest links (DES)
    simulation: dict[str, Any] = field(default_factory=dict)  # DES events, units, reduced

    def to_dict(self) -> dict[str, Any]:
        """Fields by name; a step that cannot complete (infinite time) has ``null``."""
        out = {k: getattr(self, k) for k in self.__dataclass_fields__}
        if not math.isfinite(self.iteration_time_s):
            out["iteration_time_s"] = None
        return out
