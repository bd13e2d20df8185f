"""Run a federated job and gather its rounds into one result (:class:`FLResult`)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sim.federated.clients import Fleet
from sim.federated.fedbuff import run_fedbuff
from sim.federated.rounds import run_rounds
from sim.spec.federated import FLJob

__all__ = ["FLResult", "simulate_fl"]

COLUMNS = ("round", "start_s", "end_s", "duration_s", "collect_s", "waited_s", "sampled",
           "updates", "dropped", "failed", "aggregate_s")


@dataclass
class FLResult:
    """A job's rounds (FedBuff: server steps) in order, and every reporting client's time
    from its round's start (``client_s``, for the distribution plots) and the clients each
    round sampled (``sampled_ids``). ``collect_s``: from a round's start to its last used
    update (FedScale's round duration), before the server's aggregation."""

    job: FLJob
    rows: list[dict[str, Any]]
    client_s: list[np.ndarray] = field(default_factory=list)
    sampled_ids: list[np.ndarray] = field(default_factory=list)
    wall_s: float = 0.0  # how long the simulation itself took

    @property
    def total_s(self) -> float:
        return float(self.rows[-1]["end_s"]) if self.rows else 0.0

    def round_times(self) -> np.ndarray:
        return np.array([r["duration_s"] for r in self.rows])

    def table(self) -> Any:
        """The rounds as a pandas DataFrame (staleness columns for FedBuff)."""
        import pandas as pd

        extra = [k for k in ("staleness_mean", "staleness_max") if self.rows
                 and k in self.rows[0]]
        return pd.DataFrame([{k: r.get(k) for k in COLUMNS + tuple(extra)}
                             for r in self.rows])

    def summary(self) -> dict[str, Any]:
        t = self.round_times()
        ok = [r for r in self.rows if not r["failed"]]
        tr = self.job.training
        out = {"job": self.job.name, "strategy": tr.strategy, "network": tr.network,
               "clients": self.job.population.clients, "rounds": len(self.rows),
               "failed_rounds": len(self.rows) - len(ok), "total_s": self.total_s,
               "round_s": {"mean": float(t.mean()), "median": float(np.median(t)),
                           "p10": float(np.percentile(t, 10)),
                           "p90": float(np.percentile(t, 90))} if len(t) else {},
               "updates_per_round": float(np.mean([r["updates"] for r in self.rows]))
               if self.rows else 0.0, "wall_s": self.wall_s}
        if tr.strategy == "fedbuff" and self.rows:
            out["staleness_mean"] = float(np.mean([r["staleness_mean"] for r in self.rows]))
        return out


def simulate_fl(job: FLJob, progress: Callable[[int], None] | None = None) -> FLResult:
    """Simulate ``job`` from its seed (the same seed gives the same result)."""
    t0 = time.perf_counter()
    fleet = Fleet(job)
    if job.training.strategy == "fedbuff":
        rows = run_fedbuff(fleet, progress)
        clients: list[np.ndarray] = []
        sampled: list[np.ndarray] = []
    else:
        rows = run_rounds(fleet, progress)
        clients = [r.pop("client_s") for r in rows]
        sampled = [r.pop("sampled_ids") for r in rows]
    return FLResult(job, rows, clients, sampled, time.perf_counter() - t0)
