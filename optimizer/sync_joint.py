"""Search the parallel plan and the synchronisation strategy together.

Two levels: the parallel-plan search (:func:`optimizer.search.optimize`, BSP over
all-reduce) gives its ``parallel_top`` fastest plans with at least two data-parallel
workers; for each, every synchronisation candidate (:func:`optimizer.sync_search.
optimize_sync`: sync kind and parameters, all-reduce or parameter servers, compression) is
simulated over many steps. All (plan, strategy) pairs are then ranked together by the
objective, and the Pareto set of throughput against statistical efficiency is taken over
all of them. A strategy can thus win on a plan that is not the fastest under BSP (e.g. one
with more data-parallel workers, whose all-reduce a parameter server or local SGD
relieves); the pairs not tried are those whose parallel plan is outside the BSP top
``parallel_top`` (widen it to search further).
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

from optimizer.sync_search import SyncSearch, optimize_sync, pareto_of, ranking_key
from sim.errors import NoFeasiblePlan, SpecError
from sim.spec.cluster import ClusterSpec
from sim.spec.model import ModelSpec
from sim.spec.plan import Plan
from sim.spec.workload import Workload

__all__ = ["optimize_joint", "parallel_label", "MAX_PARALLEL_TOP"]

MAX_PARALLEL_TOP = 16  # parallel plans a joint search tries strategies on


def parallel_label(plan: Plan) -> str:
    return f"dp{plan.dp} tp{plan.tp} pp{plan.pp}" + (f" cp{plan.cp}" if plan.cp > 1 else "") \
        + (f" zero{plan.zero_stage}" if plan.zero_stage else "")


def _parallel_plans(model: ModelSpec, cluster: ClusterSpec, batch: int, seq_len: int,
                    dtype: str, top: int, workers: int | None) -> list[Plan]:
    from optimizer.search import optimize

    report = optimize(model, cluster, batch, seq_len, top_k=max(8, top), workers=workers,
                      progress=False, dtype=dtype)
    plans, seen = [], set()
    for c in report.ranked:  # distinct layouts: the strategies drop ZeRO anyway
        key = parallel_label(dataclasses.replace(c.plan, zero_stage=0,
                                                 reshard_after_forward=True))
        if c.plan.dp >= 2 and key not in seen and math.isfinite(c.best_s):
            seen.add(key)
            plans.append(c.plan)
    if not plans:
        raise NoFeasiblePlan("none of the fastest parallel plans has two or more "
                             "data-parallel workers to synchronise")
    return plans[:top]


def optimize_joint(model: ModelSpec | Workload, cluster: ClusterSpec, global_batch_size: int,
                   seq_len: int, objective: str = "time-to-accuracy", *,
                   parallel_top: int = 3, dtype: str = "bf16", workers: int | None = None,
                   **sync_kw: Any) -> SyncSearch:
    """Rank (parallel plan, strategy) pairs by ``objective``; ``sync_kw`` as
    :func:`optimize_sync` takes them (convergence, lr, target, des_top, steps, faults)."""
    if not isinstance(model, ModelSpec):
        raise SpecError("--model", "the joint search needs a transformer spec (the parallel "
                        "search does): give --plan to search strategies for a workload graph")
    if isinstance(parallel_top, bool) or not isinstance(parallel_top, int) or \
            not 1 <= parallel_top <= MAX_PARALLEL_TOP:
        raise SpecError("--parallel-top", f"must be an integer in 1..{MAX_PARALLEL_TOP}, got "
                        f"{parallel_top!r}")
    plans = _parallel_plans(model, cluster, global_batch_size, seq_len, dtype, parallel_top,
                            workers)
    rows: list[dict[str, Any]] = []
    searches, seen = [], set()
    for i, plan in enumerate(plans):
        s = optimize_sync(model, cluster, plan, objective, **sync_kw)
        searches.append(s)
        for r in s.rows:  # labelled by the plan the strategy runs on (no ZeRO but BSP's)
            key = json.dumps(r["plan"].to_dict(), sort_keys=True)
            if key in seen:
                continue
            seen.add(key)
            rows.append({**r, "strategy": f"[{parallel_label(r['plan'])}] {r['strategy']}",
                         "parallel": parallel_label(plan), "parallel_rank": i})
    key = ranking_key(objective)
    rows.sort(key=key)
    base = {**searches[0].baseline, "parallel": parallel_label(plans[0]), "parallel_rank": 0}
    base["strategy"] = f"[{base['parallel']}] {base['strategy']}"
    notes = [f"strategies tried on the {len(plans)} fastest BSP parallel plans: "
             + ", ".join(parallel_label(p) for p in plans)]
    if key(rows[0]) > key(base):
        notes.append("no pair beats the baseline (the fastest BSP plan over all-reduce)")
    if rows[0]["parallel_rank"] > 0:
        notes.append(f"the best strategy runs on parallel plan {rows[0]['parallel']}, not the "
                     f"fastest under BSP ({parallel_label(plans[0])})")
    notes += [n for n in searches[rows[0]["parallel_rank"]].notes
              if not n.startswith("no candidate beats")]
    return SyncSearch(objective, rows, base, pareto_of(rows), notes)
