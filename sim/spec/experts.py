"""The expert grid of an MoE plan (Megatron-LM's "MoE parallel folding"): attention runs on
TP x CP x DP x PP, the experts on ETP x EP x EDP x PP over the same ranks.

Within one pipeline stage the ranks are numbered as Megatron-LM numbers them, tensor-
parallel index fastest, then context-parallel, then data-parallel:
``i = t + tp * (c + cp * d)``. The expert grid cuts that numbering into blocks of
``etp * ep`` ranks: a block is one expert-parallel group of each expert-tensor-parallel
index (rank ``i`` has ETP index ``i % etp`` and EP index ``i // etp % ep``), and the ranks
holding the same expert shard (EDP) are the same position in every block. With
``etp = tp`` and ``cp = 1`` this is the plain layout where ``ep`` splits ``dp``; with
``etp = 1`` an expert-parallel group may take in the tensor-parallel ranks, so ``ep`` may
exceed ``dp`` (Qwen3-235B's published EP 32 on DP 16 x TP 2, for instance).

``ep_inner`` is how many data-parallel indices one block covers: the ``ep`` dimension of a
placement (``tp-cp-ep-dp-pp``), ``dp = ep_inner x dp_outer``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sim.errors import SpecError
from sim.spec.limits import MAX_DEVICES

if TYPE_CHECKING:
    from sim.spec.model import ModelSpec

# ``plan`` below is a sim.spec.plan.Plan (typed as Any: naming it would be an import circle).
Plan = Any

__all__ = ["check_experts", "check_experts_model", "expert_tp", "ep_inner", "is_folded",
           "experts_follow_dense",
           "check_overlap", "OVERLAPS"]

# What hides an MoE layer's dispatch and combine (Megatron-LM's options): nothing, the
# shared expert's compute (--moe-shared-expert-overlap), or another micro-batch's compute in
# merged forward/backward steps (--overlap-moe-expert-parallel-comm, "EP A2A overlap");
# or, as MegaScale-MoE runs it (no public framework does), the layer's own GEMMs inside
# the micro-batch (sim.cost.overlap).
OVERLAPS = ("none", "shared-expert", "a2a", "operator")


def expert_tp(plan: Plan) -> int:
    """The expert-tensor-parallel degree: ``etp``, or ``tp`` when unset (Megatron's default)."""
    return plan.tp if plan.etp is None else plan.etp


def ep_inner(plan: Plan) -> int:
    """Data-parallel indices one expert block (``etp x ep`` ranks) spans: 1 when a block
    fits in one tensor x context-parallel group."""
    block, inner = expert_tp(plan) * plan.ep, plan.tp * plan.cp
    return block // inner if block % inner == 0 else 1


def is_folded(plan: Plan) -> bool:
    """Whether the expert grid differs from the plain one (``ep`` splitting ``dp`` alone,
    experts on the attention's tensor-parallel group)."""
    return expert_tp(plan) != plan.tp or ep_inner(plan) != plan.ep


def experts_follow_dense(plan: Plan) -> bool:
    """Whether the ranks holding the same expert shard are the data-parallel group (``ep``
    1 on the attention's grid), so that a torch run's FSDP2 shards and reduces the experts
    with the rest of their layer; else they are sharded or reduced over the
    expert-data-parallel group."""
    return plan.ep == 1 and expert_tp(plan) == plan.tp and plan.cp == 1


def check_experts(plan: Plan) -> None:
    """``etp`` and ``ep`` against the attention grid, and ``moe_overlap``."""
    check_overlap(plan)
    etp = plan.etp
    if etp is not None and (isinstance(etp, bool) or not isinstance(etp, int)
                            or not 1 <= etp <= MAX_DEVICES):
        raise SpecError("plan.etp", f"must be null (= tp) or an integer in 1..{MAX_DEVICES:,}, "
                        f"got {etp!r}")
    e = expert_tp(plan)
    if e not in (1, plan.tp):
        raise SpecError("plan.etp", f"must be 1 or tp = {plan.tp}, got {e} (expert tensor "
                        f"parallelism between them is not simulated)")
    ranks = plan.tp * plan.cp * plan.dp
    if ranks % (e * plan.ep):
        raise SpecError("plan.ep", f"etp x ep = {e} x {plan.ep} must divide tp x cp x dp = "
                        f"{plan.tp} x {plan.cp} x {plan.dp} = {ranks} (the ranks of a "
                        f"pipeline stage hold whole expert groups)")
    block = e * plan.ep
    for inner, name in ((plan.tp * plan.cp, "tp x cp"), (plan.tp, "tp")):
        if block % inner and inner % block:
            raise SpecError("plan.ep", f"etp x ep = {block} and {name} = {inner} must divide "
                            f"one another (an expert block takes whole tensor(-and-context)-"
                            f"parallel groups, or lies within one)")
    if e != plan.tp and not plan.sequence_parallel:
        raise SpecError("plan.sequence_parallel", f"must be true when etp = {e} differs from "
                        f"tp = {plan.tp} (each rank routes its own sequence shard)")


def check_experts_model(plan: Plan, m: ModelSpec) -> None:
    """Expert parallelism and its overlap against the model."""
    if plan.ep > 1 and not m.is_moe:
        raise SpecError("plan.ep", f"must be 1 for the dense model {m.name!r}, got {plan.ep}")
    if m.is_moe and m.num_experts % plan.ep:
        raise SpecError("plan.ep", f"must divide model.num_experts: {m.num_experts} % {plan.ep} "
                        f"= {m.num_experts % plan.ep} != 0")
    if m.is_moe and plan.tp > 1 and not plan.sequence_parallel:
        raise SpecError("plan.sequence_parallel", "must be true for an MoE model with tp > 1 "
                        "(Megatron-LM's rule: its MoE layers route each rank's sequence shard)")
    if plan.moe_overlap == "shared-expert" and not m.shared_expert_ffn_hidden_size:
        raise SpecError("plan.moe_overlap", f"shared-expert needs a model with a shared expert; "
                        f"{m.name!r} has none")
    if plan.etp is not None and plan.etp != plan.tp and not m.is_moe:
        raise SpecError("plan.etp", f"is for MoE models; {m.name!r} is dense")
    if plan.moe_overlap == "a2a" and m.num_mtp_layers == 1 and plan.pp == 1:
        raise SpecError("plan.moe_overlap", "a2a with a multi-token prediction layer needs "
                        "pp > 1 (Megatron-LM's rule)")
    if plan.moe_overlap == "a2a" and m.num_mtp_layers > 1:
        raise SpecError("plan.moe_overlap", f"a2a takes at most one multi-token prediction "
                        f"layer (Megatron-LM's rule), the model has {m.num_mtp_layers}")


def _check_operator(plan: Plan) -> None:
    if plan.ep == 1:
        raise SpecError("plan.moe_overlap", "operator needs expert parallelism (ep > 1)")
    if plan.schedule in ("dualpipev", "dualpipe"):
        raise SpecError("plan.moe_overlap", f"operator with {plan.schedule} is not modelled "
                        "(the schedule takes the weight gradients out of the backward, "
                        "which operator overlap hides exchanges behind)")


def check_overlap(plan: Plan) -> None:
    """``moe_overlap`` alone and against the plan: Megatron-LM's rules for its options;
    ``operator`` needs expert parallelism and a schedule that keeps the weight gradients
    in the backward."""
    o = plan.moe_overlap
    if o not in OVERLAPS:
        raise SpecError("plan.moe_overlap", f"must be one of {', '.join(OVERLAPS)}, got {o!r}")
    if o == "shared-expert" and plan.moe_dispatcher != "alltoall":
        raise SpecError("plan.moe_overlap", f"shared-expert works with the alltoall dispatcher "
                        f"only, got {plan.moe_dispatcher}")
    if o == "operator":
        _check_operator(plan)
    if o != "a2a":
        return
    if plan.ep == 1:
        raise SpecError("plan.moe_overlap", "a2a needs expert parallelism (ep > 1)")
    if plan.moe_dispatcher == "allgather":
        raise SpecError("plan.moe_overlap", "a2a works with the alltoall or deepep dispatcher, "
                        "not allgather")
    if plan.recompute == "full":
        raise SpecError("plan.moe_overlap", "a2a does not run with full recomputation "
                        "(Megatron-LM's rule): use none or selective")
    if plan.schedule == "gpipe":
        raise SpecError("plan.moe_overlap", "a2a merges 1F1B steps: not with gpipe")
    if plan.dtype == "fp32":
        raise SpecError("plan.moe_overlap", "a2a runs with 16-bit training (bf16, fp16, fp8 "
                        "over bf16), not fp32 (Megatron-LM's rule)")
    if plan.pp > 1 and plan.schedule not in ("interleaved-1f1b", "dualpipev", "dualpipe"):
        raise SpecError("plan.moe_overlap", f"a2a with pp = {plan.pp} needs the interleaved "
                        f"schedule (vpp > 1), dualpipev or dualpipe, got {plan.schedule}")
