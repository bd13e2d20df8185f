"""The search, cheap to expensive: memory filter, analytic tier over the whole space, the
discrete-event tier for the top K, then local moves on what the DES says is the bottleneck.

Work is spread over the machine's cores (``multiprocessing``, fork): each worker scores a
slice of the space. The Megatron-style heuristic plan is always evaluated as the baseline,
and a lower bound (all model FLOPs at the device's best GEMM rate, no bubble, no exposed
communication) gives the optimality gap.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Callable

from optimizer.moves import neighbours
from optimizer.scoring import (
    Candidate,
    SearchReport,
    chunks,
    des_result,
    pool_map,
    score,
    screen,
)
from optimizer.space import SearchSpace, divisors
from sim.analytic.replicas import analytic_timing, bounds_below
from sim.cost.profiled import cost_model_for
from sim.errors import NoFeasiblePlan, SpecError
from sim.layout.flops import model_flops_per_token
from sim.layout.memory import memory_verdict
from sim.spec.cluster import ClusterSpec
from sim.spec.model import ModelSpec
from sim.spec.plan import Plan

__all__ = ["optimize", "SearchReport", "Candidate", "megatron_heuristic", "lower_bound_s"]


# The heuristic and the bound ------------------------------------------------------------
def megatron_heuristic(space: SearchSpace) -> Plan | None:
    """TP across the node (the largest valid degree), PP across nodes (the fewest stages
    that fit in memory, trying no recompute, then full), the rest DP; 1F1B, micro-batch 1."""
    m, c = space.model, space.cluster
    tp = max(space._tps())
    for recompute in ("none", "full"):
        for pp in divisors(c.world_size // tp):
            dp = c.world_size // (tp * pp)
            if m.num_layers % pp or space.global_batch_size % dp:
                continue
            plan = Plan(space.global_batch_size, space.seq_len, 1, dp, tp, pp,
                        recompute=recompute, sequence_parallel=tp > 1, dtype=space.dtype,
                        attention=space.attention,
                        overlap_grad_reduce=space.overlap_grad_reduce)
            if _fits(m, c, plan):
                return plan
    return None


def _fits(model: ModelSpec, cluster: ClusterSpec, plan: Plan) -> bool:
    peak, capacity = memory_verdict(model, cluster, plan)
    return peak <= capacity


def lower_bound_s(space: SearchSpace) -> float:
    """All model FLOPs at each device's best GEMM rate on every device at once."""
    c = space.cluster
    flops = model_flops_per_token(space.model, space.seq_len) * space.global_batch_size \
        * space.seq_len
    groups = [(g.nodes * c.gpus_per_node, g.gpu) for g in c.node_groups] or \
        [(c.world_size, c.gpu)]
    rate = sum(n * gpu.peak_tflops(space.dtype) * 1e12 * gpu.gemm_eff_max for n, gpu in groups)
    return flops / rate


# Constraints and infeasibility ------------------------------------------------------------
def mfu_of(space: SearchSpace, seconds: float) -> float:
    """Model FLOPs utilisation of a step of ``seconds`` (the devices' dense peak)."""
    c = space.cluster
    flops = model_flops_per_token(space.model, space.seq_len) * space.global_batch_size \
        * space.seq_len
    groups = [(g.nodes * c.gpus_per_node, g.gpu) for g in c.node_groups] or \
        [(c.world_size, c.gpu)]
    return flops / seconds / sum(n * gpu.peak_tflops(space.dtype) * 1e12 for n, gpu in groups)


def _within(space: SearchSpace, peak_gib: float, seconds: float) -> bool:
    """The memory budget and the MFU floor of the constraints."""
    k = space.constraints
    return (k.max_memory_gib is None or peak_gib <= k.max_memory_gib) and \
        (k.min_mfu is None or mfu_of(space, seconds) >= k.min_mfu)


def _admitted(space: SearchSpace, c: Candidate) -> bool:
    """Within the constraints at its best tier (the baseline is held to them too: it is
    ranked only when the user's framework, ZeRO ceiling and fixed degrees admit it)."""
    return _within(space, c.peak_gib, c.best_s) and (
        c.origin != "baseline" or space.constraints.admits(c.plan, space.model))


