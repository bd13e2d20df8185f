"""Links that fail during a multi-step synchronisation run (``--fail-link NAME@SECONDS``,
the time counted from the run's start).

- Parameter-server and gossip strategies move their pushes, pulls and exchanges as flows
  on the topology: at its time each link fails on the DES's network, the flows on it are
  re-routed (:func:`sim.network.failures.install_failures`), and when one has no path left
  the run stalls there (its rates count up to the stall; the result says so).
- All-reduce strategies (BSP, local SGD, DiLoCo, two-stage) time their reductions with the
  one-step tier: from the first failure on (every failing link at once, even those that
  fail later), BSP's exposed reduction is the one-step DES tier's with those links failed
  from the start (and no straggler: the DES applies those itself), and every whole
  all-reduce (averages, the
  two stages, a compressed one) is scaled by the ratio of that tier's data-parallel
  communication with and without the failure. A reduction that cannot complete on the
  remaining links stalls the run.
"""

from __future__ import annotations

import math
from typing import Any

from sim.errors import SpecError
from sim.network.workers import SyncSetup
from sim.spec.faults import Faults
from sim.spec.sync import architecture, as_bsp
from sim.spec.workload import Workload

__all__ = ["after_failure"]


def _dp_total(result: Any) -> float:
    dp = result.communication.get("dp", {})
    return float(dp.get("exposed_s", 0.0)) + float(dp.get("overlapped_s", 0.0))


def after_failure(s: SyncSetup, model: Any, cluster: Any, plan: Any, faults: Any, tier: Any,
                  failures: tuple, fidelity: str) -> None:
    """Attach ``failures`` to ``s``; for the all-reduce strategies, their costs once the
    first link has failed."""
    if fidelity != "des":
        raise SpecError("--fail-link", "links failing during a run need the des tier (the "
                        "closed forms assume an intact network)")
    s.failures = tuple(failures)
    s.fail_at = min(f.time_s for f in failures)
    if architecture(plan) == "ps" or plan.sync.kind == "gossip":
        return  # flows on the topology: re-routed by the DES itself
    if isinstance(model, Workload):
        raise SpecError("--fail-link", "a workload graph's reductions come from the analytic "
                        "tier, which has no failed links: use a parameter-server or gossip "
                        "strategy, or a transformer spec")
    from sim.api import simulate

    # the failed links alone, from the start (stragglers are the DES's already)
    at_start = Faults(failures=tuple((n, 0.0) for n, _ in faults.failures))
    broken = simulate(model, cluster, as_bsp(plan), "des", faults=at_start)
    if not math.isfinite(broken.iteration_time_s):
        s.after = {"stalled": 1.0}
        s.notes.append(f"the reduction cannot complete once {_names(failures)} failed: the "
                       f"run stalls at {s.fail_at:g} s")
        return
    before, after = _dp_total(tier), _dp_total(broken)
    ratio = after / before if before > 0 else 1.0
    exposed = broken.breakdown.get("dp", 0.0)
    if plan.compression.kind != "none":  # as before the failure: at most the whole one
        exposed = min(exposed, s.allreduce_s * ratio)
    s.after = {"exposed_s": exposed,
               "allreduce_s": s.allreduce_s * ratio, "average_s": s.average_s * ratio,
               "stage1_s": s.stage1_s * ratio, "stage2_s": s.stage2_s * ratio}
    s.notes.append(f"from {s.fail_at:g} s ({_names(failures)} failed) the data-parallel "
                   f"reduction takes {ratio:.3g}x as long (BSP exposes "
                   f"{s.after['exposed_s'] * 1e3:.3g} ms a step, was {s.exposed_s * 1e3:.3g})")


def _names(failures: tuple) -> str:
    return ", ".join(f.name for f in failures)
