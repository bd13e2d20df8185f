"""What the search ranks and how it scores plans: a :class:`Candidate` per plan, the
:class:`SearchReport`, and the scoring functions that run in worker processes
(``multiprocessing``, fork; each worker holds the model, cluster and cost model once).
"""

from __future__ import annotations

import multiprocessing as mp
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sim.analytic.replicas import analytic_lower_bound, analytic_timing
from sim.api import simulate
from sim.cost.profiled import cost_model_for
from sim.layout.memory import memory_verdict
from sim.result import Result
from sim.spec.cluster import ClusterSpec
from sim.spec.limits import MAX_DES_MICROBATCHES
from sim.spec.model import ModelSpec
from sim.spec.plan import Plan

__all__ = ["Candidate", "SearchReport", "init_worker", "score", "screen", "des_result",
           "chunks", "pool_map"]


@dataclass
class Candidate:
    plan: Plan
    analytic_s: float
    peak_gib: float
    des: Result | None = None
    origin: str = "space"  # space | baseline | move: ...

    @property
    def best_s(self) -> float:
        return self.des.iteration_time_s if self.des else self.analytic_s


@dataclass
class SearchReport:
    model: str
    cluster: str
    space_size: int
    feasible: int
    des_evaluated: int
    candidates: list[Candidate]  # analytic-scored, feasible, best first
    ranked: list[Candidate]  # DES-evaluated, best first
    baseline: Candidate | None
    lower_bound_s: float
    wall_s: float
    moves: list[str] = field(default_factory=list)
    # mixed clusters: the best even-split plan and the best balanced one (optimizer.balance)
    homogeneous: Candidate | None = None
    balanced: Candidate | None = None
    # DualPipeV plans that fit but were not timed: their lower bound is above the K-th best
    screened_out: int = 0

    @property
    def best(self) -> Candidate:
        return self.ranked[0]


_CTX: dict[str, Any] = {}


def init_worker(model: ModelSpec, cluster: ClusterSpec) -> None:
    _CTX.update(model=model, cluster=cluster, cost=cost_model_for(cluster))


def score(plans: list[Plan], bound: bool = False) -> list[tuple[float, float]]:
    """(analytic seconds, peak GiB) per plan; seconds are inf when it does not fit.
    ``bound``: a DualPipeV plan's seconds are a lower bound on its analytic time
    (:func:`sim.analytic.replicas.analytic_lower_bound`)."""
    m, c, cost = _CTX["model"], _CTX["cluster"], _CTX["cost"]
    out = []
    for p in plans:
        peak, capacity = memory_verdict(m, c, p)  # each stage against its own GPUs
        if peak > capacity:
            seconds = float("inf")
        elif bound:
            seconds = analytic_lower_bound(m, c, p, cost)
        else:
            seconds = analytic_timing(m, c, p, cost).iteration_s
        out.append((seconds, peak))
    return out


def screen(plans: list[Plan]) -> list[tuple[float, float]]:
    """:func:`score` with DualPipeV plans bounded, not timed."""
    return score(plans, bound=True)


def des_result(plan: Plan) -> Result | None:
    """The DES's result, or None for a plan with more micro-batches per replica than the DES
    runs (:data:`sim.spec.limits.MAX_DES_MICROBATCHES`): it keeps its analytic time."""
    if plan.num_microbatches > MAX_DES_MICROBATCHES:
        return None
    return simulate(_CTX["model"], _CTX["cluster"], plan, "des")


def chunks(items: list[Plan], n: int) -> list[list[Plan]]:
    size = max(1, min(2000, len(items) // (n * 8) or 1))
    return [items[i:i + size] for i in range(0, len(items), size)]


def pool_map(fn: Callable, items: list, workers: int, model: ModelSpec,
              cluster: ClusterSpec, progress: Callable[[int], None] | None = None) -> list:
    if workers <= 1:
        init_worker(model, cluster)
        out = []
        for item in items:
            out.append(fn(item))
            if progress:
                progress(1)
        return out
    with mp.get_context("fork").Pool(workers, init_worker, (model, cluster)) as pool:
        out = []
        for res in pool.imap(fn, items):
            out.append(res)
            if progress:
                progress(1)
        return out
