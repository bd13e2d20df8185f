"""Ranks sharing one host: the measured per-step variability of a worker's local step, as a
jitter the multi-step DES draws from (:class:`sim.des.worker_run.WorkerRun` multiplies each
local step by a draw), and the cap a host's cores put on the rate (:func:`host_cap`).

Processes sharing a host's cores do not share them fluidly: the kernel runs one for a time
slice while another waits, so most local steps take their CPU time and a few take a slice
longer. A barrier (BSP, an average every H steps) waits for the slowest worker, so what
matters is the whole distribution, not only its mean. :class:`Resampled` keeps the measured
step times (taken with every worker stepping at once, ``executor/sync/probe.py``) as factors
of their mean and draws from them with replacement, each worker and step independently.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from sim.errors import SpecError
from sim.spec.sync import architecture

__all__ = ["Resampled", "resampled", "CPU_KEYS", "HOST_BOUND", "cpu_per_step", "host_cap"]


@dataclass(frozen=True)
class Resampled:
    """Slow-down factors drawn with replacement from ``factors`` (mean 1)."""

    factors: tuple[float, ...]

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.asarray(self.factors)[rng.integers(len(self.factors), size=n)]

    def label(self) -> str:
        return f"measured:{len(self.factors)} steps"


def resampled(samples_s: Sequence[float]) -> Resampled:
    """Measured step times as factors of their mean (the mean is the step time itself)."""
    xs = np.asarray(list(samples_s), dtype=float)
    if xs.size == 0 or not np.all(np.isfinite(xs)) or np.any(xs < 0) or xs.sum() <= 0:
        raise SpecError("measured.step_samples_s", "must be step times in seconds >= 0, "
                        "at least one of them > 0")
    return Resampled(tuple(float(x) for x in xs / xs.mean()))


HOST_BOUND = "host-bound"  # how a capped result's note begins

# CPU seconds the probe measures (executor/sync/probe.py), each for one of a rank's actions
CPU_KEYS = ("step_cpu_s", "allreduce_cpu_s", "exchange_cpu_s", "push_cpu_s", "serve_cpu_s")


def cpu_per_step(plan: Any, cpu: Mapping[str, float]) -> float | None:
    """CPU seconds the host spends for one worker's local step and its share of the
    synchronisation: the step, then BSP's all-reduce, local SGD's every ``period`` steps,
    D-PSGD's neighbour exchange, or a push and pull (``push_cpu_s``) and every server's
    handling of it (``serve_cpu_s``, summed over the servers). None where a strategy's
    synchronisation has no measured CPU cost (DiLoCo's outer step, two-stage, SGP, AD-PSGD,
    BytePS-style partitions or node aggregation, compression) or an input is missing."""
    sync, comm = plan.sync, plan.communication
    if plan.compression.kind != "none" or "step_cpu_s" not in cpu:
        return None
    keys: tuple[str, ...]
    if architecture(plan) == "ps":
        if comm.partition_MB or comm.aggregate != "worker":
            return None
        keys, share = ("push_cpu_s", "serve_cpu_s"), 1.0
    elif sync.kind == "bsp":
        keys, share = ("allreduce_cpu_s",), 1.0
    elif sync.kind == "local-sgd":
        keys, share = ("allreduce_cpu_s",), 1.0 / sync.period
    elif sync.kind == "gossip" and sync.gossip_mode == "d-psgd":
        keys, share = ("exchange_cpu_s",), 1.0
    else:
        return None
    if any(k not in cpu for k in keys):
        return None
    return cpu["step_cpu_s"] + share * sum(cpu[k] for k in keys)


def host_cap(result: Any, plan: Any, cpu: Mapping[str, float], cores: float) -> Any:
    """``result`` with its rates capped where the ranks' CPU work exceeds a host of
    ``cores`` cores that every rank shares (servers included: the real runs of
    :mod:`executor.sync`, on one machine): the simulator runs every rank as if it had a core
    of its own, so the workers' local steps a second cannot pass ``cores / cpu_per_step``.
    Where the cap binds, updates and samples a second are scaled down to it (staleness and
    the other outputs are the simulation's) and a note says so; where the profile cannot
    price the strategy (:func:`cpu_per_step` is None) a note says the cap was not applied;
    elsewhere ``result`` is returned as it is."""
    per_step = cpu_per_step(plan, cpu)
    if per_step is None:
        return dataclasses.replace(result, warnings=[*result.warnings, (
            "host cap not applied: the profile has no CPU cost for this strategy's "
            "synchronisation (rates as if every rank had a core of its own)")])
    if per_step <= 0 or result.samples_per_s <= 0:
        return result
    if plan.sync.kind == "backup-workers":  # every worker steps and pushes, n - b are kept
        steps_per_s = result.updates_per_s * plan.dp
    else:  # every worker's local steps together
        steps_per_s = result.samples_per_s / (plan.global_batch_size / plan.dp)
    bound = cores / per_step
    if steps_per_s <= bound:
        return result
    f = bound / steps_per_s
    note = (f"{HOST_BOUND}: the ranks' CPU work ({per_step * 1e3:.3g} ms a worker's step, "
            f"synchronisation included) needs {steps_per_s * per_step:.3g} cores at the "
            f"simulated rate, the host has {cores:g}: rates scaled by {f:.3f}")
    return dataclasses.replace(result, updates_per_s=result.updates_per_s * f,
                               samples_per_s=result.samples_per_s * f,
                               step_time_s=result.step_time_s / f,
                               warnings=[*result.warnings, note])
