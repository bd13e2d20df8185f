"""Measured per-step variability of a worker's local step, as a jitter the multi-step DES
draws from (:class:`sim.des.worker_run.WorkerRun` multiplies each local step by a draw).

Processes sharing a host's cores do not share them fluidly: the kernel runs one for a time
slice while another waits, so most local steps take their CPU time and a few take a slice
longer. A barrier (BSP, an average every H steps) waits for the slowest worker, so what
matters is the whole distribution, not only its mean. :class:`Resampled` keeps the measured
step times (taken with every worker stepping at once, ``executor/sync/probe.py``) as factors
of their mean and draws from them with replacement, each worker and step independently.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from sim.errors import SpecError

__all__ = ["Resampled", "resampled"]


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
