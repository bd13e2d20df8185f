"""Per-stage order of forward and backward passes under each pipeline schedule, and the
pipeline exchanges between them.

Ops are ``("F" | "B", micro_batch, chunk)``; a rank's virtual stage for ``chunk`` is
``chunk * pp + stage``. DualPipeV (:mod:`sim.layout.dualpipe`) places them in a V
(:func:`sim.layout.stages.rank_virtual_stages`) and adds ``W``, a deferred weight
gradient: :func:`stage_ops` marks the backward before it ``B`` as any, the DES program
(:func:`stage_program`) ``I`` (the input gradient alone). GPipe runs every forward, then
every backward; 1F1B warms up with ``pp - stage - 1`` forwards and alternates;
interleaved 1F1B follows Megatron-LM: chunks change every ``pp`` micro-batches and the
warm-up is ``2 * (pp - stage - 1) + (vpp - 1) * pp``.

:func:`stage_program` puts Megatron-LM's blocking, batched point-to-point calls
(``megatron/core/pipeline_parallel/schedules.py`` without ``overlap_p2p_comm``) between the
ops. A call sends what the ops before it produced and receives what the ops after it need,
all in one ``batch_isend_irecv``, and returns when every transfer in it is done; a transfer
starts once its sender and its receiver have both entered their calls. Interleaved 1F1B
makes one call after each warm-up forward, after each steady-state forward + backward
pair and after each cool-down backward. Non-interleaved 1F1B receives and sends on their
own around warm-up forwards and cool-down backwards, and in the steady state sends a
forward's output together with receiving the next backward's gradient, and a backward's
gradient together with receiving the next forward's input. GPipe (not a Megatron-LM
schedule) makes its calls as interleaved 1F1B's warm-up and cool-down do.
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.layout.dualpipe import Msg, Pass, rank_calls
from sim.layout.stages import (
    dualpipe_family,
    first_stage,
    last_stage,
    mirrored,
    rank_virtual_stages,
)
from sim.spec.plan import Plan

__all__ = ["stage_ops", "stage_program", "warmup_forwards", "Op", "Msg", "Exchange"]

Op = tuple[str, int, int]


@dataclass(frozen=True)
class Exchange:
    """One blocking batched call: messages this rank sends and receives."""

    sends: tuple[Msg, ...]
    recvs: tuple[Msg, ...]


def _forward(i: int, pp: int, vpp: int) -> tuple[int, int]:
    """(micro-batch, chunk) of this rank's i-th forward (Megatron's interleaved order)."""
    group, within = divmod(i, pp * vpp)
    return group * pp + within % pp, within // pp


def _backward(i: int, pp: int, vpp: int) -> tuple[int, int]:
    mb, chunk = _forward(i, pp, vpp)
    return mb, vpp - 1 - chunk


def warmup_forwards(plan: Plan, stage: int) -> int:
    """Forwards a stage runs before its first backward."""
    total = plan.num_microbatches * plan.vpp
    if plan.schedule == "gpipe":
        return total
    if dualpipe_family(plan):
        ops = stage_ops(plan, stage)
        return next(i for i, op in enumerate(ops) if op[0] == "B")
    pp, vpp = plan.pp, plan.vpp
    # all-to-all overlap merges a forward with a backward: Megatron-LM warms up one more
    # forward so that the pair never holds one micro-batch's two passes
    extra = 1 if plan.moe_overlap == "a2a" and vpp > 1 else 0
    return min(total, (pp - stage - 1) * (2 if vpp > 1 else 1) + (vpp - 1) * pp + extra)


def stage_ops(plan: Plan, stage: int) -> list[Op]:
    """The stage's passes in order; under ``dualpipev`` also ``W``, a deferred weight
    gradient (:mod:`sim.layout.dualpipe`)."""
    pp, vpp = plan.pp, plan.vpp
    total = plan.num_microbatches * vpp
    if dualpipe_family(plan):  # the program's, a deferred backward as any
        return [("B" if op[0] == "I" else op[0], op[1], op[2])
                for op in _dualpipev_program(plan, stage) if not isinstance(op, Exchange)]
    if plan.schedule == "gpipe":
        return [("F", i, 0) for i in range(total)] + [("B", i, 0) for i in range(total)]
    warm = warmup_forwards(plan, stage)
    ops: list[Op] = [("F", *_forward(i, pp, vpp)) for i in range(warm)]
    for k in range(total - warm):
        ops.append(("F", *_forward(warm + k, pp, vpp)))
        ops.append(("B", *_backward(k, pp, vpp)))
    ops += [("B", *_backward(k, pp, vpp)) for k in range(total - warm, total)]
    return ops


def _vs(plan: Plan, stage: int, op: Op) -> int:
    return rank_virtual_stages(plan, stage)[op[2]]


def op_inputs(plan: Plan, stage: int, op: Op) -> tuple[Msg, ...]:
    """What ``op`` receives from another stage: a forward its input activation (unless it is
    the first virtual stage), a backward its output gradient (unless the last)."""
    vs = _vs(plan, stage, op)
    if op[0] == "F":
        return (("F", op[1], vs),) if not first_stage(plan, vs) else ()
    return (("B", op[1], vs),) if not last_stage(plan, vs) else ()


def op_outputs(plan: Plan, stage: int, op: Op) -> tuple[Msg, ...]:
    vs = _vs(plan, stage, op)
    if op[0] == "F":
        return (("F", op[1], vs + 1),) if not last_stage(plan, vs) else ()
    return (("B", op[1], vs - 1),) if not first_stage(plan, vs) else ()


def _steps(plan: Plan, stage: int) -> tuple[list[list[Op]], list[list[Op]], list[list[Op]]]:
    """The ops in the steps between calls: warm-up forwards, steady-state forward + backward
    pairs, cool-down backwards."""
    ops, warm = stage_ops(plan, stage), warmup_forwards(plan, stage)
    pairs = len(ops) // 2 - warm
    steady = [ops[warm + 2 * k: warm + 2 * k + 2] for k in range(pairs)]
    return [[o] for o in ops[:warm]], steady, [[o] for o in ops[warm + 2 * pairs:]]


def stage_program(plan: Plan, stage: int) -> list[Op | Exchange]:
    """The stage's ops with Megatron-LM's point-to-point calls between them (module doc)."""
    if dualpipe_family(plan):
        return _dualpipev_program(plan, stage)
    if plan.pp == 1:
        return list(stage_ops(plan, stage))
    if plan.vpp > 1 or plan.schedule == "gpipe":
        return _batched_program(plan, stage)
    return _one_f_one_b_program(plan, stage)


def _dualpipev_program(plan: Plan, stage: int) -> list[Op | Exchange]:
    """DualPipe(V)'s passes with the reference's batched calls between them
    (:func:`sim.layout.dualpipe.rank_calls`); a backward whose weight gradient waits is
    ``I`` (the input gradient), the weight gradient ``W``. Under DualPipe a chunk's
    micro-batches are those of its chain (half of them)."""
    chunk = {vs: c for c, vs in enumerate(rank_virtual_stages(plan, stage))}
    out: list[Op | Exchange] = []
    for item in rank_calls(plan.pp, plan.num_microbatches, stage, mirrored(plan)):
        if not isinstance(item, Pass):
            out.append(Exchange(*item))
        elif item.kind == "FB":
            out += [("F", item.mb, chunk[item.stage]), ("B", item.mb2, chunk[item.stage2])]
        else:
            out.append(("I" if item.deferred else item.kind, item.mb, chunk[item.stage]))
    return out


def _inputs(plan: Plan, stage: int, ops: list[Op]) -> tuple[Msg, ...]:
    return tuple(m for op in ops for m in op_inputs(plan, stage, op))


def _outputs(plan: Plan, stage: int, ops: list[Op]) -> tuple[Msg, ...]:
    return tuple(m for op in ops for m in op_outputs(plan, stage, op))


def _emit(out: list[Op | Exchange], sends: tuple[Msg, ...], recvs: tuple[Msg, ...]) -> None:
    if sends or recvs:
        out.append(Exchange(sends, recvs))


def _batched_program(plan: Plan, stage: int) -> list[Op | Exchange]:
    warm, steady, cool = _steps(plan, stage)
    steps = warm + steady + cool
    out: list[Op | Exchange] = []
    _emit(out, (), _inputs(plan, stage, steps[0]))
    for s, step in enumerate(steps):
        out += step
        sends = _outputs(plan, stage, step)
        nxt = _inputs(plan, stage, steps[s + 1]) if s + 1 < len(steps) else ()
        if s == len(warm) - 1 and not steady:  # every micro-batch in the warm-up
            _emit(out, sends, ())
            _emit(out, (), nxt)
        else:
            _emit(out, sends, nxt)
    return out


def _one_f_one_b_program(plan: Plan, stage: int) -> list[Op | Exchange]:
    warm, steady, cool = _steps(plan, stage)
    out: list[Op | Exchange] = []
    for (op,) in warm:  # recv_forward, forward, send_forward
        _emit(out, (), op_inputs(plan, stage, op))
        out.append(op)
        _emit(out, op_outputs(plan, stage, op), ())
    if steady:
        _emit(out, (), op_inputs(plan, stage, steady[0][0]))
    for i, (f, b) in enumerate(steady):
        out.append(f)
        _emit(out, op_outputs(plan, stage, f), op_inputs(plan, stage, b))
        out.append(b)
        nxt = op_inputs(plan, stage, steady[i + 1][0]) if i + 1 < len(steady) else ()
        _emit(out, op_outputs(plan, stage, b), nxt)
    for (op,) in cool:  # recv_backward, backward, send_backward
        _emit(out, (), op_inputs(plan, stage, op))
        out.append(op)
        _emit(out, op_outputs(plan, stage, op), ())
    return out