def _why_infeasible(space: SearchSpace, plans: list[Plan], cands: list[Candidate]) -> str:
    """Which constraint rules out each (tp, pp, cp) family, in one line per family."""
    k = space.constraints
    fit = [c for c in cands if c.analytic_s < float("inf")]
    if fit and (k.max_memory_gib is not None or k.min_mfu is not None):
        top = max(mfu_of(space, c.analytic_s) for c in fit)
        low = min(c.peak_gib for c in fit)
        return (f"{len(fit)} plans fit in memory, none within "
                f"{', '.join(k.describe())}: the least memory {low:.1f} GiB, the best "
                f"analytic MFU {100 * top:.1f}%")
    cap = min(space.cluster.gpu.memory_gib, k.max_memory_gib or float("inf"))
    families: dict[tuple[int, int, int], float] = {}
    for c in cands:
        key = (c.plan.tp, c.plan.pp, c.plan.cp)
        families[key] = min(families.get(key, float("inf")), c.peak_gib)
    lines = [f"tp={tp} pp={pp} cp={cp}: best {peak:.1f} GiB > {cap:.1f} GiB per device"
             for (tp, pp, cp), peak in sorted(families.items(), key=lambda kv: kv[1])[:8]]
    return "no plan fits in memory; the closest families (after ZeRO, recompute and " \
           "micro-batch 1): " + "; ".join(lines)


# Local search ------------------------------------------------------------------------------
def _plan_key(p: Plan) -> str:
    return repr(sorted(p.to_dict().items()))


def _sig(seconds: float) -> float:
    """A time to 9 significant digits: plans that differ by float rounding alone tie (and
    then rank by plan), whatever the summation order of their simulations."""
    return float(f"{seconds:.9g}")


def _rank(seconds: float, p: Plan) -> tuple[float, str]:
    return _sig(seconds), _plan_key(p)


MIN_GAIN = 1e-3  # a move must beat the plan it starts from by 0.1%


def _local_search(space: SearchSpace, best: Candidate, seen: set[str], workers: int,
                  progress: bool, deadline: float | None, rounds: int = 6
                  ) -> tuple[Candidate, list[Candidate], int, list[str]]:
    """Greedy: evaluate the bottleneck moves of the best plan; take the best improvement of
    at least MIN_GAIN, until none or past ``deadline`` (``time.perf_counter()``). Returns the
    best, the accepted moves, how many plans the DES evaluated, and a log."""
    from tqdm import tqdm

    log: list[str] = []
    tried: list[Candidate] = []
    evaluated = 0
    bar = tqdm(total=rounds, desc="local moves", unit="round", disable=not progress)
    for r in range(rounds):
        if deadline is not None and time.perf_counter() > deadline:
            log.append(f"stopped by --max-wall-s before round {r + 1}: best so far reported")
            break
        bar.update()
        moves = [(n, p) for n, p in neighbours(space, best) if _plan_key(p) not in seen]
        seen.update(_plan_key(p) for _, p in moves)
        scored = pool_map(score, [[p for _, p in moves]], 1, space.model, space.cluster)
        fits = [(n, p, s, pk) for (n, p), (s, pk) in zip(moves, scored[0] if scored else [],
                                                          strict=True) if s < float("inf")]
        results = pool_map(des_result, [p for _, p, _, _ in fits], workers, space.model,
                            space.cluster)
        cands = [Candidate(p, s, pk, r, f"move: {n}") for (n, p, s, pk), r in zip(
            fits, results, strict=True)]
        evaluated += len(cands)
        better = min(cands, key=lambda c: _rank(c.best_s, c.plan), default=None)
        if better is None or better.best_s >= best.best_s * (1 - MIN_GAIN):
            break
        log.append(f"{better.origin[6:]}: {best.best_s:.4g} s -> {better.best_s:.4g} s")
        tried.append(better)
        best = better
    bar.close()
    return best, tried, evaluated, log


# The whole search -----------------------------------------------------------------------
def _check_inputs(space: SearchSpace) -> None:
    m = space.model
    if m.position_embedding == "learned" and space.seq_len > m.max_seq_len:
        raise SpecError("--seq-len", f"{space.seq_len} exceeds the model's learned position "
                        f"table of {m.max_seq_len}")
    space.cluster.gpu.peak_tflops(space.dtype)
    if space.global_batch_size < 1 or space.seq_len < 2:
        raise SpecError("--global-batch-size/--seq-len", "must be positive (seq_len >= 2)")


