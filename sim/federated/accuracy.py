"""Statistical efficiency of federated rounds: how many rounds FedAvg (or FedProx) needs to
reach a test accuracy, fitted to **measured** real runs (``experiments/fl_runs_cpu.py``
writes them; a user may bring a CSV with the same columns), and the time to that accuracy
of a simulated job.

Per target accuracy, a power law fitted by least squares in log space on the runs that
reached the target, FedAvg's and FedProx's together (FedProx with ``mu = 0`` is FedAvg)::

    log R = a + b k + c e + d h + f h k + g h e + i k e + j log(1 + 100 mu)

with ``k = log K`` (``K`` the clients a round), ``e = log E`` (``E`` local epochs), ``h =
log(1 + 1 / alpha)`` (``alpha`` the Dirichlet concentration of the clients' label split;
``inf``, IID, gives 0) and ``mu`` FedProx's proximal weight (0 for FedAvg). The
interactions are there because the runs say so: with IID data more clients a round barely
help, with non-IID data they do (held out, the model without them is off by 23% median
against 14% with them, ``experiments/fl_convergence.py``). A slope whose regressor does not
vary in the runs is left at 0 (not identified). ``sigma`` is the residual standard deviation (a
prediction's band is ``R exp(+-sigma)``). Settings outside the fitted ranges, or where the
runs mostly did not reach the target, are flagged.

FedBuff is its own family: ``K`` is its buffer, server steps count as rounds, and the
concurrency (clients training at once) is one more regressor ``log M``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from sim.errors import SpecError

__all__ = ["FLObservation", "FLModel", "FLPrediction", "fit_fl", "load_fl_observations",
           "BUNDLED_FL", "time_to_target"]

BUNDLED_FL = Path(__file__).resolve().parents[1] / "data" / "convergence" / "fl-digits-cpu.csv"
FAMILIES = {"fedavg": "fedavg", "fedprox": "fedavg", "fedbuff": "fedbuff"}  # -> fitted
NEEDED = ("strategy", "clients_per_round", "local_epochs", "alpha", "mu")


@dataclass(frozen=True)
class FLObservation:
    strategy: str
    clients_per_round: int
    local_epochs: float
    alpha: float
    mu: float
    rounds_to: dict[float, int | None]  # target accuracy -> rounds (None: not reached)
    concurrency: int = 1  # fedbuff: clients training at once (1 for round-based runs)


def _features(k: float, e: float, alpha: float, mu: float, m: int = 1) -> np.ndarray:
    lk, le, h = math.log(k), math.log(e), math.log1p(1.0 / alpha)
    return np.array([1.0, lk, le, h, math.log1p(100.0 * mu), math.log(max(m, 1)), h * lk,
                     h * le, lk * le])


_COLS = (1, 2, 3, 4, 5)  # the regressors themselves (ranges, extrapolation)
_ALL = tuple(range(1, 9))
_NAMES = ("clients a round (fedbuff: buffer)", "local epochs", "non-IID alpha", "FedProx mu",
          "concurrency")


@dataclass(frozen=True)
class FLPrediction:
    rounds: float
    band: tuple[float, float]
    notes: tuple[str, ...] = ()


@dataclass
class _Fit:
    coef: np.ndarray
    sigma: float
    n: int
    ranges: list[tuple[float, float]]  # of each regressor but the intercept
    reached: float  # share of the runs that reached the target


@dataclass
class FLModel:
    """Fits per (family, target): :meth:`predict` rounds to a target."""

    fits: dict[tuple[str, float], _Fit] = field(default_factory=dict)
    source: str = ""

    @property
    def targets(self) -> list[float]:
        return sorted({t for _, t in self.fits})

    def has(self, strategy: str, target: float) -> bool:
        return (FAMILIES.get(strategy, strategy), target) in self.fits

    def predict(self, strategy: str, target: float, k: float, e: float, alpha: float,
                mu: float = 0.0, concurrency: int = 1) -> FLPrediction:
        fit = self.fits.get((FAMILIES.get(strategy, strategy), target))
        if fit is None:
            have = sorted({s for s in FAMILIES if (FAMILIES[s], target) in self.fits})
            raise SpecError("training.strategy", f"no measured rounds-to-accuracy model for "
                            f"{strategy!r} at target {target:g} (measured: "
                            f"{', '.join(have) or 'none'} at targets "
                            f"{', '.join(f'{t:g}' for t in self.targets)})")
        x = _features(k, e, alpha, mu, concurrency)
        r = float(math.exp(x @ fit.coef))
        notes = []
        for name, v, (lo, hi) in zip(_NAMES, x[1:6], fit.ranges, strict=True):
            if not lo - 1e-9 <= v <= hi + 1e-9:
                notes.append(f"{name} outside the measured range: extrapolated")
        if fit.reached < 0.5:
            notes.append(f"only {fit.reached:.0%} of the measured runs reached {target:g}")
        s = math.exp(fit.sigma)
        return FLPrediction(max(r, 1.0), (max(r / s, 1.0), r * s), tuple(notes))


def load_fl_observations(path: Path = BUNDLED_FL) -> list[FLObservation]:
    import pandas as pd

    if not path.is_file():
        raise SpecError("convergence", f"no such file: {path}")
    df = pd.read_csv(path)
    missing = [c for c in NEEDED if c not in df.columns]
    targets = [c for c in df.columns if c.startswith("rounds_to_")]
    if missing or not targets:
        raise SpecError("convergence", f"{path.name} lacks column(s) "
                        f"{', '.join(missing or ['rounds_to_<accuracy %>'])}")
    out = []
    for row in df.to_dict("records"):
        reach = {int(c.rsplit("_", 1)[1]) / 100: (None if pd.isna(row[c]) else int(row[c]))
                 for c in targets}
        m = row.get("concurrency", 1)
        out.append(FLObservation(str(row["strategy"]), int(row["clients_per_round"]),
                                 float(row["local_epochs"]), float(row["alpha"]),
                                 float(row["mu"]), reach, 1 if pd.isna(m) else int(m)))
    return out


def fit_fl(obs: list[FLObservation], source: str = "") -> FLModel:
    """One fit per family and target with at least 4 runs that reached it."""
    model = FLModel(source=source)
    for family in sorted({FAMILIES.get(o.strategy, o.strategy) for o in obs}):
        mine = [o for o in obs if FAMILIES.get(o.strategy, o.strategy) == family]
        for target in sorted({t for o in mine for t in o.rounds_to}):
            ok = [o for o in mine if o.rounds_to.get(target)]
            if len(ok) < 4:
                continue
            x = np.array([_features(o.clients_per_round, o.local_epochs, o.alpha, o.mu,
                                    o.concurrency) for o in ok])
            y = np.log([float(o.rounds_to[target] or 1) for o in ok])
            varies = [0] + [j for j in _ALL if np.ptp(x[:, j]) > 1e-12]
            coef = np.zeros(9)
            sol, *_ = np.linalg.lstsq(x[:, varies], y, rcond=None)
            coef[varies] = sol
            resid = y - x @ coef
            dof = max(len(ok) - len(varies), 1)
            model.fits[(family, target)] = _Fit(
                coef, float(math.sqrt(float(resid @ resid) / dof)), len(ok),
                [(float(x[:, j].min()), float(x[:, j].max())) for j in _COLS],
                len(ok) / len(mine))
    return model


def time_to_target(result: Any, model: FLModel, target: float) -> dict[str, Any]:
    """Predicted rounds to ``target`` for a simulated FedAvg/FedProx job, and when the
    simulated clock reaches them (past the simulated rounds: their mean duration on)."""
    tr = result.job.training
    e = tr.local_epochs or tr.local_steps * tr.batch_size / max(
        float(np.mean(result.job.population.arrays(tr.seed).samples)), 1.0)
    mu = tr.mu if tr.strategy == "fedprox" else 0.0
    if tr.strategy == "fedbuff":  # server steps of `buffer` updates, `in_flight` training
        p = model.predict("fedbuff", target, tr.buffer_size, e, tr.non_iid_alpha, 0.0,
                          tr.in_flight)
    else:
        p = model.predict(tr.strategy, target, tr.clients_per_round, e, tr.non_iid_alpha, mu)
    ends = np.array([r["end_s"] for r in result.rows])
    mean = float(np.mean(result.round_times()))

    def when(rounds: float) -> float:
        n = math.ceil(rounds)
        return float(ends[n - 1]) if n <= len(ends) else float(ends[-1] + (n - len(ends))
                                                               * mean)
    return {"target": target, "rounds": p.rounds, "rounds_band": p.band,
            "time_s": when(p.rounds), "time_band_s": (when(p.band[0]), when(p.band[1])),
            "notes": list(p.notes) + ([f"beyond the {len(ends)} simulated rounds: the mean "
                                       "round time on"] if p.rounds > len(ends) else [])}
