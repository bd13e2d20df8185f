"""The search for workload graphs (:class:`sim.spec.workload.Workload`): every plan of data
and pipeline parallelism a graph runs — each ``dp x pp`` factorisation of the devices (pp up
to the layer count), every micro-batch size dividing the replica's batch, ZeRO 0-3 (3 only
without a pipeline; none without data parallelism), GPipe and 1F1B —
within the constraints; the memory filter and the analytic tier over all of them, the DES
for the top K. Tensor, context and expert parallelism need a transformer spec.
"""

from __future__ import annotations

import time
from dataclasses import replace

from optimizer.constraints import Constraints
from optimizer.scoring import Candidate, SearchReport
from sim.analytic.graph import graph_iteration
from sim.api import simulate
from sim.cost.costmodel import roofline_for
from sim.cost.graph import layer_times
from sim.cost.profiled import cost_model_for
from sim.errors import NoFeasiblePlan, SpecError
from sim.layout.graph import graph_memory
from sim.spec.cluster import ClusterSpec
from sim.spec.plan import Plan
from sim.spec.workload import Workload

__all__ = ["graph_plans", "optimize_graph"]

MAX_MICRO_BATCH = 1024  # samples per micro-batch the space tries at most


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def graph_plans(w: Workload, cluster: ClusterSpec, gbs: int, dtype: str,
                constraints: Constraints) -> list[Plan]:
    """Every plan of the space (module docstring) that keeps the constraints' fixed values
    and ZeRO ceiling."""
    if constraints.framework != "any":
        raise SpecError("--framework", "exports Megatron-LM, torchtitan and DeepSpeed plans of "
                        f"transformer models; {w.name} is a workload graph")
    bad = [k for k, v in constraints.fixed if k in ("tp", "cp", "ep", "vpp") and v != 1]
    if bad:
        raise SpecError("--fix", f"{bad[0]} must be 1 for a workload graph (data and pipeline "
                        "parallelism only)")
    out = []
    for pp in (d for d in _divisors(cluster.world_size) if d <= len(w.layers)):
        dp = cluster.world_size // pp
        if gbs % dp:
            continue
        for mb in (d for d in _divisors(gbs // dp) if d <= MAX_MICRO_BATCH):
            for zero in range(min(3 if pp == 1 else 2, constraints.max_zero_stage) + 1):
                if zero and dp == 1:
                    continue
                for schedule in ("1f1b", "gpipe") if pp > 1 else ("1f1b",):
                    plan = Plan(gbs, 1, mb, dp=dp, pp=pp, zero_stage=zero,
                                schedule=schedule, dtype=dtype)
                    if all(getattr(plan, k) == v for k, v in constraints.fixed):
                        out.append(plan)
    return out


def _score(w: Workload, cluster: ClusterSpec, plans: list[Plan], limit_gib: float
           ) -> list[Candidate]:
    cost = cost_model_for(cluster)
    out = []
    for plan in plans:
        times = layer_times(w, cluster, plan)
        peak = max(graph_memory(w, cluster, plan, times))
        if peak <= limit_gib:
            out.append(Candidate(plan, graph_iteration(w, cluster, plan, cost, times)
                                 .iteration_s, peak))
    return sorted(out, key=lambda c: (c.analytic_s, c.peak_gib))


def _mfu(w: Workload, cluster: ClusterSpec, c: Candidate) -> float:
    flops = (w.forward_flops_per_sample + w.backward_flops_per_sample) \
        * c.plan.global_batch_size
    return flops / (c.best_s * cluster.world_size * cluster.gpu.peak_tflops(c.plan.dtype)
                    * 1e12)


def optimize_graph(w: Workload, cluster: ClusterSpec, gbs: int, top_k: int = 8,
                   dtype: str = "fp32", constraints: Constraints | None = None
                   ) -> SearchReport:
    """The ranked plans of a workload graph (DES-evaluated first K), or NoFeasiblePlan."""
    t0 = time.perf_counter()
    k = constraints or Constraints()
    plans = graph_plans(w, cluster, gbs, dtype, k)
    if not plans:
        raise NoFeasiblePlan(f"no plan divides {cluster.world_size} devices and the batch of "
                             f"{gbs} within {', '.join(k.describe()) or 'the space'}")
    limit = min(cluster.gpu.memory_gib, k.max_memory_gib or float("inf"))
    feasible = _score(w, cluster, plans, limit)
    if not feasible:
        raise NoFeasiblePlan(f"none of the {len(plans)} plans fits in {limit:g} GiB per "
                             "device (the smallest needs more)")
    ranked = []
    for c in feasible[:top_k]:
        ranked.append(replace(c, des=simulate(w, cluster, c.plan, "des")))
    if k.min_mfu is not None:
        ranked = [c for c in ranked if _mfu(w, cluster, c) >= k.min_mfu]
        if not ranked:
            raise NoFeasiblePlan(f"none of the top {top_k} plans reaches MFU {k.min_mfu:g}")
    ranked.sort(key=lambda c: (c.best_s, c.peak_gib))
    flops = (w.forward_flops_per_sample + w.backward_flops_per_sample) * gbs
    bound = flops / (cluster.world_size * roofline_for(cluster.gpu).gemm_flops[dtype])
    return SearchReport(w.name, cluster.name, len(plans), len(feasible), len(ranked),
                        feasible, ranked, None, bound, time.perf_counter() - t0)