def _analytic_tier(space: SearchSpace, plans: list[Plan], workers: int, progress: bool,
                   top_k: int) -> tuple[list[Candidate], int]:
    """Every plan scored by the analytic tier; the feasible ones (memory, constraints) best
    first, and how many DualPipeV plans were left out untimed. A DualPipeV plan is first
    bounded below (:func:`optimizer.scoring.screen`: its programs' makespan, which costs
    time in proportion to its micro-batches, is at least its busiest rank's work) and
    timed only where the bound does not exceed the ``top_k``-th best time of the others,
    so the top ``top_k`` are exactly those of timing every plan. Raises NoFeasiblePlan
    saying which constraint rules them out."""
    from tqdm import tqdm

    bar = tqdm(total=len(plans), desc="analytic", unit="plan", disable=not progress)
    scores = _scores(screen, plans, workers, space)
    bar.update(len(plans))
    bar.close()
    cands = [Candidate(p, s, pk) for p, (s, pk) in zip(plans, scores, strict=True)]

    def ok(c: Candidate) -> bool:
        return c.analytic_s < float("inf") and _within(space, c.peak_gib, c.analytic_s)
    bounded = [c for c in cands if ok(c) and bounds_below(space.model, space.cluster, c.plan)]
    ids = {id(c) for c in bounded}
    timed = sorted(c.analytic_s for c in cands if id(c) not in ids and ok(c))
    cutoff = _sig(timed[top_k - 1]) if len(timed) >= top_k else float("inf")
    close = [c for c in bounded if _sig(c.analytic_s) <= cutoff]  # as the ranking rounds
    for c, (s, _) in zip(close, _scores(score, [c.plan for c in close], workers, space),
                         strict=True):
        c.analytic_s = s
    left = ids - {id(c) for c in close}
    feasible = sorted((c for c in cands if id(c) not in left and ok(c)),
                      key=lambda c: _rank(c.analytic_s, c.plan))
    if not feasible:
        raise NoFeasiblePlan(_why_infeasible(space, plans, cands))
    return feasible, len(left)


def _scores(fn: Callable, plans: list[Plan], workers: int, space: SearchSpace
            ) -> list[tuple[float, float]]:
    return [s for part in pool_map(fn, chunks(plans, workers), workers, space.model,
                                   space.cluster, lambda _n: None) for s in part]


def _shortlist(space: SearchSpace, feasible: list[Candidate], top_k: int
               ) -> tuple[list[Candidate], Candidate | None]:
    """The analytic tier's top K, plus the Megatron-style baseline when it is in the space."""
    shortlist = feasible[:top_k]
    baseline_plan = megatron_heuristic(space)
    if baseline_plan is None:
        return shortlist, None
    key = _plan_key(baseline_plan)
    baseline = next((c for c in feasible if _plan_key(c.plan) == key), None)
    if baseline is not None and baseline not in shortlist:
        shortlist.append(baseline)
    return shortlist, baseline


def optimize(model: ModelSpec, cluster: ClusterSpec, global_batch_size: int, seq_len: int,
             top_k: int = 8, workers: int | None = None, progress: bool = True,
             dtype: str = "bf16", space: SearchSpace | None = None,
             deadline: float | None = None) -> SearchReport:
    """Find the fastest plans; raises NoFeasiblePlan (CLI exit 3) when none fits. ``space``
    overrides the default space (other fixed implementation choices, constraints); past
    ``deadline`` (``time.perf_counter()``) the local moves stop, saying so in the log."""
    from tqdm import tqdm

    t0 = time.perf_counter()
    space = space or SearchSpace(model, cluster, global_batch_size, seq_len, dtype)
    _check_inputs(space)
    workers = workers or os.cpu_count() or 1
    plans = list(space)
    if not plans:
        within = space.constraints.describe()
        raise NoFeasiblePlan(f"no plan divides {cluster.world_size} devices, the batch of "
                             f"{global_batch_size} and the model's heads and layers"
                             + (f" within {', '.join(within)}" if within else ""))
    feasible, screened_out = _analytic_tier(space, plans, workers, progress, top_k)
    shortlist, baseline = _shortlist(space, feasible, top_k)
    bar = tqdm(total=len(shortlist), desc="des", unit="plan", disable=not progress)
    results = pool_map(des_result, [c.plan for c in shortlist], workers, model, cluster,
                        bar.update)
    bar.close()
    for c, r in zip(shortlist, results, strict=True):
        c.des = r
    if baseline is not None:
        baseline.origin = "baseline"
    admitted = [c for c in shortlist if _admitted(space, c)]
    if not admitted:
        raise NoFeasiblePlan(f"none of the {len(shortlist)} plans simulated with the DES is "
                             f"within {', '.join(space.constraints.describe())}")
    best = min(admitted, key=lambda c: _rank(c.best_s, c.plan))
    best, tried, moved, log = _local_search(space, best,
                                            {_plan_key(c.plan) for c in shortlist}, workers,
                                            progress, deadline)
    ranked = sorted((c for c in shortlist + tried if _admitted(space, c)),
                    key=lambda c: _rank(c.best_s, c.plan))
    homogeneous, balanced, extra = _balance(space, ranked, feasible, workers) \
        if cluster.heterogeneous else (None, None, [])
    ranked = sorted(ranked + extra, key=lambda c: _rank(c.best_s, c.plan))
    return SearchReport(model.name, cluster.name, len(plans), len(feasible) + screened_out,
                        len(shortlist) + moved + len(extra), feasible, ranked, baseline,
                        lower_bound_s(space), time.perf_counter() - t0, log,
                        homogeneous, balanced, screened_out)


