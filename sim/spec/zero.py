"""The ZeRO rules of a plan: the stage, and how ZeRO-3 keeps gathered weights."""

from __future__ import annotations

from typing import Any

from sim.errors import SpecError

# ``plan`` below is a sim.spec.plan.Plan, which imports this module for its rules (typed
# as Any: naming Plan here would be an import circle).
Plan = Any

__all__ = ["check_zero", "regathers"]


def check_zero(plan: Plan) -> None:
    stage = plan.zero_stage
    if isinstance(stage, bool) or not isinstance(stage, int) or not 0 <= stage <= 3:
        raise SpecError("plan.zero_stage", f"must be 0, 1, 2 or 3, got {stage!r}")
    if not isinstance(plan.reshard_after_forward, bool):
        raise SpecError("plan.reshard_after_forward", "must be true or false, got "
                        f"{plan.reshard_after_forward!r}")
    if not plan.reshard_after_forward and stage != 3:
        raise SpecError("plan.reshard_after_forward", f"false needs zero_stage = 3 (only "
                        f"ZeRO-3 frees gathered weights after the forward), got {stage}")


def regathers(plan: Plan) -> bool:
    """Whether ZeRO-3 gathers each layer's weights again for its backward (FSDP2's
    ``reshard_after_forward``, DeepSpeed's ZeRO-3), rather than keeping them from the
    forward."""
    return plan.zero_stage == 3 and plan.reshard_after_forward
