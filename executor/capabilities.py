"""What the executor's worker can run, decided before anything is launched (torch-free, so
``trainsim execute`` and ``trainsim export --format torchrun`` refuse a plan at once, with
exit code 2, instead of after torchrun has started)."""

from __future__ import annotations

from sim.spec.model import ModelSpec
from sim.spec.plan import Plan

__all__ = ["unsupported"]


def unsupported(spec: ModelSpec, plan: Plan) -> tuple[str, str] | None:
    """(field, rule) of the first model or plan feature the worker does not run, or None."""
    if spec.qk_norm != "none":
        return "model.qk_norm", (f"{spec.qk_norm}: the executor's model has no query/key norms "
                                 "(it would run a different model than the one simulated)")
    if spec.norms_per_layer != 2:
        return "model.norms_per_layer", (f"{spec.norms_per_layer}: the executor's model has "
                                         "two norms per layer (pre-attention, pre-MLP)")
    if spec.sliding_window:
        return "model.sliding_window", ("the executor's model attends over the whole "
                                        "sequence in every layer")
    if plan.micro_batches_per_replica is not None:
        return "plan.micro_batches_per_replica", ("micro_batches_per_replica is not run by the "
                                                  "executor: every replica takes the same batch")
    if plan.cp > 1:
        return "plan.cp", "context parallelism is not run by the executor yet (simulate it)"
    if spec.is_moe and plan.tp > 1:
        return "plan.tp", "the executor runs MoE models with tp = 1 only"
    if plan.ep > 1 and plan.zero_stage > 0:
        return "plan.zero_stage", "the executor runs expert parallelism with zero_stage 0 only"
    if plan.tp > 1 and plan.dp > 1 and plan.zero_stage < 2:
        return "plan.zero_stage", ("with tp > 1 and dp > 1 the executor shards with FSDP2: "
                                   "use zero_stage 2 or 3")
    return None
