"""How a plan splits the model's layers over pipeline stages."""

from __future__ import annotations

from dataclasses import dataclass

from sim.layout.dualpipe import chain_microbatches as dualpipe_chain_microbatches
from sim.layout.dualpipe import rank_of_stage, stages_of_rank
from sim.layout.routing import routing
from sim.spec.experts import expert_tp
from sim.spec.model import ModelSpec
from sim.spec.plan import Plan
from sim.spec.recompute import reruns_core, stops_early

__all__ = ["StageLayers", "even_split", "tp_blocks", "tp_gathers", "tp_pass",
           "virtual_stage_layers", "virtual_stage_moe", "rank_virtual_stages",
           "virtual_stage_rank", "mirrored", "dualpipe_family",
           "chain_microbatches", "first_stage", "last_stage",
           "pipeline_rank_layers", "edge_tp_collectives", "cp_exchanges"]


@dataclass(frozen=True)
class StageLayers:
    """Layers held by one pipeline rank (all its virtual chunks together)."""

    dense: int
    moe: int
    first: bool  # holds the input embedding
    last: bool  # holds the output layer and loss

    @property
    def total(self) -> int:
        return self.dense + self.moe


def even_split(layers: int, stages: int) -> tuple[int, ...] | None:
    """``layers_per_stage`` for ``layers`` over ``stages`` virtual stages as even as they go
    (the first ones one layer more); ``None`` when they divide (the default split)."""
    if layers % stages == 0:
        return None
    base, extra = divmod(layers, stages)
    return (base + 1,) * extra + (base,) * (stages - extra)


def tp_blocks(model: ModelSpec, plan: Plan, moe: bool) -> tuple[float, ...]:
    """The blocks of a layer whose tensor-parallel collectives run on the TP group, each as
    its size over one micro-batch's activation (a pair per pass: all-gather +
    reduce-scatter, or an all-reduce). A dense layer: the attention and the MLP. An MoE
    layer, as Megatron-LM runs it (sequence parallel): the attention, the shared expert
    (tensor-parallel on the attention's group), and, where the experts are on that group
    (``etp = tp``), the routed tokens: after the expert-parallel all-to-all the TP ranks
    gather each other's received tokens (top-k copies of theirs, times the hottest rank's
    load) and reduce-scatter the experts' partial outputs back. The ``allgather``
    dispatcher gathers every token of the ``etp x ep`` block instead (Megatron-LM's one
    all-gather over ``tp_ep``, here its TP part after the expert-parallel gather of
    :func:`sim.layout.routing.dispatches`: ``ep`` activations, whatever the load)."""
    if not moe:
        return (1.0, 1.0)
    blocks = (1.0, 1.0) if model.shared_expert_ffn_hidden_size else (1.0,)
    if expert_tp(plan) != plan.tp or plan.moe_dispatcher == "deepep":  # DeepEP hands
        return blocks  # every ETP rank its tokens itself (sim.layout.routing.dispatches)
    if plan.moe_dispatcher == "allgather":
        return blocks + (float(plan.ep),)
    return blocks + (model.top_k * routing(model, plan).load_factor,)


FP8_GATHER = 0.5  # an fp8 element's bytes over a 16-bit activation's


def tp_gathers(model: ModelSpec, plan: Plan, moe: bool) -> tuple[float, ...]:
    """Each of :func:`tp_blocks`' all-gathers in bytes over its 16-bit activation's. Under
    fp8 training with sequence parallelism a block that feeds a tensor-parallel linear
    layer (the attention, but MLA's; a dense MLP; a shared expert) gathers fp8: its input
    is cast on the sequence shard before the forward's gather and its output gradient
    before the backward's, as torchao's float8 tensor parallelism
    (``Float8ColwiseParallel``, ``Float8RowwiseParallel``, ``PrepareFloat8ModuleInput``:
    torchtitan's) and Transformer Engine's quantized ``gather_along_first_dim``
    (Megatron-Core's) run them. The reduce-scatters stay 16-bit, as do the routed tokens'
    gathers (the token dispatcher's own, before the grouped GEMMs)."""
    return _gathers(model, plan, moe, len(tp_blocks(model, plan, moe)))


def _gathers(model: ModelSpec, plan: Plan, moe: bool, blocks: int) -> tuple[float, ...]:
    """:func:`tp_gathers` for a layer of ``blocks`` blocks."""
    if plan.dtype != "fp8" or not plan.sequence_parallel:
        return (1.0,) * blocks
    linear = 2 if not moe or model.shared_expert_ffn_hidden_size else 1
    return tuple(FP8_GATHER if i < linear and (i or not model.is_mla) else 1.0
                 for i in range(blocks))


