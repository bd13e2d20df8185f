"""What the executor's worker can run, decided before anything is launched (torch-free, so
``trainsim execute`` and ``trainsim export --format torchrun`` refuse a plan at once, with
exit code 2, instead of after torchrun has started)."""

from __future__ import annotations

from executor.grid import grid_out_of_order
from sim.spec.experts import expert_tp
from sim.spec.model import ModelSpec
from sim.spec.plan import Plan
from sim.spec.routing import routing_is_balanced

__all__ = ["unsupported"]


def unsupported(spec: ModelSpec, plan: Plan) -> tuple[str, str] | None:
    """(field, rule) of the first model or plan feature the worker does not run, or None."""
    return _model(spec, plan) or _experts(spec, plan) or _plan(plan)


def _model(spec: ModelSpec, plan: Plan) -> tuple[str, str] | None:
    if spec.is_mla:
        return "model.kv_lora_rank", ("multi-head latent attention is simulated only: the "
                                      "executor's model builds standard attention")
    if spec.num_mtp_layers:
        return "model.num_mtp_layers", ("multi-token prediction is simulated only: the "
                                        "executor's model does not build it (set it to 0)")
    if spec.qk_norm != "none":
        return "model.qk_norm", (f"{spec.qk_norm}: the executor's model has no query/key norms "
                                 "(it would run a different model than the one simulated)")
    if spec.norms_per_layer != 2:
        return "model.norms_per_layer", (f"{spec.norms_per_layer}: the executor's model has "
                                         "two norms per layer (pre-attention, pre-MLP)")
    if spec.sliding_window:
        return "model.sliding_window", ("the executor's model attends over the whole "
                                        "sequence in every layer")
    if spec.dropout:
        return "model.dropout", "the executor's model has no dropout"
    if plan.seq_len > spec.max_seq_len:
        return "plan.seq_len", (f"{plan.seq_len} exceeds model.max_seq_len "
                                f"{spec.max_seq_len}, the longest the executor's model builds")
    return None


def _experts(spec: ModelSpec, plan: Plan) -> tuple[str, str] | None:
    if plan.moe_dispatcher != "alltoall":
        return "plan.moe_dispatcher", (f"{plan.moe_dispatcher} is simulated only: the "
                                       "executor dispatches tokens with all-to-all")
    if not routing_is_balanced(plan):
        return "plan.moe_max_load", ("routing other than forced balance (moe_max_load, "
                                     "moe_expert_load, moe_capacity_factor) is simulated only: "
                                     "the executor's router decides its own load")
    if plan.moe_dispatch_dtype is not None:
        return "plan.moe_dispatch_dtype", ("fp8 dispatch is not run by the executor: its "
                                           "all-to-alls move the activation dtype")
    if plan.moe_overlap != "none":
        return "plan.moe_overlap", ("expert all-to-all overlap is not run by the executor "
                                    "(simulate it)")
    if spec.is_moe and expert_tp(plan) > 1 and spec.linear_bias:
        return "model.linear_bias", ("experts with biases split over expert tensor "
                                     "parallelism are not run by the executor (use etp 1)")
    block = grid_out_of_order(plan) if spec.is_moe else None
    if block is not None:
        return "plan.placement", (f"puts an expert block's ranks out of order ({block}): the "
                                  "executor numbers experts by rank order within each block "
                                  "(the default tp-cp-ep-dp-pp keeps them in order)")
    if plan.ep > 1 and plan.zero_stage == 1:
        return "plan.zero_stage", ("1 with expert parallelism is not run by the executor: its "
                                   "ZeRO-1 optimizer would broadcast one rank's experts to "
                                   "ranks holding others (use 0, 2 or 3)")
    return None


def _plan(plan: Plan) -> tuple[str, str] | None:
    if plan.dtype not in ("bf16", "fp32"):
        return "plan.dtype", (f"{plan.dtype} is not run by the executor: it trains in bf16 "
                              "(mixed precision) or fp32")
    if plan.attention != "flash":
        return "plan.attention", ("standard (materialised scores) is not run by the "
                                  "executor: its attention is fused (scaled_dot_product_attention)")
    if not plan.overlap_grad_reduce:
        return "plan.overlap_grad_reduce", ("false is not run by the executor: DDP and FSDP "
                                            "always overlap the gradient reduction")
    if plan.tp_overlap:
        return "plan.tp_overlap", ("true is not run by the executor: torch's async TP needs "
                                   "CUDA symmetric memory and torch.compile (simulate it)")
    if plan.micro_batches_per_replica is not None:
        return "plan.micro_batches_per_replica", ("micro_batches_per_replica is not run by the "
                                                  "executor: every replica takes the same batch")
    if plan.grad_bytes != plan.activation_bytes:
        return "plan.grad_reduce_dtype", (f"{plan.grad_reduce_dtype} is not run by the "
                                          "executor: its DDP and FSDP reduce in the training "
                                          "dtype")
    if plan.cp > 1:
        return "plan.cp", "context parallelism is not run by the executor yet (simulate it)"
    if plan.recompute_modules is not None:
        return "plan.recompute_modules", ("recomputation by module is not run by the "
                                          "executor: its selective recomputation re-runs "
                                          "the attention core only")
    if plan.schedule == "dualpipe":
        return "plan.schedule", ("dualpipe is not run by the executor: torch's pipelining has "
                                 "no two-direction DualPipe schedule (dualpipev runs)")
    if plan.schedule == "dualpipev" and plan.dp > 1:
        return "plan.dp", ("dualpipev with data parallelism is not run by the executor: "
                           "torch 2.13's ScheduleDualPipeV trains dp > 1 to other losses than "
                           "1F1B (DDP and FSDP2 alike; use dp = 1 or simulate it)")
    if plan.tp > 1 and plan.dp > 1 and plan.zero_stage < 2:
        return "plan.zero_stage", ("with tp > 1 and dp > 1 the executor shards with FSDP2: "
                                   "use zero_stage 2 or 3")
    return None
