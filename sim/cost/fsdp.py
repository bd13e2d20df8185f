"""FSDP2's host-side work around a ZeRO-3 unit's collectives, from ``trainsim profile fsdp``
rows (:mod:`executor.fsdp_profile`): the copies into and out of the collectives' buffers,
the division and accumulation of the reduced gradients, and the hooks around each unit.

A ``fsdp-units`` row times a root and ``n`` child units, every one of ``P`` parameters, all
sharded by FSDP2 over ``dp`` ranks (forward; backward); ``fsdp-plain`` the same modules
unwrapped. Less the plain modules' work and the collectives FSDP2 issued (each unit
gathered in the forward and again in the backward, its gradients reduce-scattered once,
timed by the same cost model's measured fit, as the tiers time theirs), what remains is
``root + (n + 1) * unit(P)``; two child counts at each size separate ``unit(P)`` from the
root's own cost, which is per micro-batch whatever the root holds. The cost model adds
``unit`` to each layer of a ZeRO-3 plan and ``root + unit`` to its output head
(:func:`sim.cost.compute.layer_time`, :func:`sim.cost.compute.logits_time`). Without a
measured collective fit for the group the rows cannot be split and are not used. (The
analytic tier charges ZeRO-3's collectives as one per kind over all of a rank's
parameters, the DES per layer without the root's: ``docs/guide/profiling.md``.)
"""

from __future__ import annotations

import statistics
from bisect import bisect_left
from dataclasses import dataclass

from sim.cost.costmodel import Cost, CostModel
from sim.spec.plan import Plan

__all__ = ["FsdpFit", "fsdp_fit"]

Rows = dict[tuple[float, ...], tuple[float, float]]  # (params, units, dp) -> (fwd, bwd)


@dataclass(frozen=True)
class FsdpFit:
    """One data-parallel degree's FSDP2 costs: per unit, at each measured size, and the
    root's own, (forward, backward) seconds."""

    params: tuple[float, ...]
    unit: tuple[Cost, ...]
    root: Cost

    def unit_s(self, params: float) -> tuple[Cost, bool]:
        """``unit`` at ``params``, linear between the measured sizes and held at the ends;
        and whether it was held."""
        ps = self.params
        if params <= ps[0] or params >= ps[-1]:
            end = 0 if params <= ps[0] else -1
            return self.unit[end], params != ps[end]
        i = bisect_left(ps, params)
        w = (params - ps[i - 1]) / (ps[i] - ps[i - 1])
        (f0, b0), (f1, b1) = self.unit[i - 1], self.unit[i]
        return (f0 + w * (f1 - f0), b0 + w * (b1 - b0)), False


def _residual(cm: CostModel, dtype: str, point: tuple[float, ...], units: tuple[float, float],
              plain: tuple[float, float], scale: float) -> Cost | None:
    """(forward, backward) seconds of one row beyond its plain twin and its collectives."""
    params, n, dp = point
    plan = Plan(global_batch_size=int(dp), seq_len=1, micro_batch_size=1, dp=int(dp),
                zero_stage=3, dtype=dtype)
    gather = cm.collective("all_gather", int(dp), False, params * plan.activation_bytes)
    reduce = cm.collective("reduce_scatter", int(dp), False, params * plan.grad_bytes)
    if gather is None or reduce is None:
        return None
    count = n + 1  # the children and the root
    return ((units[0] - plain[0] - count * gather) * scale,
            (units[1] - plain[1] - count * (gather + reduce)) * scale)


def fsdp_fit(cm: CostModel, dtype: str, units: Rows, plain: Rows, scale: float
             ) -> dict[int, FsdpFit]:
    """Per data-parallel degree, the fit of every size measured with two child counts (its
    ``plain`` twin too); ``cm`` times the collectives; ``scale``: the profile's compute
    scale (a calibration's). Units cost at least nothing, and so does the root."""
    over: dict[int, dict[float, dict[float, Cost]]] = {}
    for point, times in units.items():
        if point not in plain:
            continue
        r = _residual(cm, dtype, point, times, plain[point], scale)
        if r is not None:
            params, n, dp = point
            over.setdefault(int(dp), {}).setdefault(params, {})[n] = r
    out = {}
    for dp, sizes in over.items():
        fits = []
        for params, by_n in sorted(sizes.items()):
            if len(by_n) < 2:
                continue
            (n0, a), (n1, b) = sorted(by_n.items())[:2]
            unit = tuple(max(0.0, (b[i] - a[i]) / (n1 - n0)) for i in (0, 1))
            root = tuple(max(0.0, a[i] - (n0 + 1) * unit[i]) for i in (0, 1))
            fits.append((params, (unit[0], unit[1]), (root[0], root[1])))
        if fits:
            out[dp] = FsdpFit(tuple(p for p, _, _ in fits), tuple(u for _, u, _ in fits),
                              (statistics.median(r[0] for _, _, r in fits),
                               statistics.median(r[1] for _, _, r in fits)))
    return out
