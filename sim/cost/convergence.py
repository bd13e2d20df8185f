"""Statistical efficiency: how many updates a synchronisation strategy needs to reach a
target accuracy, fitted to **measured** runs (never invented), and whether it diverges.

An observation is one real run (``experiments/sync_runs_cpu.py`` writes them; a user may
bring their own CSV with the same columns): its strategy, learning rate, measured mean
staleness, averaging period, the updates it took to reach the target (empty: not reached
in the run) and whether it diverged. Runs fall in families by what one update is and what
delays or thins it (``k``, :func:`k_of`):

- ``async`` (``ssp``, ``asp``; one update = one worker's gradient applied by a server):
  ``k = mean staleness``;
- ``local`` (``local-sgd``; one update = one local step of a worker; ``bsp`` is local SGD
  with H = 1): ``k = H - 1``;
- ``diloco`` (one update = one inner step of a worker): ``k = H - 1``;
- ``backup`` (``backup-workers``; one update = a step of the ``n - b`` kept gradients):
  ``k = b / (n - b)``, the gradients dropped per one kept;
- ``gossip`` (D-PSGD; one update = one local step of a worker): ``k = 1 / gap - 1``
  with ``gap`` the spectral gap of the graph's Metropolis-Hastings mixing matrix (0 on a
  complete graph, which averages exactly; grows as the graph mixes slower);
- ``ad-psgd`` (asynchronous pairwise gossip; one update = one local step of a worker): the
  same ``k`` of its graph;
- ``sgp`` (push-sum over the one-peer exponential graph; one update = one local step):
  ``k`` = the steps its time-varying mixing takes to shrink the slowest disagreement
  e-fold, minus 1 (:func:`sgp_mixing_k`: 1 on 4 workers, ``log2 n - 1`` on a power of two);
- ``two-stage`` (one update = a step; the unimportant part of the gradient applied a step
  late with the local correction): ``k = 1 - important_fraction``, the share delayed;
- ``compressed`` (BSP with a compressed gradient, any scheme; one update = a step):
  ``k = raw / wire - 1``, the gradient's bytes uncompressed over those on the wire (a proxy
  for what the compression throws away, error feedback or not).

Per family a power law is fitted by least squares in log space on the runs that reached
the target, ``log U = a + b log lr + c log(1 + k)`` (``b`` or ``c`` left at 0 where those
runs share one lr or one k: not identified; predictions outside the lr and k they span are
flagged as extrapolated), with ``sigma`` the residual standard deviation (a prediction's
band is ``U exp(+-sigma)``); and a divergence boundary
``lr (1 + k)^gamma = threshold``: of the slopes ``gamma`` in 0, 0.05, .., 2, the line in
(log lr, log(1 + k)) with the widest margin between the runs that trained and those that
diverged, midway between them (where none separates them, the fewest wrong verdicts).
Outside the fitted ranges of ``lr`` and ``k`` a prediction says so.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sim.errors import SpecError
from sim.spec.gossip import gossip_edges

__all__ = ["Observation", "ConvergenceModel", "Prediction", "fit_convergence",
           "load_observations", "family_of", "k_of", "mixing_k", "sgp_mixing_k", "BUNDLED"]

BUNDLED = Path(__file__).resolve().parents[1] / "data" / "convergence"
FAMILIES = {"ssp": "async", "asp": "async", "local-sgd": "local", "bsp": "local",
            "diloco": "diloco", "backup-workers": "backup", "gossip": "gossip",
            "two-stage": "two-stage"}
GOSSIP_FAMILIES = {"d-psgd": "gossip", "ad-psgd": "ad-psgd", "sgp": "sgp"}  # by gossip_mode
GIVEN_K = ("backup", "gossip", "ad-psgd", "sgp", "two-stage")  # a run's k is its CSV column
COLUMNS = ("kind", "lr", "staleness_mean", "period", "updates_to_target", "diverged")


def family_of(kind: str, gossip_mode: str = "d-psgd", compression: str = "none") -> str:
    if compression != "none":
        if kind != "bsp":
            raise SpecError("plan.compression.kind", f"no measured statistical-efficiency "
                            f"family for {kind!r} with compression yet (measured: bsp)")
        return "compressed"
    if kind == "gossip" and gossip_mode in GOSSIP_FAMILIES:
        return GOSSIP_FAMILIES[gossip_mode]
    if kind not in FAMILIES or kind == "gossip":
        what = f"gossip mode {gossip_mode!r}" if kind == "gossip" else repr(kind)
        raise SpecError("plan.sync.kind", f"no measured statistical-efficiency family for "
                        f"{what} (measured: {', '.join(FAMILIES)}; gossip: "
                        f"{', '.join(GOSSIP_FAMILIES)})")
    return FAMILIES[kind]


def sgp_mixing_k(n: int) -> float:
    """SGP's k over ``n`` workers: the steps its one-peer exponential graph takes to shrink
    the slowest disagreement between workers e-fold, minus 1. Step ``t`` keeps half and
    pushes half ``2^(t mod h)`` ahead (``h = ceil(log2 n)``): a circulant mixing whose
    eigenvalues are ``(1 + w^(j 2^t)) / 2``, so after ``t`` steps mode ``j`` keeps the
    product of those. 0 on 2 workers (one step averages exactly), 1 on 3 or 4, ``h - 1`` on
    a power of two: the information crosses the graph in about ``log2 n`` steps."""
    if n <= 1:
        return 0.0
    h = max(1, math.ceil(math.log2(n)))
    j = np.arange(1, n)
    left = np.ones(n - 1, dtype=complex)
    for t in range(64 * h):
        left *= (1 + np.exp(2j * np.pi * j * (2 ** (t % h) % n) / n)) / 2
        if float(np.abs(left).max()) <= math.exp(-1):
            return float(t)
    return math.inf


def mixing_k(edges: list[tuple[int, int]], n: int) -> float:
    """``1 / gap - 1`` of the Metropolis-Hastings mixing matrix of an undirected graph over
    ``n`` workers (each edge weighted ``1 / (1 + max degree of its ends)``)."""
    if n > 4096:
        raise SpecError("plan.dp", f"the gossip family's mixing gap is computed densely: at "
                        f"most 4,096 workers, got {n:,}")
    deg = np.zeros(n)
    for a, b in edges:
        deg[a] += 1
        deg[b] += 1
    w = np.zeros((n, n))
    for a, b in edges:
        w[a, b] = w[b, a] = 1.0 / (1.0 + max(deg[a], deg[b]))
    w[np.diag_indices(n)] = 1.0 - w.sum(axis=1)
    lam = np.sort(np.abs(np.linalg.eigvalsh(w)))
    gap = 1.0 - float(lam[-2]) if n > 1 else 1.0
    k = 1.0 / gap - 1.0 if gap > 1e-12 else math.inf
    return 0.0 if k < 1e-9 else k  # a complete graph averages exactly: rounding, not mixing


def k_of(plan: Any, staleness: float | None = None, wire_ratio: float | None = None
         ) -> float:
    """What delays, thins or coarsens an update of ``plan``'s synchronisation;
    ``staleness``: the measured or simulated mean (asynchronous kinds); ``wire_ratio``: the
    gradient's bytes uncompressed over those on the wire (compressed BSP)."""
    sync, dp = plan.sync, plan.dp
    family = family_of(sync.kind, sync.gossip_mode, plan.compression.kind)
    if family == "compressed":
        if wire_ratio is None or not wire_ratio > 0:
            raise SpecError("wire_ratio", "compressed BSP's k needs the gradient's "
                            f"uncompressed / wire bytes, got {wire_ratio!r}")
        return max(0.0, wire_ratio - 1.0)
    if family == "async":
        return float(dp - 1) if staleness is None else float(staleness)
    if family in ("local", "diloco"):
        return float(sync.period - 1) if sync.kind != "bsp" else 0.0
    if family == "backup":
        return sync.backups / (dp - sync.backups)
    if family == "two-stage":
        if sync.important_layers:
            raise SpecError("plan.sync.important_layers", "the two-stage runs measured chose "
                            "the important part by magnitude (important_fraction), not by "
                            "layer: no family for named layers")
        return 1.0 - sync.important_fraction
    if family == "sgp":
        return sgp_mixing_k(dp)
    return mixing_k(gossip_edges(sync.graph, sync.edges, dp), dp)


