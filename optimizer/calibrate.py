"""Fit a calibration (:mod:`sim.spec.calibration`) to measured runs: a few named factors of
the hardware catalog, by least squares in relative error, with a prior.

A run is a measured iteration time with its model, cluster and plan (a CSV row: ``model,
cluster, plan, measured_iteration_s`` (or ``log``, ``trace``, ``compare``) and optionally
``label``; the cluster a preset or a TOML path, the plan a JSON path, paths relative to the
CSV's folder). Every run must be on one device type. The fit minimises::

    mean_i (predicted_i / measured_i - 1)^2 + prior * sum_k (log f_k - log f_k0)^2

over the factors ``f_k`` in log space (an additive one, the per-layer fixed cost, in units
of 100 µs; ``f_k0``: the catalog's values), by damped
Gauss-Newton with finite-difference slopes, each factor within its bounds. The prior keeps
what a run cannot identify where the catalog put it: one run moves mostly the factor its
time depends on most. A factor that ends at a bound with the runs still pulling it out is
an error (the model misses something a calibration cannot fix), and nothing is written; a
fixed cost resting at 0 is not (the runs want none).
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from optimizer.compared import compared_run
from optimizer.logs import iteration_s_from_log
from optimizer.traces import iteration_s_from_trace
from sim import simulate
from sim.errors import SpecError
from sim.spec.calibration import (
    ADDITIVE,
    ANALYTIC_ONLY,
    BOUNDS,
    FACTORS,
    SCHEMA_VERSION,
    apply_calibration,
)
from sim.spec.cluster import ClusterSpec, load_cluster
from sim.spec.model import ModelSpec
from sim.spec.plan import Plan, load_plan
from sim.spec.workload import Workload
from sim.spec.zoo import load_any

__all__ = ["Run", "load_runs", "fit", "leave_one_out", "calibrate_on_one"]

COLUMNS = ("model", "cluster", "plan", "measured_iteration_s")


@dataclass(frozen=True)
class Run:
    model: ModelSpec | Workload
    cluster: ClusterSpec
    plan: Plan
    measured_s: float
    label: str


def load_runs(path: Path) -> list[Run]:
    """The runs of a CSV, each checked (one line naming the row and column if not). A run's
    time is ``measured_iteration_s``, or a Megatron-LM or torchtitan training ``log`` (a
    path; :mod:`optimizer.logs`), or a PyTorch profiler ``trace`` (a path;
    :mod:`optimizer.traces`), or a ``trainsim compare --json`` result (``compare``, a path;
    :mod:`optimizer.compared`: its measured time, checked against the row's model, cluster
    and plan)."""
    if not path.is_file():
        raise SpecError("runs", f"no such file: {path}")
    with path.open(newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    need = COLUMNS[:3]
    if not rows or any(c not in rows[0] for c in need) or not (
            {"measured_iteration_s", "log", "trace", "compare"} & set(rows[0])):
        raise SpecError("runs", f"{path.name} needs a header with {', '.join(need)} and "
                        "measured_iteration_s, log, trace or compare, and at least one run")

    def local(ref: str) -> str:
        p = path.parent / ref
        return str(p) if not Path(ref).is_absolute() and p.exists() else ref

    out = []
    for i, row in enumerate(rows):
        plan, model = load_plan(local(row["plan"])), load_any(local(row["model"]))
        cluster = load_cluster(local(row["cluster"]))
        if row.get("compare"):
            t, plan = compared_run(Path(local(row["compare"])), model, cluster, plan,
                                   f"runs[{i}].compare")
        else:
            t = _time(row, plan, model, i, path, local)
        out.append(Run(model, cluster, plan, t, row.get("label") or f"row {i + 2}"))
    devices = {r.cluster.gpu.name for r in out}
    if len(devices) > 1:
        raise SpecError("runs", f"every run must be on one device type to calibrate it, got "
                        f"{', '.join(sorted(devices))}")
    return out


def _time(row: dict[str, str], plan: Plan, model: ModelSpec | Workload, i: int, path: Path,
          local: Any) -> float:
    """A row's measured iteration time: its number, or what its log or trace reports."""
    if row.get("trace"):
        return iteration_s_from_trace(Path(local(row["trace"])), model, plan,
                                      f"runs[{i}].trace")
    if row.get("log"):
        return iteration_s_from_log(Path(local(row["log"])), plan, f"runs[{i}].log")
    text = row.get("measured_iteration_s") or ""
    try:
        t = float(text)
    except ValueError:
        t = math.nan
    if not (math.isfinite(t) and t > 0):
        raise SpecError(f"runs[{i}].measured_iteration_s", f"row {i + 2} of {path.name}: "
                        f"must be a positive number of seconds (or give a log or trace), got "
                        f"{text!r}")
    return t


