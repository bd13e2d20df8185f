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

__all__ = ["time_to_target", "BUNDLED_MODELS"]

BUNDLED_MODELS = {"digits-cpu": (BUNDLED / "digits_cpu.csv",
                                 "digits, 64-64-10 MLP, 4 workers x batch 32, plain SGD "
                                 "(experiments/sync_runs_cpu.py)"),
                  "cancer-cpu": (BUNDLED / "cancer_cpu.csv",
                                 "breast cancer, 30-32-2 MLP, 4 workers x batch 32, plain "
                                 "SGD (experiments/sync_runs_cpu.py --task cancer --quick)")}


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
