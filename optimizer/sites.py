"""Choose how sites synchronise over a WAN: hierarchical BSP, DiLoCo's period and payload,
streaming DiLoCo's fragments (:mod:`sim.strategies.sites`).

Without a measured loss curve for a model trained with DiLoCo across sites, the choice is
the *most synchronous* way that keeps at least ``floor`` of the single-site throughput:
BSP (flat, then hierarchical) first, then two-stage (half, then a tenth of the gradient
before the step ends), then DiLoCo and streaming DiLoCo by increasing period
``H``, the fuller payload before the compressed one (fp32, bf16, int8), the shorter overlap
(1 then 5 inner steps) before the longer. Every candidate is
ranked and kept, so a user with their own convergence figures can read the whole table.

With a loss model (``convergence``: the bundled ``text-cpu`` or a CSV of runs to a loss,
:func:`sim.strategies.accuracy.steps_over_bsp`) the choice is instead the candidate with
the least time to BSP's loss, ``steps over BSP's / share of one site's throughput``,
among those the model covers: flat and hierarchical BSP (1) and DiLoCo with fp32
pseudo-gradients within the periods the runs measured (two-stage, streaming DiLoCo and
compressed payloads were not run for real, and a period outside the runs' range would be
an extrapolation: neither is chosen).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from sim.errors import SpecError
from sim.spec.cluster import ClusterSpec
from sim.spec.model import ModelSpec
from sim.spec.plan import Plan
from sim.spec.workload import Workload
from sim.strategies.sites import (
    SiteResult,
    SiteSync,
    simulate_sites,
    site_replicas,
    site_shares,
    site_steps,
)

__all__ = ["SiteChoice", "choose_site_sync", "candidates", "balance_sites"]

PERIODS = (10, 50, 100, 500, 1000)
FRAGMENTS = (2, 4, 8, 16)
OVERLAPS = (1, 5)  # inner steps a fragment may hide behind (Streaming DiLoCo's tau)
DTYPES = ("fp32", "bf16", "int8")


def candidates() -> list[SiteSync]:
    """Every candidate, most synchronous first."""
    out = [SiteSync("flat"), SiteSync("hierarchical"), SiteSync("two-stage", fraction=0.5),
           SiteSync("two-stage", fraction=0.1)]
    for h in PERIODS:
        for dtype in DTYPES:
            out.append(SiteSync("diloco", H=h, dtype=dtype))
            out += [SiteSync("streaming-diloco", H=h, fragments=f, overlap=tau, dtype=dtype)
                    for tau in OVERLAPS for f in FRAGMENTS if f <= h]
    return out


@dataclass
class SiteChoice:
    chosen: SiteResult
    rows: list[SiteResult]  # every candidate, in the order tried
    floor: float
    met: bool  # whether the chosen one reaches the floor (by time to loss: always True)
    time_to_loss_x: dict[str, float] | None = None  # label -> multiple of one site's time
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        by = "throughput floor" if self.time_to_loss_x is None else "time to loss"
        return {"chosen": self.chosen.to_dict(), "floor": self.floor, "met": self.met,
                "by": by, "time_to_loss_x": self.time_to_loss_x, "notes": self.notes,
                "rows": [r.to_dict() for r in self.rows]}


def choose_site_sync(model: ModelSpec | Workload, cluster: ClusterSpec, plan: Plan,
                     floor: float = 0.95, fidelity: str = "analytic",
                     convergence: str | None = None, lr: float = 2e-3) -> SiteChoice:
    """The most synchronous candidate within ``floor`` of one site's throughput (else the
    fastest); with ``convergence``, the one with the least time to BSP's loss."""
    if not 0 < floor <= 1:
        raise SpecError("--floor", f"must be a fraction in (0, 1], got {floor!r}")
    if convergence is not None:
        from sim.strategies.accuracy import loss_model

        loss_model(convergence, lr)  # before any candidate runs
    steps = site_steps(model, cluster, plan, fidelity)  # shared by every candidate
    rows = [simulate_sites(model, cluster, plan, s, fidelity, steps) for s in candidates()]
    if convergence is not None:
        times = _times_to_loss(rows, convergence, lr)
        best = min(times, key=times.__getitem__)
        left = sum(r.sync.kind == "diloco" and r.sync.dtype == "fp32" for r in rows) \
            - sum(k.startswith("diloco") for k in times)
        notes = [f"chosen by time to loss (--floor {floor:g} not applied); "
                 "two-stage, streaming DiLoCo and compressed payloads not measured"]
        if left:
            notes.append(f"{left} fp32 DiLoCo period(s) left out: outside the periods or "
                         f"learning rates the runs measured (lr {lr:g})")
        from sim.strategies.accuracy import replicas_note

        notes += replicas_note(convergence, len(cluster.sites))
        return SiteChoice(next(r for r in rows if r.sync.label() == best), rows, floor, True,
                          times, notes)
    ok = [r for r in rows if r.of_single_site >= floor]
    chosen = ok[0] if ok else max(rows, key=lambda r: r.tokens_per_s)
    return SiteChoice(chosen, rows, floor, bool(ok))