def _errors(runs: list[Run], cal: dict[str, Any], fidelity: str) -> np.ndarray:
    return np.array([simulate(r.model, apply_calibration(r.cluster, cal), r.plan,
                              fidelity=fidelity).iteration_time_s / r.measured_s - 1
                     for r in runs])


LINEAR_UNIT = 100.0  # an additive factor is fitted in units of 100 µs


def _to(name: str, value: float) -> float:
    """A factor's value in the fit's coordinates (log for an efficiency)."""
    return value / LINEAR_UNIT if name in ADDITIVE else math.log(value)


def _from(name: str, x: float) -> float:
    return float(x * LINEAR_UNIT) if name in ADDITIVE else float(math.exp(x))


def _cal(device: str, names: tuple[str, ...], x: np.ndarray) -> dict[str, Any]:
    return {"schema_version": SCHEMA_VERSION, "device": device,
            "factors": {k: _from(k, v) for k, v in zip(names, x, strict=True)}}


def _fit_factors(runs: list[Run], factors: tuple[str, ...], fidelity: str
                 ) -> tuple[Any, tuple[str, ...]]:
    """(device, factors to fit) of a calibration, checked: runs on one stack; known
    factors; with the default set, those this device can have and this tier can see."""
    if not runs:
        raise SpecError("runs", "no run to calibrate on")
    stacks = sorted({r.cluster.stack or "none" for r in runs})
    if len(stacks) > 1:
        raise SpecError("runs", f"every run must be on one software stack to calibrate it, "
                        f"got {', '.join(stacks)}")
    bad = [f for f in factors if f not in BOUNDS]
    if bad or not factors:
        raise SpecError("--factors", f"each one of {', '.join(FACTORS)}, got "
                        f"{', '.join(bad) or 'none'}")
    device, default = runs[0].cluster.gpu, factors == FACTORS
    outside = [f for f in factors if not BOUNDS[f][0] <= getattr(device, f) <= BOUNDS[f][1]]
    blind = [f for f in factors if f in ANALYTIC_ONLY] if fidelity == "des" else []
    if default:  # what this device can have (cpu: no overlap) and this tier can see
        factors = tuple(f for f in factors if f not in outside + blind)
    elif outside:
        f = outside[0]
        raise SpecError("--factors", f"{f} is {getattr(device, f):g} on {device.name}, outside "
                        f"its calibration range [{BOUNDS[f][0]}, {BOUNDS[f][1]}]: leave it out")
    elif blind:  # the DES runs collectives beside compute or not, no share
        raise SpecError("--factors", f"{', '.join(blind)} acts in the analytic tier only "
                        "(the DES overlaps collectives fully or not at all): leave it out "
                        "with --fidelity des")
    return device, factors


