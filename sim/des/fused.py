"""Exchanges fused with the GEMMs beside them (:mod:`sim.cost.overlap`: MegaScale-MoE's
operator overlap, torch's async TP) as the DES runs them: each exchange as flows while its
GEMM computes, then ready independent compute while it still runs."""

from __future__ import annotations

from functools import partial
from typing import cast

import simpy

from sim.cost.overlap import Step, held
from sim.des.comm import Collectives
from sim.des.context import Context, Proc, Unit

__all__ = ["fused"]


def _stamp(env: simpy.Environment, flag: simpy.Event, _event: simpy.Event) -> None:
    flag.succeed(env.now)  # when the exchange ended


def fused(x: Context, comm: Collectives, u: Unit, kind: str, steps: list[Step], tag: tuple,
          name: str, share: float = 1.0) -> Proc:
    """A pass's fused exchanges (:mod:`sim.cost.overlap`) on unit ``u``: each runs beside
    the GEMM fused with it and is waited for after it; compute that needs none of the
    exchanges still to come runs in those waits from the step that readies it, the rest
    after the last; ``share`` of each GEMM runs beside its exchange, the rest after it.
    Returns the seconds of exchange that ran beside compute (none on a device that cannot
    overlap: the compute, then the exchanges)."""
    if x.core is not None:
        yield from x.compute(u, held(steps), name)
        for j, (parts, _, _) in enumerate(steps):
            yield from comm.blocking_all(u, kind, list(parts), tag + (j,))
        return 0.0
    beside = ready = 0.0
    for j, (parts, gemm, fill) in enumerate(steps):
        t0, flag = x.env.now, x.env.event()
        done = simpy.AllOf(x.env, [comm.collective(u, kind, coll, size, tag + (j, coll))
                                   for coll, size in parts])
        # a plain event for the race below: a condition inside another loses its own
        # callbacks when the outer one fires first (simpy)
        done.callbacks.append(partial(_stamp, x.env, flag))
        yield from x.compute(u, share * gemm, f"{name} (fused)")
        ready += fill
        if not flag.triggered and ready > 0:
            t1 = x.env.now
            yield from x.wait(u, "compute", simpy.AnyOf(
                x.env, [flag, x.env.timeout(ready * x.scale[u])]), f"{name} (beside {kind})")
            ready = max(0.0, ready - (x.env.now - t1) / x.scale[u])
        computed = x.env.now
        yield from x.wait(u, kind, done, f"{kind} (fused)")
        ended = cast(float, flag.value)
        x.acct[u].comm_total[kind] += ended - t0
        beside += min(ended, computed) - t0
        if share < 1.0:
            yield from x.compute(u, (1.0 - share) * gemm, f"{name} (fused, after)")
    yield from x.compute(u, ready, name)
    return beside
