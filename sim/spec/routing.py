"""The rules of a plan's MoE routing fields: how routed tokens fall on the experts
(``moe_max_load`` or a ``moe_expert_load`` histogram) and the capacity factor that drops
what exceeds it. What they imply is computed in :mod:`sim.layout.routing`."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from sim.errors import SpecError
from sim.spec.limits import MAX_WIDTH

if TYPE_CHECKING:
    from sim.spec.model import ModelSpec

# ``plan`` below is a sim.spec.plan.Plan, which imports this module for its rules (typed
# as Any: naming Plan here would be an import circle).
Plan = Any

__all__ = ["check_routing", "check_routing_model", "routing_is_balanced", "comm_sms",
           "comm_sm_share",
           "DISPATCHERS", "DEEPEP_SMS"]

# SMs DeepEP's normal kernels take: its Buffer's default num_sms, and Megatron-LM's
# moe_deepep_num_sms default (megatron-core 0.16)
DEEPEP_SMS = 20


def comm_sms(plan: Plan) -> int:
    """SMs the expert dispatch and combine hold while running (see ``Plan.moe_comm_sms``)."""
    if plan.moe_comm_sms is not None:
        return int(plan.moe_comm_sms)
    return DEEPEP_SMS if plan.moe_dispatcher == "deepep" else 0


def comm_sm_share(plan: Plan, sm_count: float) -> float:
    """Seconds of compute lost per second of exchange run beside it: ``S / N`` of a GPU's
    ``N`` SMs held by the exchange's kernels (0 where either is unknown)."""
    sms = comm_sms(plan)
    return sms / sm_count if sms and sm_count else 0.0

# How tokens reach their experts (sim.layout.routing): Megatron-LM's all-to-all and
# all-gather token dispatchers, and DeepEP (node-deduplicated, NVLink-forwarded).
DISPATCHERS = ("alltoall", "allgather", "deepep")


def _number(field: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise SpecError(field, f"must be a finite number, got {value!r}")
    return float(value)


def check_routing(plan: Plan) -> None:
    """The routing fields alone and against the plan's expert parallelism."""
    f = _number("plan.moe_max_load", plan.moe_max_load)
    if not 1.0 <= f <= plan.ep:
        raise SpecError("plan.moe_max_load", f"tokens on the most-loaded expert-parallel rank "
                        f"over the mean must be in 1..ep = {plan.ep}, got {f:g}")
    hist = plan.moe_expert_load
    if hist is not None:
        if not isinstance(hist, tuple) or not hist or len(hist) > MAX_WIDTH:
            raise SpecError("plan.moe_expert_load", f"must be null or a list of one number a "
                            f"expert (at most {MAX_WIDTH:,}), got {str(hist)[:60]}")
        loads = [_number("plan.moe_expert_load", v) for v in hist]
        if min(loads) < 0 or sum(loads) <= 0:
            raise SpecError("plan.moe_expert_load", "tokens per expert must be >= 0 with a "
                            "positive sum")
        if f != 1.0:
            raise SpecError("plan.moe_max_load", "give moe_max_load or moe_expert_load, not "
                            "both")
    if plan.moe_dispatcher not in DISPATCHERS:
        raise SpecError("plan.moe_dispatcher", f"must be one of {', '.join(DISPATCHERS)}, got "
                        f"{plan.moe_dispatcher!r}")
    if plan.moe_dispatch_dtype not in (None, "fp8"):
        raise SpecError("plan.moe_dispatch_dtype", f"must be null (the activation dtype) or "
                        f"fp8, got {plan.moe_dispatch_dtype!r}")
    if plan.moe_dispatch_dtype is not None and plan.ep == 1:
        raise SpecError("plan.moe_dispatch_dtype", "fp8 dispatch needs expert parallelism "
                        "(ep > 1)")
    s = plan.moe_comm_sms
    if s is not None and (isinstance(s, bool) or not isinstance(s, int) or not 0 <= s <= 1024):
        raise SpecError("plan.moe_comm_sms", f"must be null or an integer in 0..1024 (SMs the "
                        f"dispatch kernels hold), got {s!r}")
    c = plan.moe_capacity_factor
    if c is not None and _number("plan.moe_capacity_factor", c) <= 0:
        raise SpecError("plan.moe_capacity_factor", f"must be > 0 (an expert's capacity over "
                        f"its balanced share of tokens) or null for dropless, got {c:g}")


def routing_is_balanced(plan: Plan) -> bool:
    """Forced balance, nothing dropped: what trainsim simulated before these fields."""
    return (plan.moe_max_load == 1.0 and plan.moe_expert_load is None
            and plan.moe_capacity_factor is None)


def check_routing_model(plan: Plan, m: ModelSpec) -> None:
    if plan.moe_dispatcher != "alltoall" and not m.is_moe:
        raise SpecError("plan.moe_dispatcher", f"is for MoE models; {m.name!r} is dense")
    if plan.moe_dispatch_dtype is not None and not m.is_moe:
        raise SpecError("plan.moe_dispatch_dtype", f"is for MoE models; {m.name!r} is dense")
    if routing_is_balanced(plan):
        return
    if not m.is_moe:
        raise SpecError("plan.moe_max_load" if plan.moe_max_load != 1.0 else
                        "plan.moe_expert_load" if plan.moe_expert_load is not None else
                        "plan.moe_capacity_factor", f"is for MoE models; {m.name!r} is dense")
    hist = plan.moe_expert_load
    if hist is not None and len(hist) != m.num_experts:
        raise SpecError("plan.moe_expert_load", f"must list model.num_experts = "
                        f"{m.num_experts} loads, got {len(hist)}")