@dataclass(frozen=True)
class Observation:
    kind: str
    lr: float
    staleness: float  # measured mean (async) or 0
    period: int  # local SGD's H (1 for bsp and the async kinds)
    updates: float | None  # to the target; None: not reached in the run
    diverged: bool
    given_k: float | None = None  # the run's k (column ``k``), else from staleness/period
    compression: str = "none"  # the run's compression kind (column ``compression``)
    gossip_mode: str = "d-psgd"  # column ``gossip_mode`` (gossip runs)

    @property
    def family(self) -> str:
        if self.compression != "none":
            return "compressed"
        return family_of(self.kind, self.gossip_mode)

    @property
    def k(self) -> float:
        if self.given_k is not None:
            return self.given_k
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
    threshold: float  # diverges when lr (1 + k)^gamma exceeds it
    gamma: float  # the divergence boundary's slope in k (1: the index lr (1 + k))
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
        if lr * (1 + k) ** self.gamma > self.threshold:
            return Prediction(math.inf, math.inf, math.inf, True, out)
        a, b, c = self.coef
        u = math.exp(a + b * math.log(lr) + c * math.log1p(k))
        return Prediction(u, u * math.exp(-self.sigma), u * math.exp(self.sigma), False, out)

    def to_dict(self) -> dict[str, Any]:
        return {"family": self.family, "coef": list(self.coef), "sigma": self.sigma,
                "threshold": self.threshold, "gamma": self.gamma, "lr_range": list(self.lr_range),
                "k_range": list(self.k_range), "runs": self.runs}


