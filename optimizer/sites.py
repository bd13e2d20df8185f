"""Choose how sites synchronise over a WAN: hierarchical BSP, DiLoCo's period and payload,
streaming DiLoCo's fragments (:mod:`sim.strategies.sites`).

Without a measured loss curve for a model trained with DiLoCo across sites, the choice is
the *most synchronous* way that keeps at least ``floor`` of the single-site throughput:
BSP (flat, then hierarchical) first, then two-stage (half, then a tenth of the gradient
before the step ends), then DiLoCo and streaming DiLoCo by increasing period
``H``, the fuller payload before the compressed one (fp32, bf16, int8), the shorter overlap
(1 then 5 inner steps) before the longer. Every candidate is
ranked and kept, so a user with their own convergence figures can read the whole table.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sim.errors import SpecError
from sim.spec.cluster import ClusterSpec
from sim.spec.model import ModelSpec
from sim.spec.plan import Plan
from sim.spec.workload import Workload
from sim.strategies.sites import SiteResult, SiteSync, simulate_sites, site_steps

__all__ = ["SiteChoice", "choose_site_sync", "candidates"]

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
    met: bool  # whether the chosen one reaches the floor

    def to_dict(self) -> dict[str, Any]:
        return {"chosen": self.chosen.to_dict(), "floor": self.floor, "met": self.met,
                "rows": [r.to_dict() for r in self.rows]}


def choose_site_sync(model: ModelSpec | Workload, cluster: ClusterSpec, plan: Plan,
                     floor: float = 0.95, fidelity: str = "analytic") -> SiteChoice:
    """The most synchronous candidate within ``floor`` of one site's throughput (else the
    fastest)."""
    if not 0 < floor <= 1:
        raise SpecError("--floor", f"must be a fraction in (0, 1], got {floor!r}")
    steps = site_steps(model, cluster, plan, fidelity)  # shared by every candidate
    rows = [simulate_sites(model, cluster, plan, s, fidelity, steps) for s in candidates()]
    ok = [r for r in rows if r.of_single_site >= floor]
    chosen = ok[0] if ok else max(rows, key=lambda r: r.tokens_per_s)
    return SiteChoice(chosen, rows, floor, bool(ok))