def fit(runs: list[Run], factors: tuple[str, ...] = FACTORS, prior: float = 0.05,
        fidelity: str = "analytic", iterations: int = 12) -> dict[str, Any]:
    """The calibration of ``factors`` that best explains ``runs`` (see the module)."""
    device, factors = _fit_factors(runs, factors, fidelity)
    x0 = np.array([_to(f, getattr(device, f)) for f in factors])
    lo = np.array([_to(f, BOUNDS[f][0]) if f in ADDITIVE else math.log(BOUNDS[f][0])
                   for f in factors])
    hi = np.array([_to(f, BOUNDS[f][1]) for f in factors])
    x = np.clip(x0, lo, hi)
    w = math.sqrt(prior)

    def residual(v: np.ndarray) -> np.ndarray:
        e = _errors(runs, _cal(device.name, factors, v), fidelity) / math.sqrt(len(runs))
        return np.concatenate([e, w * (v - x0)])

    x, r = _unstick(residual, x, lo, hi)
    damping = 1e-3
    for _ in range(iterations):
        jac = np.empty((len(r), len(x)))
        for k in range(len(x)):
            step = np.zeros_like(x)
            step[k] = 1e-3 if x[k] + 1e-3 <= hi[k] else -1e-3
            jac[:, k] = (residual(x + step) - r) / step[k]
        lhs = jac.T @ jac + damping * np.eye(len(x))
        trial = np.clip(x - np.linalg.solve(lhs, jac.T @ r), lo, hi)
        rt = residual(trial)
        if rt @ rt < r @ r:
            x, r, damping = trial, rt, damping / 3
        else:
            damping *= 10
        if damping > 1e6:
            break
    _check_bounds(factors, x, lo, hi, jac, r)
    cal = _cal(device.name, factors, x)
    before = _errors(runs, _cal(device.name, factors, x0), fidelity)
    after = _errors(runs, cal, fidelity)
    cal |= {"fitted_on": len(runs), "prior": prior, "fidelity": fidelity,
            "stack": runs[0].cluster.stack,
            "fit": [{"run": run.label, "error_before": float(b), "error_after": float(a)}
                    for run, b, a in zip(runs, before, after, strict=True)]}
    return cal


def _unstick(residual: Any, x: np.ndarray, lo: np.ndarray, hi: np.ndarray,
             points: int = 7) -> tuple[np.ndarray, np.ndarray]:
    """A factor the runs' times hardly move where the fit starts (a collective hidden behind
    compute: its slope is near zero until it is the longer) is invisible to Gauss-Newton;
    try each such factor alone at ``points`` values across its range and start from the
    best, if it beats the catalog. Near zero: doubling the factor moves no run's time by
    more than 1.4% (a slope under 0.02 in relative error per unit of log factor)."""
    r = residual(x)
    best_x, best_r = x, r
    for k in range(len(x)):
        step = np.zeros_like(x)
        step[k] = 1e-3 if x[k] + 1e-3 <= hi[k] else -1e-3
        # the runs' part (not the prior's), undoing the residual's 1/sqrt(runs)
        slope = (residual(x + step) - r)[:-len(x)] / step[k] * math.sqrt(len(r) - len(x))
        if np.max(np.abs(slope)) >= 0.02:
            continue
        for v in np.linspace(lo[k], hi[k], points):
            trial = x.copy()
            trial[k] = v
            rt = residual(trial)
            if rt @ rt < best_r @ best_r:
                best_x, best_r = trial, rt
    return best_x, best_r


def _check_bounds(factors: tuple[str, ...], x: np.ndarray, lo: np.ndarray, hi: np.ndarray,
                  jac: np.ndarray, r: np.ndarray) -> None:
    """A factor pinned at a bound while the runs pull it further out: refuse."""
    grad = jac.T @ r
    for k, f in enumerate(factors):
        at_floor = x[k] <= lo[k] + 1e-9 and grad[k] > 0
        if f in ADDITIVE and at_floor:
            continue  # no fixed cost at all is a fit, not a failure
        if (x[k] >= hi[k] - 1e-9 and grad[k] < 0) or at_floor:
            lo_b, hi_b = BOUNDS[f]
            raise SpecError(f"factors.{f}", f"the runs pull it outside [{lo_b}, {hi_b}]: the "
                            "model misses something a calibration cannot fix (check the "
                            "runs' plans, or leave this factor out with --factors)")


def leave_one_out(runs: list[Run], **kw: Any) -> list[dict[str, Any]]:
    """Each run predicted by a calibration fitted to the others."""
    out = []
    for i, run in enumerate(runs):
        cal = fit(runs[:i] + runs[i + 1:], **kw)
        err = float(_errors([run], cal, kw.get("fidelity", "analytic"))[0])
        out.append({"run": run.label, "held_out_error": err})
    return out


def calibrate_on_one(runs: list[Run], **kw: Any) -> list[dict[str, Any]]:
    """For each run, a calibration fitted to it alone, and the others' errors under it."""
    out = []
    for i, run in enumerate(runs):
        cal = fit([run], **kw)
        others = [r for j, r in enumerate(runs) if j != i]
        errs = np.abs(_errors(others, cal, kw.get("fidelity", "analytic")))
        out.append({"calibrated_on": run.label, "mean_error": float(errs.mean()),
                    "worst_error": float(errs.max()), "factors": cal["factors"]})
    return out