def tp_pass(model: ModelSpec, plan: Plan, moe: bool, replay: bool = False
            ) -> list[tuple[str, float]]:
    """One pass's tensor-parallel collectives over a layer, as (kind, activation scale): an
    all-reduce, or an all-gather and a reduce-scatter, per block (:func:`tp_blocks`; the
    all-gathers under fp8 in :func:`tp_gathers`' bytes). The
    ``replay`` of a recomputation that stops early (:func:`sim.spec.recompute.stops_early`)
    leaves out the layer's last reduction (block 1), whose output is only added to the
    residual stream: the MLP's, or an MoE layer's shared expert's where it runs after the
    routed experts (the executor's order); DeepEP's path (NeMo Automodel's) runs the
    shared expert first and stops before its combine instead
    (:func:`sim.layout.routing.replay_dispatches`)."""
    if plan.tp == 1:
        return []
    kinds = ("all_gather", "reduce_scatter") if plan.sequence_parallel else ("all_reduce",)
    blocks = tp_blocks(model, plan, moe)  # once: an MoE layer's reads the routing
    ops = [(kind, scale * (fp8 if kind == "all_gather" else 1.0))
           for scale, fp8 in zip(blocks, _gathers(model, plan, moe, len(blocks)), strict=True)
           for kind in kinds]
    if replay and stops_early(plan) and (not moe or (model.shared_expert_ffn_hidden_size
                                                     and plan.moe_dispatcher != "deepep")):
        del ops[2 * len(kinds) - 1]
    return ops


def mirrored(plan: Plan) -> bool:
    """DualPipe: both directions, each stage held twice (:mod:`sim.layout.dualpipe`)."""
    return plan.schedule == "dualpipe"


def dualpipe_family(plan: Plan) -> bool:
    """DualPipeV or DualPipe: run as DeepSeek's programs (:mod:`sim.layout.dualpipe`)."""
    return plan.schedule in ("dualpipev", "dualpipe")


def chain_microbatches(plan: Plan) -> int:
    """Micro-batches each virtual stage runs a step: all of them, or under DualPipe the
    half that enter at its chain's end."""
    return dualpipe_chain_microbatches(plan.num_microbatches, mirrored(plan))


def _chain(plan: Plan) -> int:
    """Virtual stages a micro-batch runs through."""
    return plan.pp if mirrored(plan) else plan.pp * plan.vpp


def first_stage(plan: Plan, vs: int) -> bool:
    """Whether virtual stage ``vs`` starts a micro-batch's chain (holds the embedding)."""
    return vs % _chain(plan) == 0


def last_stage(plan: Plan, vs: int) -> bool:
    """Whether virtual stage ``vs`` ends a micro-batch's chain (the output layer, loss)."""
    return vs % _chain(plan) == _chain(plan) - 1


