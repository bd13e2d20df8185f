"""Statistical efficiency: how many updates a synchronisation strategy needs to reach a
target accuracy, fitted to **measured** runs (never invented), and whether it diverges.

An observation is one real run (``experiments/sync_runs_cpu.py`` writes them; a user may
bring their own CSV with the same columns): its strategy, learning rate, measured mean
staleness, averaging period, the updates it took to reach the target (empty: not reached
in the run) and whether it diverged. Runs fall in two families by what one update is:

- ``async`` (``ssp``, ``asp``; one update = one worker's gradient applied by a server):
  ``k = mean staleness``;
- ``local`` (``local-sgd``; one update = one local step of a worker; ``bsp`` is local SGD
  with H = 1): ``k = H - 1``.

Per family a power law is fitted by least squares in log space on the runs that reached
the target, ``log U = a + b log lr + c log(1 + k)``, with ``sigma`` the residual standard
deviation (a prediction's band is ``U exp(+-sigma)``); and a divergence threshold on the
instability index ``lr (1 + k)``: the geometric midpoint between the largest index that
trained and the smallest that diverged (where they overlap, the cut with fewest wrong
verdicts). Outside the fitted ranges of ``lr`` and ``k`` a prediction says so.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sim.errors import SpecError

__all__ = ["Observation", "ConvergenceModel", "Prediction", "fit_convergence",
           "load_observations", "family_of", "BUNDLED"]

BUNDLED = Path(__file__).resolve().parents[1] / "data" / "convergence"
FAMILIES = {"ssp": "async", "asp": "async", "local-sgd": "local", "bsp": "local"}
COLUMNS = ("kind", "lr", "staleness_mean", "period", "updates_to_target", "diverged")


def family_of(kind: str) -> str:
    if kind not in FAMILIES:
        raise SpecError("plan.sync.kind", f"no measured statistical-efficiency family for "
                        f"{kind!r} yet (measured: {', '.join(FAMILIES)})")
    return FAMILIES[kind]


@dataclass(frozen=True)
class Observation:
    kind: str
    lr: float
    staleness: float  # measured mean (async) or 0
    period: int  # local SGD's H (1 for bsp and the async kinds)
    updates: float | None  # to the target; None: not reached in the run
    diverged: bool

    @property
    def family(self) -> str:
        return family_of(self.kind)

    @property
    def k(self) -> float:
        return self.staleness if self.family == "async" else float(self.period - 1)

    @property
    def index(self) -> float:
        return self.lr * (1 + self.k)


@dataclass(frozen=True)
class Prediction:
    updates: float  # to the target (inf when it diverges)
    low: float  # the band: updates x exp(-sigma) .. x exp(+sigma)
    high: float
    diverges: bool
    extrapolated: list[str]


@dataclass(frozen=True)
class ConvergenceModel:
    family: str
    coef: tuple[float, float, float]  # a, b, c of log U = a + b log lr + c log(1 + k)
    sigma: float
    threshold: float  # diverges when lr (1 + k) exceeds it
    lr_range: tuple[float, float]
    k_range: tuple[float, float]
    runs: int

    def predict(self, lr: float, k: float) -> Prediction:
        if not (lr > 0 and k >= 0):
            raise SpecError("lr", f"must be > 0 with staleness/period >= 0, got lr={lr!r}, "
                            f"k={k!r}")
        out = []
        if not self.lr_range[0] <= lr <= self.lr_range[1]:
            out.append(f"lr {lr:g} outside the fitted {self.lr_range[0]:g}-"
                       f"{self.lr_range[1]:g}")
        if not self.k_range[0] <= k <= self.k_range[1]:
            out.append(f"k {k:g} outside the fitted {self.k_range[0]:g}-{self.k_range[1]:g}")
        if lr * (1 + k) > self.threshold:
            return Prediction(math.inf, math.inf, math.inf, True, out)
        a, b, c = self.coef
        u = math.exp(a + b * math.log(lr) + c * math.log1p(k))
        return Prediction(u, u * math.exp(-self.sigma), u * math.exp(self.sigma), False, out)

    def to_dict(self) -> dict[str, Any]:
        return {"family": self.family, "coef": list(self.coef), "sigma": self.sigma,
                "threshold": self.threshold, "lr_range": list(self.lr_range),
                "k_range": list(self.k_range), "runs": self.runs}


def _threshold(obs: list[Observation]) -> float:
    stable = sorted(o.index for o in obs if not o.diverged)
    bad = sorted(o.index for o in obs if o.diverged)
    if not bad:
        return math.inf
    if not stable:
        return 0.0
    if stable[-1] < bad[0]:
        return math.sqrt(stable[-1] * bad[0])
    cuts = sorted(set(stable + bad))
    best = min(cuts, key=lambda t: (sum(x > t for x in stable) + sum(x <= t for x in bad), t))
    return best


def fit_convergence(obs: list[Observation], family: str) -> ConvergenceModel:
    """The model of ``family`` from the observations of that family."""
    mine = [o for o in obs if o.family == family]
    reached = [o for o in mine if o.updates is not None and not o.diverged]
    if len(reached) < 3:
        raise SpecError("convergence", f"{len(reached)} {family} runs reached the target: "
                        f"at least 3 are needed to fit")
    x = np.array([[1.0, math.log(o.lr), math.log1p(o.k)] for o in reached])
    y = np.log([o.updates for o in reached])  # type: ignore[arg-type]
    ks = {o.k for o in reached}
    if len(ks) == 1:  # no spread in k: its coefficient is not identified
        x = x[:, :2]
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    full = (float(coef[0]), float(coef[1]), float(coef[2]) if len(coef) > 2 else 0.0)
    resid = y - x @ coef
    dof = max(1, len(y) - len(coef))
    sigma = float(math.sqrt(float(resid @ resid) / dof))
    return ConvergenceModel(family, full, sigma, _threshold(mine),
                            (min(o.lr for o in mine), max(o.lr for o in mine)),
                            (min(o.k for o in mine), max(o.k for o in mine)), len(mine))


def _number(row: dict[str, str], name: str, where: str) -> float | None:
    text = row.get(name, "")
    if text in ("", "nan", "NaN", "None"):
        return None
    try:
        return float(text)
    except ValueError:
        raise SpecError(f"{where}.{name}", f"must be a number, got {text!r}") from None


def load_observations(path: str | Path, target: float = 0.95) -> list[Observation]:
    """Runs from a CSV with columns ``kind, lr, staleness_mean, period, updates_to_95`` (or
    ``updates_to_target``) and ``diverged``; rows of other kinds are skipped."""
    p = Path(path)
    where = f"convergence[{p.name}]"
    column = f"updates_to_{round(target * 100)}"
    with p.open(newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        raise SpecError(where, "has no rows")
    have = set(rows[0])
    need = {"kind", "lr", "staleness_mean", "period", "diverged"}
    missing = sorted(need - have) + ([] if column in have or "updates_to_target" in have
                                     else [column])
    if missing:
        raise SpecError(where, f"missing column(s) {', '.join(missing)}")
    col = column if column in have else "updates_to_target"
    out = []
    for row in rows:
        if row["kind"] not in FAMILIES:
            continue
        lr = _number(row, "lr", where)
        if lr is None or lr <= 0:
            raise SpecError(f"{where}.lr", f"must be > 0, got {row['lr']!r}")
        period = _number(row, "period", where)
        out.append(Observation(row["kind"], lr, _number(row, "staleness_mean", where) or 0.0,
                               int(period) if period else 1, _number(row, col, where),
                               row["diverged"].strip().lower() in ("true", "1")))
    return out
