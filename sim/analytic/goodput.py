"""Goodput under GPU failures: restart from the last checkpoint, in closed form and by a
seeded Monte Carlo.

Model. Failures arrive as a Poisson process: each of ``gpus`` GPUs fails with mean time
between failures ``mtbf_gpu_s``, so the job fails every ``M = mtbf_gpu_s / gpus`` seconds
on average; any failure stops the whole job. Training is cut into segments of
``k`` iterations (``tau = k * iteration_s`` seconds of work) each followed by a checkpoint
write of ``delta`` seconds; the last segment holds the remaining iterations and ends with a
checkpoint too (the final model is saved). A failure loses the work since the last
checkpoint (the segment in progress, its checkpoint write included) and costs a restart of
``R`` seconds, during which a further failure restarts the restart. Then (Daly 2006,
memoryless failures) a segment of ``w = tau + delta`` takes on average

    E[w] = M * exp(R / M) * (exp(w / M) - 1)

and the run the sum over its segments. Goodput = ``N * iteration_s / E[total]``: the
fraction of wall time that is useful training.

The checkpoint interval that minimises the expected time is about Young's
``sqrt(2 * delta * M)``; Daly's higher-order estimate
``sqrt(2 delta M) * (1 + sqrt(delta / (2M)) / 3 + delta / (18 M)) - delta`` (``M`` when
``delta >= 2M``) is what :func:`optimal_interval_s` returns.

>>> round(segment_time_s(3600.0, 0.0, 1e12), 3)
3600.0
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from sim.errors import SpecError

__all__ = ["GoodputInputs", "segment_time_s", "expected_time_s", "optimal_interval_s",
           "young_interval_s", "monte_carlo", "goodput_report"]


@dataclass(frozen=True)
class GoodputInputs:
    iteration_s: float
    iterations: int
    gpus: int
    mtbf_gpu_s: float
    checkpoint_every: int  # iterations per segment
    checkpoint_write_s: float
    restart_s: float

    def __post_init__(self) -> None:
        for name in ("iteration_s", "mtbf_gpu_s"):
            _check(name, getattr(self, name), positive=True)
        for name in ("checkpoint_write_s", "restart_s"):
            _check(name, getattr(self, name), positive=False)
        for name in ("iterations", "gpus", "checkpoint_every"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise SpecError(name, f"must be a positive integer, got {value!r}")

    @property
    def mtbf_s(self) -> float:
        """The job's mean time between failures: any GPU's failure stops it."""
        return self.mtbf_gpu_s / self.gpus

    def segments(self) -> list[float]:
        """Seconds of each segment: its work and its checkpoint write."""
        full, rest = divmod(self.iterations, self.checkpoint_every)
        work = [self.checkpoint_every * self.iteration_s] * full
        work += [rest * self.iteration_s] if rest else []
        return [w + self.checkpoint_write_s for w in work]


def _check(name: str, value: float, positive: bool) -> None:
    ok = isinstance(value, (int, float)) and math.isfinite(value) and (
        value > 0 if positive else value >= 0)
    if not ok:
        raise SpecError(name, f"must be a {'positive' if positive else 'non-negative'} "
                        f"number, got {value!r}")


def segment_time_s(w: float, restart_s: float, mtbf_s: float) -> float:
    """Expected seconds to get ``w`` seconds done without a failure, each failure costing
    a restart (Daly's ``M e^(R/M) (e^(w/M) - 1)``)."""
    return mtbf_s * math.exp(restart_s / mtbf_s) * math.expm1(w / mtbf_s)


def expected_time_s(x: GoodputInputs) -> float:
    """Seconds to finish the run on average; a :class:`SpecError` when that is beyond a
    float (failures so frequent that a segment or a restart almost never completes)."""
    try:
        total = sum(segment_time_s(w, x.restart_s, x.mtbf_s) for w in x.segments())
    except OverflowError:
        total = math.inf
    if not math.isfinite(total):
        raise SpecError("checkpoint_every", f"the expected time overflows: the job fails every "
                        f"{x.mtbf_s:.3g} s on average, and a segment of {max(x.segments()):.3g}"
                        f" s or a restart of {x.restart_s:.3g} s needs about e^(seconds / "
                        "MTBF) tries; checkpoint more often (or check the MTBF and GPUs)")
    return total


def young_interval_s(checkpoint_write_s: float, mtbf_s: float) -> float:
    return math.sqrt(2 * checkpoint_write_s * mtbf_s)


def optimal_interval_s(checkpoint_write_s: float, mtbf_s: float) -> float:
    """Daly's higher-order optimum of the work between checkpoints."""
    d, m = checkpoint_write_s, mtbf_s
    if d >= 2 * m:
        return m
    return math.sqrt(2 * d * m) * (1 + math.sqrt(d / (2 * m)) / 3 + d / (18 * m)) - d


MAX_DRAWS = 1e7  # failures the Monte Carlo may draw in all (about 10 s)


def _run_once(rng: np.random.Generator, segments: list[float], restart_s: float,
              mtbf_s: float) -> float:
    """One run's wall time: failures drawn as they come."""
    t = 0.0
    for w in segments:
        while (x := rng.exponential(mtbf_s)) < w:  # failed during this attempt
            t += x
            while (y := rng.exponential(mtbf_s)) < restart_s:  # failed while restarting
                t += y
            t += restart_s
        t += w
    return t


def monte_carlo(x: GoodputInputs, trials: int = 200, seed: int = 0) -> tuple[float, float]:
    """Mean wall time of ``trials`` simulated runs and its standard error."""
    if trials < 2:
        raise SpecError("trials", f"must be at least 2, got {trials}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise SpecError("seed", f"must be an integer >= 0, got {seed!r}")
    draws = trials * (expected_time_s(x) / x.mtbf_s + len(x.segments()))
    if draws > MAX_DRAWS:
        raise SpecError("trials", f"{trials} runs would draw about {draws:.3g} failures, "
                        f"more than {MAX_DRAWS:.0e}; use fewer runs or none")
    rng = np.random.default_rng(seed)
    segs = x.segments()
    times = np.array([_run_once(rng, segs, x.restart_s, x.mtbf_s) for _ in range(trials)])
    return float(times.mean()), float(times.std(ddof=1) / math.sqrt(trials))


def goodput_report(x: GoodputInputs, trials: int = 0, seed: int = 0) -> dict[str, object]:
    """Expected time, goodput and the optimal interval; with ``trials``, the Monte Carlo."""
    useful = x.iterations * x.iteration_s
    total = expected_time_s(x)
    best_s = optimal_interval_s(x.checkpoint_write_s, x.mtbf_s)
    best_k = max(1, round(best_s / x.iteration_s))
    at_best = expected_time_s(GoodputInputs(
        x.iteration_s, x.iterations, x.gpus, x.mtbf_gpu_s, best_k, x.checkpoint_write_s,
        x.restart_s))
    out: dict[str, object] = {
        "inputs": {k: getattr(x, k) for k in x.__dataclass_fields__},
        "job_mtbf_s": x.mtbf_s, "useful_s": useful, "expected_time_s": total,
        "goodput": useful / total, "expected_failures": total / x.mtbf_s,
        "optimal_interval_s": best_s, "young_interval_s": young_interval_s(
            x.checkpoint_write_s, x.mtbf_s),
        "optimal_checkpoint_every": best_k, "expected_time_at_optimum_s": at_best,
        "goodput_at_optimum": useful / at_best}
    if trials:
        mean, err = monte_carlo(x, trials, seed)
        out["monte_carlo"] = {"trials": trials, "seed": seed, "mean_time_s": mean,
                              "stderr_s": err, "goodput": useful / mean,
                              "relative_difference": mean / total - 1}
    return out