GAMMAS = tuple(i / 20 for i in range(41))  # the boundary's slope in k: 0 .. 2


def _separator(obs: list[Observation]) -> tuple[float, float]:
    """(gamma, threshold): the runs diverge when ``lr (1 + k)^gamma`` exceeds the threshold.
    The widest-margin such boundary in (log lr, log(1 + k)) between the runs that trained
    and those that diverged (where none separates, the fewest wrong verdicts first)."""
    stable = [(math.log(o.lr), math.log1p(o.k)) for o in obs if not o.diverged]
    bad = [(math.log(o.lr), math.log1p(o.k)) for o in obs if o.diverged]
    if not bad:
        return 1.0, math.inf
    if not stable:
        return 1.0, 0.0
    best: tuple[float, ...] = (math.inf, 0.0, 1.0, 0.0)  # (wrong, -margin, gamma, cut)
    for g in GAMMAS:
        s = sorted(x + g * y for x, y in stable)
        d = sorted(x + g * y for x, y in bad)
        norm = math.hypot(1.0, g)
        if s[-1] < d[0]:
            cand = (0, -(d[0] - s[-1]) / norm, g, (s[-1] + d[0]) / 2)
        else:
            cuts = sorted(set(s + d))
            cut = min(cuts, key=lambda c: (sum(v > c for v in s) + sum(v <= c for v in d), c))
            cand = (sum(v > cut for v in s) + sum(v <= cut for v in d), 0.0, g, cut)
        if cand[:2] < best[:2]:
            best = cand
    return best[2], math.exp(best[3])


def fit_convergence(obs: list[Observation], family: str) -> ConvergenceModel:
    """The model of ``family`` from the observations of that family."""
    mine = [o for o in obs if o.family == family]
    reached = [o for o in mine if o.updates is not None and not o.diverged]
    if not mine:
        raise SpecError("plan.sync.kind", f"no measured runs of the {family} family in these "
                        "observations (give a CSV with some)")
    if len(reached) < 3:
        raise SpecError("convergence", f"{len(reached)} {family} runs reached the target: "
                        f"at least 3 are needed to fit")
    x = np.array([[1.0, math.log(o.lr), math.log1p(o.k)] for o in reached])
    y = np.log([o.updates for o in reached])  # type: ignore[arg-type]
    # a coefficient is identified only where the runs that reached the target spread
    spread = [True, len({o.lr for o in reached}) > 1, len({o.k for o in reached}) > 1]
    cols = [i for i, s in enumerate(spread) if s]
    coef, *_ = np.linalg.lstsq(x[:, cols], y, rcond=None)
    full = [0.0, 0.0, 0.0]
    for i, c in zip(cols, coef, strict=True):
        full[i] = float(c)
    resid = y - x[:, cols] @ coef
    dof = max(1, len(y) - len(cols))
    sigma = float(math.sqrt(float(resid @ resid) / dof))
    gamma, threshold = _separator(mine)
    return ConvergenceModel(family, (full[0], full[1], full[2]), sigma, threshold, gamma,
                            (min(o.lr for o in reached), max(o.lr for o in reached)),
                            (min(o.k for o in reached), max(o.k for o in reached)), len(mine))


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
        k = _number(row, "k", where)
        comp = (row.get("compression") or "none").strip() or "none"
        mode = (row.get("gossip_mode") or "d-psgd").strip() or "d-psgd"
        if row["kind"] == "gossip" and mode not in GOSSIP_FAMILIES:
            raise SpecError(f"{where}.gossip_mode", f"must be one of "
                            f"{', '.join(GOSSIP_FAMILIES)}, got {mode!r}")
        family = family_of(row["kind"], mode)
        if k is None and (family in GIVEN_K or comp != "none"):
            raise SpecError(f"{where}.k", f"a {row['kind']} run{' compressed' * (comp != 'none')}"
                            " needs its k (column k: sim.cost.convergence.k_of)")
        out.append(Observation(row["kind"], lr, _number(row, "staleness_mean", where) or 0.0,
                               int(period) if period else 1, _number(row, col, where),
                               row["diverged"].strip().lower() in ("true", "1"), k, comp,
                               mode))
    return out
