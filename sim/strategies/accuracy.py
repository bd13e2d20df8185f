"""Time-to-accuracy of a simulated synchronisation run: the updates a measured
statistical-efficiency model (:mod:`sim.cost.convergence`) predicts to reach the target,
times the simulated time per update, with the model's band.

The model is fitted to real runs of one task (the bundled ``digits-cpu``: a 64-64-10 MLP on
scikit-learn's digits, 4 workers, batch 32 each, plain SGD; ``cancer-cpu``: a 30-32-2 MLP on
its breast-cancer table, the same runs, one seed; or a user's CSV of runs): the
result names that task, since updates-to-target of one model say nothing certain about
another's.
"""

from __future__ import annotations

import csv
import functools
import math
from pathlib import Path
from typing import Any

from sim.cost.convergence import (
    BUNDLED,
    family_of,
    fit_convergence,
    k_of,
    load_observations,
)
from sim.errors import SpecError

__all__ = ["time_to_target", "BUNDLED_MODELS", "LOSS_MODELS", "loss_model", "steps_over_bsp",
           "replicas_note"]

BUNDLED_MODELS = {"digits-cpu": (BUNDLED / "digits_cpu.csv",
                                 "digits, 64-64-10 MLP, 4 workers x batch 32, plain SGD "
                                 "(experiments/sync_runs_cpu.py)"),
                  "cancer-cpu": (BUNDLED / "cancer_cpu.csv",
                                 "breast cancer, 30-32-2 MLP, 4 workers x batch 32, plain "
                                 "SGD (experiments/sync_runs_cpu.py --task cancer --quick)")}


# runs to a test *loss* (column updates_to_target), for DiLoCo against BSP
LOSS_MODELS = {"text-cpu": (BUNDLED / "text_cpu.csv",
                            "text: next character of CPython's documentation prose, a "
                            "110,400-parameter transformer, 2 workers x 16 windows of 64 "
                            "characters, AdamW inside, to a test loss of 1.9 nats "
                            "(experiments/diloco_text_cpu.py)")}


# replicas the bundled loss models' runs had, and what more of them measured (the guide)
LOSS_MODEL_REPLICAS = {"text-cpu": (2, "4 and 8 replicas measured 5.7x and 6.7x BSP's steps "
                                       "at H = 500 against 4.4x with 2")}


def replicas_note(convergence: str | Path, replicas: int) -> list[str]:
    """A note when a bundled loss model is applied to more DiLoCo replicas (sites) than
    its runs had; none for a user's CSV or as many replicas."""
    name = next((k for k, (path, _) in LOSS_MODELS.items() if str(convergence) == k
                 or Path(convergence).resolve() == path.resolve()), str(convergence))
    fitted, measured = LOSS_MODEL_REPLICAS.get(name, (replicas, ""))
    if replicas <= fitted:
        return []
    return [f"{name} was fitted to {fitted} replicas, here {replicas} sites: likely "
            f"optimistic for DiLoCo ({measured} on the same task)"]


def loss_model(convergence: str | Path, lr: float) -> tuple[Path, str]:
    """(CSV, what it was measured on) of a loss model, checked: a bundled name or a CSV of
    runs to a loss (column ``updates_to_target``, no accuracy columns), and ``lr > 0``."""
    if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not 0 < lr < math.inf:
        raise SpecError("lr", f"must be a learning rate > 0, got {lr!r}")
    path, source = LOSS_MODELS.get(str(convergence), (Path(convergence), str(convergence)))
    if not path.is_file():
        raise SpecError("convergence", f"{convergence}: neither a bundled loss model "
                        f"({', '.join(LOSS_MODELS)}) nor a CSV of runs")
    try:
        with path.open(newline="") as f:
            header = next(csv.reader(f), [])
    except (UnicodeDecodeError, csv.Error) as e:
        raise SpecError("convergence", f"{convergence}: not a CSV of runs ({e})") from None
    if "updates_to_target" not in header or any(h.startswith("updates_to_9") for h in header):
        raise SpecError("convergence", f"{convergence}: a loss model needs runs to a loss "
                        "(column updates_to_target, no updates_to_90/95 accuracy columns)")
    _fits(path, path.stat().st_mtime_ns)  # both families fit, or a one-line error now
    return path, source


@functools.lru_cache(maxsize=16)
def _fits(path: Path, mtime_ns: int) -> tuple[Any, Any]:
    """(BSP's, DiLoCo's) models fitted to a loss CSV, once per file version."""
    obs = load_observations(path)
    return fit_convergence(obs, "local"), fit_convergence(obs, "diloco")


def steps_over_bsp(period: int, convergence: str | Path = "text-cpu", lr: float = 2e-3
                   ) -> dict[str, Any]:
    """Inner steps DiLoCo with ``period`` H needs to reach the runs' target loss over the
    steps BSP needs, both predicted at inner learning rate ``lr`` by the models fitted to
    the measured runs (``diloco`` and ``local`` families, :mod:`sim.cost.convergence`); the
    band combines both models' ``sigma``."""
    if isinstance(period, bool) or not isinstance(period, int) or period < 1:
        raise SpecError("H", f"must be an integer >= 1, got {period!r}")
    path, source = loss_model(convergence, lr)
    bsp, dil = _fits(path, path.stat().st_mtime_ns)
    dil = dil if period > 1 else bsp
    a, b = bsp.predict(lr, 0.0), dil.predict(lr, float(period - 1))
    band = math.exp(math.hypot(bsp.sigma, dil.sigma)) if period > 1 else 1.0
    ratio = b.updates / a.updates
    return {"task": source, "H": period, "lr": lr, "ratio": ratio, "low": ratio / band,
            "high": ratio * band, "diverges": a.diverges or b.diverges,
            "extrapolated": a.extrapolated + b.extrapolated}


def time_to_target(result: Any, plan: Any, convergence: str | Path, lr: float,
                   target: float = 0.95) -> dict[str, Any]:
    """Updates and seconds to ``target`` test accuracy for ``result`` (a SyncResult)."""
    if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not 0 < lr < math.inf:
        raise SpecError("lr", f"must be a learning rate > 0, got {lr!r}")
    if target not in (0.9, 0.95):
        raise SpecError("target", f"the measured runs record 0.9 and 0.95, got {target!r}")
    path, source = BUNDLED_MODELS.get(str(convergence), (Path(convergence), str(convergence)))
    if not path.is_file():
        raise SpecError("convergence", f"{convergence}: neither a bundled model "
                        f"({', '.join(BUNDLED_MODELS)}) nor a CSV of runs")
    family = family_of(plan.sync.kind, plan.sync.gossip_mode, plan.compression.kind)
    model = fit_convergence(load_observations(path, target), family)
    notes = []
    mean = result.staleness.get("mean") if family == "async" else None
    k = k_of(plan, mean, result.wire_ratio)
    if family == "async" and mean is None:
        notes.append(f"the staleness has no closed form here: n - 1 = {k:g} assumed "
                     "(the des tier measures it)")
    p = model.predict(lr, k)
    rate = result.updates_per_s
    return {"task": source, "target": target, "family": family, "k": k, "lr": lr,
            "diverges": p.diverges, "updates": p.updates, "updates_low": p.low,
            "updates_high": p.high, "seconds": p.updates / rate if rate else math.inf,
            "seconds_low": p.low / rate if rate else math.inf,
            "seconds_high": p.high / rate if rate else math.inf,
            "extrapolated": p.extrapolated + notes, "model": model.to_dict()}