BALANCE_SEEDS = 3  # balanced plans the DES simulates (with their even seeds): the analytic
# tier's best of each kind (layers, micro-batches, both), then its best others
BALANCE_FAMILIES = 20  # even plans balanced with the analytic tier, per placement: the
# best of each family (replicas inside a node group, i.e. pipelines on neighbouring nodes,
# can take uneven micro-batches, so the second placement gets its own share)


def _families(feasible: list[Candidate], ranked: list[Candidate]) -> list[Candidate]:
    """The DES's best even plans, then the analytic tier's best plan of each family (TP, PP,
    CP, virtual stages, recompute, placement, micro-batch size), best first."""
    out, keys, per_placement = [], set(), Counter[str]()
    for x in ranked[:BALANCE_SEEDS] + feasible:
        p = x.plan
        key = (p.tp, p.pp, p.cp, p.vpp, p.recompute, p.recompute_modules, p.placement,
               p.micro_batch_size)
        if key in keys or p.layers_per_stage is not None \
                or p.micro_batches_per_replica is not None \
                or per_placement[str(p.placement)] >= BALANCE_FAMILIES:
            continue
        keys.add(key)
        per_placement[str(p.placement)] += 1
        out.append(x)
    return out


def _balanced_seeds(space: SearchSpace, ranked: list[Candidate], feasible: list[Candidate]
                    ) -> list[tuple[str, Plan]]:
    """(origin, plan) to simulate: the balanced plans (:func:`optimizer.balance.balanced`)
    the analytic tier ranks best, each with the even plan it came from."""
    from optimizer.balance import balanced

    m, c = space.model, space.cluster
    cost = cost_model_for(c)
    found: list[tuple[float, str, str, Plan, Plan]] = []
    for x in _families(feasible, ranked):
        for name, p in balanced(m, c, x.plan, cost, lambda q: _fits(m, c, q)):
            seconds = analytic_timing(m, c, p, cost).iteration_s
            found.append((seconds, _plan_key(p), f"balanced: {name}", p, x.plan))
    found.sort(key=lambda t: (_sig(t[0]), t[1]))
    kinds: dict[str, tuple] = {}  # the best of each kind first: the tiers may rank them apart
    for t in found:
        kinds.setdefault(t[2].split(",")[0], t)
    chosen = list(kinds.values())
    chosen += [t for t in found if t not in chosen][:max(0, BALANCE_SEEDS - len(chosen))]
    out: dict[str, tuple[str, Plan]] = {}
    for _, key, origin, p, seed in sorted(chosen, key=lambda t: (_sig(t[0]), t[1])):
        out.setdefault(_plan_key(seed), ("even seed", seed))
        out.setdefault(key, (origin, p))
    return list(out.values())


def _balance(space: SearchSpace, ranked: list[Candidate], feasible: list[Candidate],
             workers: int) -> tuple[Candidate | None, Candidate | None, list[Candidate]]:
    """On a mixed cluster: balanced plans from the best even ones (:func:`_balanced_seeds`)
    simulated with the DES, with their even seeds. Returns the best even-split plan (the
    homogeneous assumption, simulated on the real cluster), the best plan of all (the even
    one when no balanced plan beats it), and the newly simulated candidates."""
    m, c = space.model, space.cluster
    seen = {_plan_key(x.plan) for x in ranked}
    new = [(o, p) for o, p in _balanced_seeds(space, ranked, feasible)
           if _plan_key(p) not in seen and space.constraints.admits(p, m)]
    scores = pool_map(score, [[p for _, p in new]], 1, m, c)[0] if new else []
    results = pool_map(des_result, [p for _, p in new], workers, m, c)
    extra = [x for x in (Candidate(p, s, pk, r, origin) for (origin, p), (s, pk), r in zip(
        new, scores, results, strict=True))
        if _admitted(space, x)]
    even = [x for x in ranked + extra
            if x.plan.layers_per_stage is None and x.plan.micro_batches_per_replica is None]
    if not even:
        return None, None, extra
    homogeneous = min(even, key=lambda x: _rank(x.best_s, x.plan))
    best = min([x for x in extra if x.origin != "even seed"] + [homogeneous],
               key=lambda x: _rank(x.best_s, x.plan))
    return homogeneous, best, extra
