"""What a plan's MoE routing does to one expert-parallel group: the load of its
most-loaded rank, the tokens a capacity factor drops, and how unequal the experts' loads
are.

Experts sit on expert-parallel ranks in contiguous blocks of ``num_experts / ep``, as in
Megatron-LM and torchtitan. A rank's expert GEMMs (one grouped GEMM) take time in
proportion to the tokens it holds, so the most-loaded rank sets the expert phase of every
rank of the group, which waits for it in the next all-to-all; that rank also receives the
most all-to-all bytes and keeps the most routed-token activations. Both tiers therefore
scale the expert GEMMs, the all-to-all bytes and the routed activations by
:attr:`Routing.load_factor` (every rank's all-to-all is as long as the hottest rank's, so
the DES's link bytes of an imbalanced all-to-all are an upper bound).

* ``moe_max_load = f``: the hottest rank's experts get ``f`` times the mean, the others
  share the rest evenly; ``1`` (the default) is forced balance, exactly what trainsim
  simulated before this option.
* ``moe_expert_load``: the tokens each expert gets (any scale), e.g. measured from a router.
* ``moe_capacity_factor = c``: an expert keeps at most ``c`` times its balanced share and
  drops the rest (Megatron-LM's ``--moe-expert-capacity-factor``); null is dropless.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from sim.spec.model import ModelSpec
from sim.spec.plan import Plan
from sim.spec.routing import routing_is_balanced

__all__ = ["Routing", "routing", "gini", "ep_bytes"]


@dataclass(frozen=True)
class Routing:
    """One MoE layer's routing on one expert-parallel group, relative to forced balance."""

    load_factor: float  # tokens the most-loaded rank processes / the balanced share
    max_load: float  # the same before dropping
    dropped_fraction: float  # share of routed (token, expert) pairs dropped
    gini: float  # Gini coefficient of tokens per expert (0: all equal)

    def to_dict(self) -> dict[str, float]:
        return {"load_factor": self.load_factor, "max_load": self.max_load,
                "dropped_fraction": self.dropped_fraction, "gini": self.gini}


BALANCED = Routing(1.0, 1.0, 0.0, 0.0)


def gini(loads: tuple[float, ...]) -> float:
    """Gini coefficient: the mean absolute difference of all pairs over twice the mean."""
    xs, n = sorted(loads), len(loads)
    total = sum(xs)
    if n < 2 or total == 0:
        return 0.0
    weighted = sum((2 * i - n + 1) * x for i, x in enumerate(xs))
    return weighted / (n * total)


def _expert_loads(experts: int, ep: int, max_load: float, hist: tuple[float, ...] | None
                  ) -> tuple[float, ...]:
    """Tokens per expert relative to the balanced share (mean 1)."""
    if hist is not None:
        mean = sum(hist) / len(hist)
        return tuple(x / mean for x in hist)
    per_rank = experts // ep
    rest = (ep - max_load) / (ep - 1) if ep > 1 else 1.0
    return (max_load,) * per_rank + (rest,) * (experts - per_rank)


def routing(m: ModelSpec, plan: Plan) -> Routing:
    """The routing of ``plan`` on ``m``'s MoE layers (forced balance for a dense model)."""
    if not m.is_moe or routing_is_balanced(plan):
        return BALANCED
    return _routing(m.num_experts, plan.ep, plan.moe_max_load, plan.moe_expert_load,
                    plan.moe_capacity_factor)


@functools.lru_cache(maxsize=256)
def _routing(experts: int, ep: int, max_load: float, hist: tuple[float, ...] | None,
             capacity: float | None) -> Routing:
    loads = _expert_loads(experts, ep, max_load, hist)
    kept = loads if capacity is None else tuple(min(x, capacity) for x in loads)
    per_rank = experts // ep

    def hottest(xs: tuple[float, ...]) -> float:
        return max(sum(xs[r * per_rank:(r + 1) * per_rank]) / per_rank for r in range(ep))

    return Routing(hottest(kept), hottest(loads), 1.0 - sum(kept) / sum(loads), gini(loads))


def ep_bytes(m: ModelSpec, plan: Plan) -> float:
    """Bytes one rank sends in one all-to-all of one MoE layer for one micro-batch (the
    dispatch; the combine returns as many): its tokens (split by TP with sequence
    parallelism) times top-k hidden vectors, times the hottest rank's load factor."""
    tokens = plan.local_tokens / (plan.tp if plan.sequence_parallel else 1)
    return tokens * m.top_k * m.hidden_size * plan.activation_bytes * routing(m, plan).load_factor
