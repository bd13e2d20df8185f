"""Which modules of a layer selective recomputation re-runs (Megatron-LM's
``--recompute-modules`` under ``--recompute-granularity selective``): what each one saves
is in :mod:`sim.layout.memory`, what it costs in :mod:`sim.cost.compute`."""

from __future__ import annotations

from typing import Any

from sim.errors import SpecError

# ``plan`` and ``model`` below are sim.spec.plan.Plan and sim.spec.model.ModelSpec (typed
# as Any: plan.py imports this module for its rules).
Plan = Any

__all__ = ["MODULES", "REPLAYS", "recomputed", "reruns_core", "recomputed_norms",
           "stops_early", "check_recompute", "check_recompute_model", "order_modules"]

# Megatron-LM's names. core_attn: the attention core; layernorm: the two norms (their
# outputs, the QKV and MLP inputs, are not kept); mlp: a dense layer's MLP; moe_act: the
# routed experts' activation function (its output, the down projection's input, is not
# kept); shared_experts: an MoE layer's shared expert.
MODULES = ("core_attn", "layernorm", "mlp", "moe_act", "shared_experts")
# how full recomputation replays a layer: the whole forward (Megatron-LM's checkpoint
# function; torchtitan 0.3.0 passes early_stop=False), or torch's non-reentrant checkpoint
# with its default early stop, which ends the replay once the last tensor the backward
# needs is recomputed (what follows it, only added to the residual stream, is not re-run)
REPLAYS = ("whole", "early-stop")
_NOT_MODELLED = {"moe": "the whole MoE layer, whose recomputation replays the dispatch",
                 "mla_up_proj": "MLA's up-projections"}


def order_modules(plan: Plan) -> None:
    """Put a plan's known modules in :data:`MODULES` order (a list in any order is the same
    plan; unknown names are left for :func:`check_recompute` to refuse)."""
    mods = plan.recompute_modules
    if isinstance(mods, list | tuple) and all(m in MODULES for m in mods):
        object.__setattr__(plan, "recompute_modules", tuple(sorted(mods, key=MODULES.index)))


def recomputed(plan: Plan) -> frozenset[str]:
    """The modules a backward re-runs under selective recomputation (the attention core
    when the plan names none); empty otherwise (full recomputation re-runs the layer)."""
    if plan.recompute != "selective":
        return frozenset()
    return frozenset(plan.recompute_modules or ("core_attn",))


def reruns_core(plan: Plan) -> bool:
    """Whether a backward re-runs the attention core (and context parallelism's exchange,
    which lives in it): full recomputation, or selective with ``core_attn``."""
    return plan.recompute == "full" or "core_attn" in recomputed(plan)


def stops_early(plan: Plan) -> bool:
    """Whether full recomputation's replay stops early: a layer's last tensor-parallel
    reduction (the MLP's, or an MoE layer's shared expert's) and DeepEP's combine (whose
    tokens were weighted and un-permuted before it: NeMo Automodel's and Megatron-LM's
    flex dispatcher) are not re-run; with the ``alltoall`` and ``allgather`` dispatchers
    the un-permute after the combine keeps its indices, so the combine is."""
    return plan.recompute == "full" and plan.recompute_replay == "early-stop"


def recomputed_norms(model: Any, plan: Plan, moe: bool) -> int:
    """Norms of a layer that ``layernorm`` re-runs, whose outputs are then not kept.
    Megatron-LM re-runs only norms that stand alone: with Transformer Engine's layer spec
    (what flash attention exports to) a norm feeding one linear layer is fused into it and
    keeps its output either way, which leaves an MoE layer's pre-MLP norm (the router and
    the experts share its output) and MLA's input norm; with the local spec (standard
    attention) both norms stand alone (megatron/core/models/gpt/gpt_layer_specs.py)."""
    if "layernorm" not in recomputed(plan):
        return 0
    if plan.attention != "flash":
        return 2
    return int(moe) + int(model.is_mla)


def check_recompute(plan: Plan) -> None:
    if plan.recompute_replay not in REPLAYS:
        raise SpecError("plan.recompute_replay", f"must be one of {', '.join(REPLAYS)}, got "
                        f"{plan.recompute_replay!r}")
    if plan.recompute_replay != "whole" and plan.recompute != "full":
        raise SpecError("plan.recompute_replay", f"{plan.recompute_replay} needs recompute = "
                        f"full (it is how a whole layer's replay ends), got recompute = "
                        f"{plan.recompute}")
    mods, name = plan.recompute_modules, "plan.recompute_modules"
    if mods is None:
        return
    if not isinstance(mods, tuple) or not mods or any(not isinstance(m, str) for m in mods):
        raise SpecError(name, f"must be null or a non-empty list of module names, got {mods!r}")
    for m in mods:
        if m in _NOT_MODELLED:
            raise SpecError(name, f"{m} is not modelled ({_NOT_MODELLED[m]}): choose "
                            f"from {', '.join(MODULES)}")
        if m not in MODULES:
            raise SpecError(name, f"unknown module {m!r} (choose from {', '.join(MODULES)})")
    if len(set(mods)) != len(mods):
        raise SpecError(name, f"names a module twice: {list(mods)}")
    if plan.recompute != "selective":
        raise SpecError(name, f"needs recompute = selective (modules are what selective "
                        f"recomputation re-runs), got recompute = {plan.recompute}")
    if "shared_experts" in mods and plan.moe_overlap == "shared-expert":
        raise SpecError(name, "shared_experts cannot be re-run with moe_overlap = "
                        "shared-expert (Megatron-LM refuses the pair: the overlap needs the "
                        "shared expert's forward where it is)")
    if plan.tp > 1 and {"mlp", "shared_experts"} & set(mods):
        raise SpecError(name, "mlp and shared_experts with tp > 1 are not modelled (their "
                        "re-run repeats the MLP's tensor-parallel collectives, which "
                        "trainsim does not charge): use tp = 1, or other modules")


def check_recompute_model(plan: Plan, model: Any) -> None:
    mods = set(plan.recompute_modules or ())
    needs = {"moe_act": (model.is_moe, "an MoE model"),
             "shared_experts": (model.shared_expert_ffn_hidden_size > 0,
                                "MoE layers with a shared expert"),
             "mlp": (model.num_layers > model.num_moe_layers, "dense (non-MoE) layers")}
    for m, (ok, what) in needs.items():
        if m in mods and not ok:
            raise SpecError("plan.recompute_modules", f"{m} needs {what}; {model.name} has "
                            "none")
