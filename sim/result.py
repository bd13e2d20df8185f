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
    fidelity: str  # `analytic` or `des`
    model: str  # model name
    cluster: str  # cluster name
    gpus: int  # devices in the cluster
    iteration_time_s: float  # one training iteration, seconds (null: the step cannot complete)
    tokens_per_s: float  # global batch tokens / iteration time
    # model FLOPs (Megatron's convention, no recompute) per GPU per second, TFLOP/s
    model_tflops_per_gpu: float
    # FLOPs actually executed (recompute included) per GPU per second, TFLOP/s
    hardware_tflops_per_gpu: float
    mfu: float  # model FLOPs utilisation: model TFLOP/s per GPU over the device's peak
    peak_memory_gib: float  # largest per-rank peak memory, GiB
    memory_capacity_gib: float  # capacity it is checked against, GiB
    fits_in_memory: bool  # the out-of-memory verdict
    bubble_fraction: float  # idle share of the pipeline phase
    num_microbatches: int  # micro-batches per replica
    breakdown: dict[str, float]  # seconds on the critical path, by kind
    communication: dict[str, dict[str, float]]  # group -> exposed_s / overlapped_s
    memory_gib: list[dict[str, float]]  # per pipeline rank
    extrapolated: list[str] = field(default_factory=list)  # operations outside a profile
    warnings: list[str] = field(default_factory=list)  # approximations the tier made, in words
    links: list[dict[str, Any]] = field(default_factory=list)  # busiest links (DES)
    simulation: dict[str, Any] = field(default_factory=dict)  # DES events, units, reduced
    # global batch samples (sequences, images) / iteration time
    samples_per_s: float = 0.0
    # MoE routing as simulated (sim.layout.routing): the most-loaded expert-parallel rank's
    # load_factor (and max_load before dropping) over the balanced share, dropped_fraction
    # of routed tokens, gini of tokens per expert; empty for a dense model
    routing: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """Fields by name; a step that cannot complete (infinite time) has ``null``."""
        out = {k: getattr(self, k) for k in self.__dataclass_fields__}
        if not math.isfinite(self.iteration_time_s):
            out["iteration_time_s"] = None
        return out
