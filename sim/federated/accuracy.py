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
    """Real runs from a CSV (columns ``strategy, clients_per_round, local_epochs, alpha, mu``,
    optionally ``concurrency``, and ``rounds_to_<accuracy %>`` columns, empty where the run
    did not reach it); every value checked, a bad one named with its row."""
    import pandas as pd

    if not path.is_file():
        raise SpecError("convergence", f"no such file: {path}")
    try:
        df = pd.read_csv(path)
    except (ValueError, UnicodeDecodeError, pd.errors.ParserError) as exc:
        raise SpecError("convergence", f"{path.name} is not a readable CSV: "
                        f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
                        ) from None
    missing = [c for c in NEEDED if c not in df.columns]
    targets = [c for c in df.columns if str(c).startswith("rounds_to_")]
    if missing or not targets:
        raise SpecError("convergence", f"{path.name} lacks column(s) "
                        f"{', '.join(missing or ['rounds_to_<accuracy %>'])}")
    levels = {}
    for c in targets:
        pct = str(c)[len("rounds_to_"):]
        if not pct.isdigit() or not 0 < int(pct) < 100:
            raise SpecError("convergence", f"column {c!r} of {path.name}: write "
                            "rounds_to_<accuracy in percent>, e.g. rounds_to_90")
        levels[c] = int(pct) / 100
    return [_observation(row, i, levels, path.name)
            for i, row in enumerate(df.to_dict("records"))]


def _observation(row: dict[str, Any], i: int, levels: dict[str, float], name: str
                 ) -> FLObservation:
    def num(key: str, low: float, integer: bool = False, default: float | None = None
            ) -> float:
        v = row.get(key, default)
        try:
            x = float(v)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            x = math.nan
        if x != x and default is not None:
            x = default
        if not (x >= low) or (integer and (not math.isfinite(x) or x != int(x))) or (
                key != "alpha" and not math.isfinite(x)):
            raise SpecError("convergence", f"row {i + 2} of {name}: {key} must be "
                            f"{'an integer' if integer else 'a number'} >= {low:g}, got {v!r}")
        return x

    reach: dict[float, int | None] = {}
    for col, level in levels.items():
        v = row[col]
        reach[level] = None if v != v else int(num(col, 1, True))
    alpha = num("alpha", 0.0)
    if alpha <= 0:
        raise SpecError("convergence", f"row {i + 2} of {name}: alpha must be > 0 (inf: IID)")
    return FLObservation(str(row["strategy"]), int(num("clients_per_round", 1, True)),
                         num("local_epochs", 1e-9), alpha, num("mu", 0.0), reach,
                         int(num("concurrency", 1, True, default=1.0)))


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
    return _on_the_clock(result, p, target)


def _on_the_clock(result: Any, p: FLPrediction, target: float) -> dict[str, Any]:
    """Full rounds on the simulated clock: a round that got fewer than its K updates counts
    for its share of one (a failed round for none), as the model's rounds are of K updates
    each; past the simulated rounds, their mean progress and duration on."""
    tr = result.job.training
    k = tr.buffer_size if tr.strategy == "fedbuff" else tr.clients_per_round
    ends = np.array([r["end_s"] for r in result.rows])
    gain = np.array([0.0 if r["failed"] else min(r["updates"] / k, 1.0)
                     for r in result.rows])
    done = np.cumsum(gain)
    per_round, mean = float(gain.mean()), float(np.mean(result.round_times()))
    notes = list(p.notes)
    if per_round < 0.999:
        notes.append(f"the simulated rounds average {per_round:.2f} of the K updates the "
                     "model's rounds have: counted in proportion")

    def when(rounds: float) -> float:
        i = int(np.searchsorted(done, rounds - 1e-9))
        if i < len(done):
            return float(ends[i])
        if per_round <= 0:
            return math.inf
        return float(ends[-1] + (rounds - done[-1]) / per_round * mean)
    if p.rounds > done[-1]:
        notes.append(f"beyond the {len(ends)} simulated rounds: their mean progress and "
                     "duration on" if per_round > 0 else "never: every simulated round failed")
    return {"target": target, "rounds": p.rounds, "rounds_band": p.band,
            "time_s": when(p.rounds), "time_band_s": (when(p.band[0]), when(p.band[1])),
            "notes": notes}