def virtual_stage_layers(plan: Plan, model: ModelSpec) -> list[int]:
    """Layer count of each of the pp*vpp virtual stages, in model order (under DualPipe
    each of the pp stages twice: chain 0's, then chain 1's)."""
    stages = _chain(plan)
    counts = list(plan.layers_per_stage) if plan.layers_per_stage is not None else \
        [model.num_layers // stages] * stages
    return counts * 2 if mirrored(plan) else counts


def _mtp_flags(model: ModelSpec) -> list[bool]:
    """The multi-token prediction modules' layers (like the model's last), which run after
    the last layer on the last stage, as in Megatron-LM."""
    return [model.moe_layer(model.num_layers - 1)] * model.num_mtp_layers


def virtual_stage_moe(plan: Plan, model: ModelSpec) -> list[list[bool]]:
    """Per virtual stage, in model order, each of its layers' MoE flag (the last stage's
    multi-token prediction layers at its end)."""
    out, start = [], 0
    counts = virtual_stage_layers(plan, model)
    for n in counts[:plan.pp] if mirrored(plan) else counts:
        out.append([model.moe_layer(i) for i in range(start, start + n)])
        start += n
    out[-1] += _mtp_flags(model)
    return out * 2 if mirrored(plan) else out


def rank_virtual_stages(plan: Plan, rank: int) -> list[int]:
    """The virtual stages pipeline rank ``rank`` holds, chunk by chunk: every ``pp``-th
    (Megatron-LM's interleaving), or under ``dualpipev`` a V (``rank`` and ``2 pp - 1 -
    rank``, :mod:`sim.layout.dualpipe`), or under ``dualpipe`` one of each direction's
    chain, the one it starts first."""
    if dualpipe_family(plan):
        return list(stages_of_rank(plan.pp, rank, mirrored(plan)))
    return [rank + c * plan.pp for c in range(plan.vpp)]


def virtual_stage_rank(plan: Plan, vs: int) -> int:
    if dualpipe_family(plan):
        return rank_of_stage(plan.pp, vs, mirrored(plan))
    return vs % plan.pp


def pipeline_rank_layers(plan: Plan, model: ModelSpec) -> list[StageLayers]:
    """For each pipeline rank: its dense and MoE layer counts (its virtual stages:
    :func:`rank_virtual_stages`; multi-token prediction layers on the last stage's)."""
    dense = [0] * plan.pp
    moe = [0] * plan.pp
    for k, flags in enumerate(virtual_stage_moe(plan, model)):
        for is_moe in flags:
            if is_moe:
                moe[virtual_stage_rank(plan, k)] += 1
            else:
                dense[virtual_stage_rank(plan, k)] += 1
    ends = [(any(first_stage(plan, vs) for vs in rank_virtual_stages(plan, r)),
             any(last_stage(plan, vs) for vs in rank_virtual_stages(plan, r)))
            for r in range(plan.pp)]
    return [StageLayers(dense[r], moe[r], *ends[r]) for r in range(plan.pp)]


def edge_tp_collectives(model: ModelSpec, plan: Plan, first: bool, last: bool
                        ) -> list[tuple[str, str, float]]:
    """``(pass, collective, bytes)`` per micro-batch of the tensor-parallel collectives of
    the input embedding (``first``) and of the output layer and loss (``last``), as
    Megatron-LM runs them: the vocab-parallel embedding all-reduces its output in the
    forward (with sequence parallelism reduce-scatters it, and all-gathers its gradient in
    the backward); the output layer all-reduces its input gradient in the backward (with
    sequence parallelism it all-gathers its input in the forward and reduce-scatters the
    gradient); the vocab-parallel cross-entropy all-reduces three fp32 values per token
    (max logit, target logit, sum of exponentials). Each multi-token prediction module's
    output layer and loss do the same again. None of them is recomputed."""
    if plan.tp == 1:
        return []
    full = plan.local_tokens * model.hidden_size * plan.activation_bytes
    sp = plan.sequence_parallel
    out: list[tuple[str, str, float]] = []
    if first:
        out.append(("F", "reduce_scatter" if sp else "all_reduce", full))
        out += [("B", "all_gather", full)] if sp else []
    for _ in range(1 + model.num_mtp_layers if last else 0):  # one per output layer
        out += [("F", "all_gather", full)] if sp else []
        out += [("F", "all_reduce", 4.0 * plan.local_tokens)] * 3
        out.append(("B", "reduce_scatter" if sp else "all_reduce", full))
    return out


def cp_exchanges(model: ModelSpec, plan: Plan, backward: bool) -> list[tuple[str, float]]:
    """``(collective, bytes)`` of one layer's context-parallel exchange in one forward or
    backward pass of a micro-batch, as Megatron-LM / Transformer Engine run
    ``plan.cp_comm``; a backward that re-runs the attention core, where the exchange
    lives (full recomputation, or selective with ``core_attn``), first repeats the
    forward's:

    * ``p2p``: the ring passes every rank's K and V chunk round the group, ``cp - 1`` hops
      to the next rank in rank order (``kv_ring``: one ring, NCCL send/receive, so across
      nodes each hop waits for the one that leaves its node through one NIC), beside the
      attention core; the backward passes K and V and their gradients (twice the bytes).
    * ``allgather``: K and V are all-gathered before the attention core, which waits; the
      backward gathers them again and reduce-scatters their gradients.
    * ``a2a`` (Ulysses): the local sequence's Q, K and V, all heads, are exchanged for the
      whole sequence of ``1/cp`` of the heads before the core, and its output back after;
      the backward does the same with the gradients."""
    if plan.cp == 1:
        return []
    again = backward and reruns_core(plan)
    ring = plan.cp * plan.local_tokens * (model.kv_dim + model.v_dim) / plan.tp \
        * plan.activation_bytes  # every rank's K and V chunk
    if plan.cp_comm == "p2p":  # one ring of all the pass's chunks
        return [("kv_ring", ring * ((2 if backward else 1) + (1 if again else 0)))]
    if plan.cp_comm == "allgather":
        forward = [("all_gather", ring)]
        return forward * again + forward + [("reduce_scatter", ring)] if backward else forward
    local = plan.local_tokens * plan.activation_bytes / plan.tp
    forward = [("all_to_all", local * (model.q_dim + model.kv_dim + model.v_dim)),
               ("all_to_all", local * model.o_dim)]
    return forward * (1 + again) if backward else forward
