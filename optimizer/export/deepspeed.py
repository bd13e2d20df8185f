"""DeepSpeed 0.19.8: ``deepspeed_config.json`` for data-parallel (ZeRO 0-3) plans.

Tensor, pipeline, context, sequence and expert parallelism and activation recomputation
are set up in DeepSpeed's model code (AutoTP, ``PipelineModule``, Ulysses, ``deepspeed.moe``,
``deepspeed.checkpointing``), not in its config: plans that use them are refused, naming
the field, rather than noted in a key DeepSpeed ignores. With tp = pp = cp = 1 every rank is
a data-parallel rank, so ``deepspeed.initialize`` needs no ``mpu``: DeepSpeed takes the
data-parallel size from the world size, which is ``plan.dp``.
"""

from __future__ import annotations

from typing import Any

from sim.errors import SpecError
from sim.spec.cluster import ClusterSpec
from sim.spec.model import ModelSpec
from sim.spec.plan import Plan

__all__ = ["check", "deepspeed_config", "files"]

_IN_MODEL_CODE = (("tp", "AutoTP"), ("pp", "PipelineModule"), ("cp", "Ulysses, cp_comm a2a"),
                  ("ep", "deepspeed.moe"))


def check(plan: Plan, model: ModelSpec) -> None:
    for dim, where in _IN_MODEL_CODE:
        if getattr(plan, dim) > 1:
            raise SpecError(f"plan.{dim}", f"{getattr(plan, dim)} is not expressible in a "
                            f"DeepSpeed config (it is built in model code: {where}); export "
                            "to megatron or torchtitan")
    if plan.recompute != "none":
        raise SpecError("plan.recompute", f"{plan.recompute} is not expressible in a DeepSpeed "
                        "config (model code calls deepspeed.checkpointing)")
    if plan.dtype == "fp8":
        raise SpecError("plan.dtype", "fp8 is not expressible in a DeepSpeed config (bf16, "
                        "fp16 or fp32)")
    if plan.attention != "flash":
        raise SpecError("plan.attention", "the attention kernel is the model code's choice, "
                        "not DeepSpeed's: export plans with attention = flash")
    if not plan.reshard_after_forward:
        raise SpecError("plan.reshard_after_forward", "false is not expressible in DeepSpeed: "
                        "its ZeRO-3 gathers the weights again for the backward (use true)")
    if plan.zero_stage == 0 and plan.overlap_grad_reduce:
        raise SpecError("plan.overlap_grad_reduce", "true at ZeRO-0 is not expressible in "
                        "DeepSpeed: stage 0 reduces the gradients after backward (use "
                        "zero_stage >= 1, or overlap_grad_reduce false)")


def deepspeed_config(plan: Plan) -> dict[str, Any]:
    """The config: batch arithmetic, ZeRO, precision."""
    return {"train_batch_size": plan.global_batch_size,
            "train_micro_batch_size_per_gpu": plan.micro_batch_size,
            "gradient_accumulation_steps": plan.num_microbatches,
            "zero_optimization": {"stage": plan.zero_stage,
                                  "overlap_comm": plan.overlap_grad_reduce},
            "bf16": {"enabled": plan.dtype == "bf16"},
            "fp16": {"enabled": plan.dtype == "fp16"},
            **({"communication_data_type": plan.grad_reduce_dtype}
               if plan.grad_reduce_dtype is not None else {})}


def files(plan: Plan, model: ModelSpec, cluster: ClusterSpec) -> dict[str, str]:
    import json

    from sim.network.algorithms import nccl_env

    out = {"deepspeed_config.json": json.dumps(deepspeed_config(plan), indent=2) + "\n"}
    env = nccl_env(plan, "deepspeed")
    if env:  # the deepspeed launcher exports ./.deepspeed_env on every node
        out[".deepspeed_env"] = "".join(f"{k}={v}\n" for k, v in sorted(env.items()))
    return out
