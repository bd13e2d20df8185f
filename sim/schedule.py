"""Per-stage order of forward and backward passes under each pipeline schedule.

Ops are ``("F" | "B", micro_batch, chunk)``; a rank's virtual stage for ``chunk`` is
``chunk * pp + stage``. GPipe runs every forward, then every backward; 1F1B warms up with
``pp - stage - 1`` forwards and alternates; interleaved 1F1B follows Megatron-LM: chunks
change every ``pp`` micro-batches and the warm-up is ``2 * (pp - stage - 1) + (vpp - 1) * pp``.
"""

from __future__ import annotations

from sim.plan import Plan

__all__ = ["stage_ops", "Op"]

Op = tuple[str, int, int]


def _forward(i: int, pp: int, vpp: int) -> tuple[int, int]:
    """(micro-batch, chunk) of this rank's i-th forward (Megatron's interleaved order)."""
    group, within = divmod(i, pp * vpp)
    return group * pp + within % pp, within // pp


def _backward(i: int, pp: int, vpp: int) -> tuple[int, int]:
    mb, chunk = _forward(i, pp, vpp)
    return mb, vpp - 1 - chunk


def stage_ops(plan: Plan, stage: int) -> list[Op]:
    m, pp, vpp = plan.num_microbatches, plan.pp, plan.vpp
    total = m * vpp
    if plan.schedule == "gpipe":
        return [("F", i, 0) for i in range(m)] + [("B", i, 0) for i in range(m)]
    warm = min(total, (pp - stage - 1) * (2 if vpp > 1 else 1) + (vpp - 1) * pp)
    ops: list[Op] = [("F", *_forward(i, pp, vpp)) for i in range(warm)]
    for k in range(total - warm):
        ops.append(("F", *_forward(warm + k, pp, vpp)))
        ops.append(("B", *_backward(k, pp, vpp)))
    ops += [("B", *_backward(k, pp, vpp)) for k in range(total - warm, total)]
    return ops