def _times_to_loss(rows: list[SiteResult], convergence: str, lr: float) -> dict[str, float]:
    """Time to BSP's loss as a multiple of one site's, for the candidates the loss model
    covers (BSP, and fp32 DiLoCo within the measured periods)."""
    from sim.strategies.accuracy import steps_over_bsp

    out = {}
    for r in rows:
        s = r.sync
        if s.kind in ("flat", "hierarchical"):
            out[s.label()] = 1.0 / r.of_single_site
        elif s.kind == "diloco" and s.dtype == "fp32":
            pred = steps_over_bsp(s.H, convergence, lr)
            if not pred["extrapolated"] and not pred["diverges"]:
                out[s.label()] = pred["ratio"] / r.of_single_site
    return out


def balance_sites(model: ModelSpec | Workload, cluster: ClusterSpec, plan: Plan) -> Plan:
    """``plan`` with its micro-batches split over the sites so that the slowest site's own
    step is as short as it can be (sites of different GPUs, fabrics or sizes). A site's
    step is its slowest replica's, so each site's replicas carry at most ``k`` micro-batches
    (``pp`` at a time under interleaved 1F1B, at least ``2 pp`` under DualPipeV); with
    ``f_s(k)`` site ``s``'s analytic step at ``k`` a replica (infinite where it does not
    fit in memory), the sites are raised a unit at a time, always the one whose next step
    is the shortest, until they hold the global batch (so the slowest step is the least
    any whole split allows, ``f`` rising with ``k``); then the excess is taken back from
    the slowest sites first. The global batch is kept;
    ``micro_batches_per_replica`` says the split (None when it is even)."""
    from optimizer.balance import _micro_unit
    from sim.layout.placement import site_aware

    plan = site_aware(plan, cluster)
    held = site_replicas(cluster, plan)
    if plan.zero_stage > 1 or plan.ep > 1:
        raise SpecError("--balance", "an uneven batch split (micro_batches_per_replica) "
                        f"needs zero_stage <= 1 and ep = 1, got zero_stage={plan.zero_stage}, "
                        f"ep={plan.ep}")
    unit, least = _micro_unit(plan)
    least = -(-least // unit) * unit
    total = plan.global_batch_size // plan.micro_batch_size
    shares = site_shares(cluster, plan, held)
    ks = [least] * len(held)  # micro-batches a replica at each site, raised one unit at a time
    steps = [{least: _even_step(model, c, share, least)} for c, share in shares]
    while sum(k * len(reps) for k, reps in zip(ks, held, strict=True)) < total:
        for i, (c, share) in enumerate(shares):  # each site's next step, once
            if ks[i] + unit not in steps[i]:
                steps[i][ks[i] + unit] = _even_step(model, c, share, ks[i] + unit)
        i = min(range(len(ks)), key=lambda j: (steps[j][ks[j] + unit], j))
        if steps[i][ks[i] + unit] == math.inf:
            return plan  # no split fits every site
        ks[i] += unit
    if max(steps[i][k] for i, k in enumerate(ks)) == math.inf:
        return plan
    return _fill(plan, held, ks, steps, total, unit, least)


def _even_step(model: ModelSpec | Workload, site: ClusterSpec, share: Plan, k: int) -> float:
    """A site's analytic step with ``k`` micro-batches a replica (inf: out of memory)."""
    from sim.api import simulate

    p = dataclasses.replace(share, micro_batches_per_replica=None,
                            global_batch_size=k * share.dp * share.micro_batch_size)
    r = simulate(model, site, p)
    return r.iteration_time_s if r.fits_in_memory else float("inf")


def _fill(plan: Plan, held: list[list[int]], ks: list[int], steps: list[dict[int, float]],
          total: int, unit: int, least: int) -> Plan:
    """Every replica of site ``s`` at ``ks[s]``, then the excess over ``total`` taken back a
    unit at a time from the fullest replica of the slowest site that can give one."""
    mbr = [0] * plan.dp
    for reps, k in zip(held, ks, strict=True):
        for d in reps:
            mbr[d] = k
    excess = sum(mbr) - total
    while excess > 0:  # from the fullest replica of the slowest site that can give
        able = [i for i, reps in enumerate(held) if max(mbr[d] for d in reps) - unit >= least]
        if not able:
            return plan
        i = max(able, key=lambda j: (steps[j][max(mbr[d] for d in held[j])], -j))
        d = max(held[i], key=lambda x: (mbr[x], -x))
        mbr[d] -= unit
        excess -= unit
    if sum(mbr) != total:  # (units that do not add up to the batch: keep the plan)
        return plan
    if len(set(mbr)) == 1:
        return dataclasses.replace(plan, micro_batches_per_replica=None)
    return dataclasses.replace(plan, micro_batches_per_replica=tuple(mbr))
