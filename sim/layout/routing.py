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
from math import comb

from sim.spec.experts import expert_tp
from sim.spec.model import ModelSpec
from sim.spec.plan import Plan
from sim.spec.recompute import stops_early
from sim.spec.routing import routing_is_balanced

__all__ = ["Routing", "routing", "gini", "ep_bytes", "expected_nodes", "dispatches",
           "replay_dispatches",
           "dispatch_scale", "FP8_GROUP"]

FP8_GROUP = 128  # channels sharing one fp32 scale in an fp8 dispatch (DeepEP's)


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


def _touched(pool: int, hit: int, k: int) -> float:
    """P(at least one of ``k`` experts drawn from ``pool`` falls among ``hit`` of them)."""
    return 1.0 - comb(pool - hit, k) / comb(pool, k)


@functools.lru_cache(maxsize=256)
def _expected_nodes(experts: int, k: int, groups: int, per_token: int, nodes: int) -> float:
    if nodes <= 1:
        return 1.0
    if groups == 0 or per_token == groups or (groups % nodes and nodes % groups):
        return nodes * _touched(experts, experts // nodes, k)
    pool = per_token * experts // groups  # the chosen groups' experts
    if nodes % groups == 0:  # a group spans nodes / groups nodes
        return nodes * per_token / groups * _touched(pool, experts // nodes, k)
    own = groups // nodes  # whole groups on each node
    p = sum(comb(own, a) * comb(groups - own, per_token - a) / comb(groups, per_token)
            * _touched(pool, a * experts // groups, k)
            for a in range(1, min(own, per_token) + 1))
    return nodes * p


def expected_nodes(m: ModelSpec, nodes: int) -> float:
    """Distinct nodes a token's top-k experts sit on, on average, when the expert-parallel
    group spans ``nodes`` nodes with the experts split evenly: routing draws the token's
    ``expert_groups_per_token`` groups, then its experts from them, uniformly (DeepSeek's
    node-limited routing caps the nodes; unlimited, the experts are any ``top_k`` of all).
    Exact for groups that are whole on a node or nodes whole in a group; other splits are
    counted as unlimited (an upper bound)."""
    return _expected_nodes(m.num_experts, m.top_k, m.expert_groups,
                           m.expert_groups_per_token, nodes)


def dispatch_scale(plan: Plan, forward: bool = True) -> float:
    """Bytes of a dispatched element over the activation dtype's: with ``fp8`` dispatch the
    forward sends 1 byte and an fp32 scale per 128 channels (DeepEP's), else 1."""
    if plan.moe_dispatch_dtype != "fp8" or not forward:
        return 1.0
    return (1.0 + 4.0 / FP8_GROUP) / plan.activation_bytes


def dispatches(m: ModelSpec, plan: Plan, nodes: int, forward: bool = True
               ) -> list[list[tuple[str, float]]]:
    """The collectives of one dispatch and of one combine of an MoE layer for one
    micro-batch, as ``[(kind, bytes), ...]`` that run at once, for the plan's dispatcher
    over an expert-parallel group spanning ``nodes`` nodes:

    * ``alltoall``: one all-to-all of :func:`ep_bytes` each way (Megatron-LM's default);
    * ``allgather``: every rank gathers the whole group's tokens (dispatch) and
      reduce-scatters the experts' outputs back (combine), whatever top-k: cheaper than the
      all-to-all when ``top_k`` is large against ``ep``;
    * ``deepep``: a token crosses to each node holding one of its experts once, to the rank
      of the sender's local index (``dispatch_rdma``, ``ep_bytes x expected_nodes /
      top_k``), which forwards it over NVLink to the experts' ranks (``dispatch_nvl``); the
      two parts are pipelined, so they run at once. With the experts on the TP group
      (``etp > 1``) Megatron-LM's DeepEP dispatch spans the ``etp x ep`` ranks and hands
      each token to every ETP rank of its experts (``etp`` copies over NVLink), with no TP
      collective after it (:func:`sim.layout.stages.tp_blocks`).

    ``forward``: the forward pass's (its dispatch in ``plan.moe_dispatch_dtype``); the
    backward's exchanges (the combine's gradient out, the dispatch's back) stay 16-bit."""
    k = dispatch_scale(plan, forward)
    if plan.moe_dispatcher == "allgather":
        tokens = plan.local_tokens / (plan.tp if plan.sequence_parallel else 1)
        whole = plan.ep * tokens * m.hidden_size * plan.activation_bytes
        return [[("all_gather", whole * k)], [("reduce_scatter", whole)]]
    size = ep_bytes(m, plan)
    if plan.moe_dispatcher == "deepep":
        copies = expert_tp(plan)  # each ETP rank of an expert gets the token (over NVLink)

        def parts(scale: float) -> list[tuple[str, float]]:
            return [("dispatch_rdma", size * scale * expected_nodes(m, nodes) / m.top_k),
                    ("dispatch_nvl", size * scale * copies)]
        return [parts(k), parts(1.0)]
    return [[("all_to_all", size * k)], [("all_to_all", size)]]


def replay_dispatches(m: ModelSpec, plan: Plan, nodes: int) -> list[list[tuple[str, float]]]:
    """The exchanges of full recomputation's replay of an MoE layer: the forward's
    (:func:`dispatches`), less DeepEP's combine when the replay stops early
    (:func:`sim.spec.recompute.stops_early`)."""
    ways = dispatches(m, plan, nodes, True)
    return ways[:1] if stops_early(plan) and plan.moe_dispatcher == "deepep" else ways
