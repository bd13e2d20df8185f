"""Which process rank sits where in the plan's grid, without torch: the mesh's ranks and
the expert grid's blocks (:mod:`sim.spec.experts`), so that the capability check and the
groups the workers build read one definition.

torch orders every process group by rank (``new_group`` sorts its ranks), and the executor
numbers a rank's experts and its expert tensor-parallel shard by its place in its groups. A
block (the ``etp x ep`` ranks whose token counts are gathered; ETP index fastest) must
therefore list its ranks in increasing order, or tokens would reach ranks holding other
experts: :func:`grid_out_of_order` finds the plans whose placement breaks that.
"""

from __future__ import annotations

from sim.layout.placement import rank_coords
from sim.spec.experts import ep_inner, expert_tp
from sim.spec.plan import Plan

__all__ = ["logical_rank", "stage_order", "expert_blocks", "grid_out_of_order"]


def logical_rank(plan: Plan, pp: int, dp: int, cp: int, tp: int) -> int:
    """Rank at these coordinates under the plan's placement (the dp coordinate is split
    into its expert-parallel part, innermost, and the rest, as in :mod:`sim.layout.placement`)."""
    _, stride = rank_coords(plan)
    inner = ep_inner(plan)
    coords = {"pp": pp, "ep": dp % inner, "dp": dp // inner, "cp": cp, "tp": tp}
    r = sum(coords[d] * stride[d] for d in stride)
    return plan.placement[r] if isinstance(plan.placement, tuple) else r


def stage_order(plan: Plan, stage: int) -> list[int]:
    """A pipeline stage's ranks in Megatron-LM's order, ``t + tp * (c + cp * d)``."""
    return [logical_rank(plan, stage, d, c, t) for d in range(plan.dp)
            for c in range(plan.cp) for t in range(plan.tp)]


def expert_blocks(plan: Plan) -> list[list[int]]:
    """Every stage's ranks cut into blocks of ``etp x ep``, in grid order."""
    width = expert_tp(plan) * plan.ep
    return [o[b:b + width] for o in (stage_order(plan, p) for p in range(plan.pp))
            for b in range(0, len(o), width)]


def grid_out_of_order(plan: Plan) -> list[int] | None:
    """The first expert block whose ranks do not increase (None when all do)."""
    if plan.ep * expert_tp(plan) == 1:
        return None
    return next((b for b in expert_blocks(plan) if b != sorted(b)), None)
