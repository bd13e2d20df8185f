"""The collectives one training step issues on one rank: kind, group, count and bytes.

This is the simulator's account of a step's communication, written out op by op so that it
can be checked against what a real run issues (``trainsim compare``). Sizes are full buffers
(the gathered output of an all-gather, the unreduced input of a reduce-scatter), as
nccl-tests reports them. The conventions are Megatron-LM's and torch's, named per entry:

- TP (per layer and micro-batch): 2 all-reduces forward and 2 backward, or with sequence
  parallelism an all-gather and a reduce-scatter in each of those places; full recompute
  replays the forward ones in backward. The vocab-parallel embedding reduces its output
  (forward), the vocab-parallel output layer its input gradient (backward), and the
  vocab-parallel cross-entropy all-reduces three per-token values (max, sum of exponentials,
  target logit) in fp32. With sequence parallelism each norm weight's gradient is all-reduced
  once per step.
- DP: gradient all-reduce (ZeRO-1/2: reduce-scatter) per bucket, once per step unless ZeRO-2
  (every micro-batch); ZeRO-1/2 gather the updated weights; ZeRO-3 gathers each layer
  forward and backward (forward only when ``reshard_after_forward`` is false) and
  reduce-scatters its gradient every micro-batch, and does the same
  for the embedding/output parameters (one more unit).
- PP: one activation send forward and one gradient receive backward per micro-batch and
  stage boundary on the first stage (the mirror on later stages); with tied embeddings the
  first and last stage all-reduce the embedding gradient (Megatron's embedding group).
- EP: two all-to-alls (dispatch, combine) forward and two backward per MoE layer and
  micro-batch. With the experts on the TP group (``etp = tp > 1``) an MoE layer's TP pair
  moves the routed tokens (:func:`sim.layout.stages.tp_blocks`).

Two :class:`Conventions` name where the accounts differ: :data:`TORCH`, what the executor's
torch run issues (checked against real runs), and :data:`SIMULATED`, what the discrete-event
tier issues (a test checks the DES against it for every test plan):

- pipeline transfers: torch sends each boundary tensor whole; the DES follows Megatron-LM's
  scatter/gather (without sequence parallelism each TP rank sends 1/tp and the TP group
  all-gathers the received tensor);
- gradient buckets: torch's even split of the dense parameters, plus one reduction of the
  expert ones; the DES closes a bucket at the first layer boundary past the bucket size,
  dense and expert gradients of a bucket reduced together, each chunk's rest at its end;
- context parallelism: the DES's exchanges (:func:`sim.layout.stages.cp_exchanges`: the
  K/V ring, all-gather or all-to-all of the plan's ``cp_comm``); the executor runs no CP;
- ZeRO-2/3: torch's FSDP2 gathers each unit (a layer, the rest of a chunk) and
  reduce-scatters its gradient every micro-batch (ZeRO-3 gathers it again for backward
  unless ``reshard_after_forward`` is false),
  but under a pipeline schedule keeps it gathered after each backward and reduces once,
  after the last (:func:`_fsdp_rounds`); the DES follows Megatron-LM's distributed
  optimizer (ZeRO-2: buckets every micro-batch, one gather of the updated weights);
- ZeRO with experts: the DES gathers expert weights over the expert-data-parallel group;
  torch's FSDP2 too, unless the experts sit on the data-parallel group
  (:func:`sim.spec.experts.experts_follow_dense`), where they are part of their layer;
- MoE metadata: torch all-gathers each rank's per-expert token counts over the expert
  block (``etp x ep`` ranks: the ``ep`` group when ``etp`` is 1, ``tp`` when ``ep`` is,
  else ``tp_ep``), and with sequence parallelism all-reduces the router's weight gradient
  as a norm's; FSDP2 reduces those every micro-batch; the DES leaves them out (small);
- full recompute: both follow ``plan.recompute_replay`` (the executor passes torch's
  ``early_stop``): a replay that stops early leaves out the layer's last TP reduction
  (:func:`sim.layout.stages.tp_pass`);
- not simulated by the DES (small): the sequence-parallel norm-gradient all-reduces, and
  ZeRO-3's gathers and reduce-scatters of the embedding and output parameters.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Any

from sim.layout.memory import chunk_edge_params, layer_rank_params, mirror_bytes, rank_params
from sim.layout.routing import dispatch_scale, ep_bytes
from sim.layout.schedule import stage_ops
from sim.layout.stages import (
    StageLayers,
    chain_microbatches,
    cp_exchanges,
    first_stage,
    last_stage,
    mirrored,
    pipeline_rank_layers,
    rank_virtual_stages,
    tp_pass,
    virtual_stage_moe,
)
from sim.spec.experts import expert_tp, experts_follow_dense
from sim.spec.model import ModelSpec
from sim.spec.plan import Plan, replica_plan
from sim.spec.recompute import stops_early
from sim.spec.zero import regathers

__all__ = ["dp_bucket_params", "chunk_bucket_params", "layer_buckets", "rank_buckets",
           "expected_collectives", "compare_inventory", "Conventions", "TORCH", "SIMULATED"]


def dp_bucket_params(plan: Plan) -> float:
    """Parameters per data-parallel gradient bucket: Megatron-LM's DDP bucket size."""
    return max(40e6, 1e6 * plan.dp)


def chunk_bucket_params(plan: Plan) -> float:
    """Parameters at which a bucket closes inside a chunk's backward: DDP's bucket, or none
    (the chunk's gradients reduced at the end of its backward) without overlap."""
    return dp_bucket_params(plan) if plan.overlap_grad_reduce else math.inf


FP32 = 4


@dataclass(frozen=True)
class Conventions:
    """Where two accounts of one step differ (see the module docstring)."""

    name: str
    p2p_scatter_gather: bool  # TP ranks send 1/tp of a boundary tensor and all-gather it
    layer_buckets: bool  # buckets close at layer boundaries; expert grads in each bucket
    context_parallel: bool  # CP K/V ring all-gathers
    expert_recompute: bool  # full recompute replays the forward all-to-alls
    sp_norm_grads: bool  # SP: norm and router weight gradients all-reduced
    zero3_edges: bool  # ZeRO-3 gathers/reduce-scatters the embedding and output too
    expert_counts: bool  # MoE: per-expert token counts all-gathered over the expert block


TORCH = Conventions("torch", False, False, False, True, True, True, True)
SIMULATED = Conventions("des", True, True, True, True, False, False, False)


class _Tally:
    def __init__(self) -> None:
        self.count: Counter[tuple[str, str]] = Counter()
        self.bytes: dict[tuple[str, str], float] = {}

    def add(self, group: str, kind: str, size_bytes: float, times: int = 1) -> None:
        if times > 0 and size_bytes > 0:
            self.count[(group, kind)] += times
            key = (group, kind)
            self.bytes[key] = self.bytes.get(key, 0.0) + size_bytes * times

    def remove(self, group: str, kind: str, size_bytes: float, times: int) -> None:
        """Take back ``times`` of what :meth:`add` counted."""
        if times > 0 and size_bytes > 0:
            self.count[(group, kind)] -= times
            self.bytes[(group, kind)] -= size_bytes * times

    def rows(self) -> list[dict[str, Any]]:
        return [{"group": g, "kind": k, "count": self.count[(g, k)],
                 "bytes": int(round(self.bytes[(g, k)]))} for g, k in sorted(self.count)]


def _tp(t: _Tally, m: ModelSpec, p: Plan, st: StageLayers, conv: Conventions) -> None:
    layers, first, last = st.total, st.first, st.last
    n = chain_microbatches(p)
    act = p.local_tokens * m.hidden_size * p.activation_bytes
    passes = 3 if p.recompute == "full" else 2  # forward, backward (and the replay)
    kinds = ("all_gather", "reduce_scatter") if p.sequence_parallel else ("all_reduce",)
    # each block of a layer, each pass (sim.layout.stages.tp_pass: an MoE layer's differ)
    for count, moe in ((st.dense, False), (st.moe, True)):
        for kind, scale in tp_pass(m, p, moe) if count else ():
            t.add("tp", kind, act * scale, count * passes * n)
    if stops_early(p):  # the replay leaves out a layer's last reduction (the MLP's, or an
        # MoE layer's shared expert's): sim.layout.stages.tp_pass
        shared_last = m.shared_expert_ffn_hidden_size and p.moe_dispatcher != "deepep"
        ending = st.dense + (st.moe if shared_last else 0)
        t.remove("tp", kinds[-1], act, ending * n)
    if first:  # embedding: forward reduce (SP: a reduce-scatter, gathered in backward)
        for kind in kinds:
            t.add("tp", kind, act, n)
    if last:  # output layer: backward reduce of its input gradient (SP: forward gather too)
        for kind in kinds:
            t.add("tp", kind, act, n)
        t.add("tp", "all_reduce", p.local_tokens * FP32, 3 * n)  # vocab-parallel loss
    if p.sequence_parallel and conv.sp_norm_grads:  # norm and router weights see a
        norms = 2 * layers + (1 if last else 0)  # sequence shard: their gradients are summed
        # FSDP2 reduces them with its own, every micro-batch unless pipelined
        times = n if p.zero_stage >= 2 and p.dp > 1 and p.pp == 1 else 1
        t.add("tp", "all_reduce", m.hidden_size * p.activation_bytes, norms * times)
        t.add("tp", "all_reduce", m.num_experts * m.hidden_size * p.activation_bytes,
              st.moe * times)


def _fsdp_rounds(p: Plan, pp_rank: int, chunk: int) -> tuple[int, int]:
    """(all-gathers, reduce-scatters) of each FSDP2 unit of one chunk in a step, as torch
    runs it. Without a pipeline every micro-batch gathers the unit forward (ZeRO-3: and
    backward again) and reduce-scatters its gradient. torch's pipeline schedules keep a
    unit gathered after each backward and reduce once after the last: under ZeRO-3 the
    unit is gathered for the chunk's first pass and after each forward (which reshards)."""
    n = chain_microbatches(p)
    if p.pp == 1:
        return (2 * n if regathers(p) else n), n
    if not regathers(p):  # kept from the first forward to the last backward
        return 1, 1
    kinds = [op[0] for op in stage_ops(p, pp_rank) if op[2] == chunk]
    return sum(i == 0 or kinds[i - 1] == "F" for i in range(len(kinds))), 1


def _fsdp(t: _Tally, m: ModelSpec, p: Plan, pp_rank: int, conv: Conventions) -> None:
    """FSDP2 units (ZeRO-2/3): each layer (its experts apart, over the expert-data-parallel
    group, unless they follow the dense parameters), and the rest of each chunk."""
    moe_dense, moe_expert = layer_rank_params(m, p, True)
    dense_layer = sum(layer_rank_params(m, p, False))
    apart = not experts_follow_dense(p)
    flags = virtual_stage_moe(p, m)
    st = pipeline_rank_layers(p, m)[pp_rank]
    edges = rank_params(m, p, st)[0] - dense_layer * st.dense - moe_dense * st.moe
    for chunk, vs in enumerate(rank_virtual_stages(p, pp_rank)):
        gathers, reduces = _fsdp_rounds(p, pp_rank, chunk)
        units = [("dp", moe_dense + (0 if apart else moe_expert) if f else dense_layer)
                 for f in flags[vs]]
        units += [("edp", moe_expert)] * sum(flags[vs]) if apart and p.expert_replicas > 1 \
            else []
        rest = edges if p.vpp == 1 else chunk_edge_params(m, p, vs)
        units += [("dp", rest)] if rest > 0 and conv.zero3_edges else []
        for group, params in units:
            t.add(group, "all_gather", params * p.activation_bytes, gathers)
            t.add(group, "reduce_scatter", params * p.grad_bytes, reduces)


def _dp(t: _Tally, m: ModelSpec, p: Plan, st: StageLayers, pp_rank: int,
        conv: Conventions) -> None:
    """Torch's account: FSDP2 units (ZeRO-2/3), or DDP's even buckets of the dense
    gradients and one expert reduction."""
    if p.dp * p.cp == 1:
        return
    if p.zero_stage >= 2:
        _fsdp(t, m, p, pp_rank, conv)
        return
    dense, expert = rank_params(m, p, st)
    coll = "all_reduce" if p.zero_stage == 0 else "reduce_scatter"
    buckets = max(1, math.ceil(dense / dp_bucket_params(p)))
    for _ in range(buckets):
        t.add("dp", coll, dense * p.grad_bytes / buckets)
    if p.zero_stage == 1:
        t.add("dp", "all_gather", dense * p.activation_bytes)
    if expert and p.expert_replicas > 1:
        t.add("edp", coll, expert * p.grad_bytes)


def _dp_pair(t: _Tally, p: Plan, coll: str, dense: float, expert: float, times: int) -> None:
    """One collective over the data-parallel group (dense parameters) and one over the
    expert-data-parallel group (expert parameters), where those groups have ranks."""
    width = p.activation_bytes if coll == "all_gather" else p.grad_bytes
    if p.dp * p.cp > 1:
        t.add("dp", coll, dense * width, times)
    if p.expert_replicas > 1:
        t.add("edp", coll, expert * width, times)


def layer_buckets(m: ModelSpec, p: Plan, pp_rank: int) -> list[tuple[float, float]]:
    """(dense, expert) parameters of each gradient bucket of one reduction round: per
    chunk, layers in backward order until a bucket is full, the chunk's rest (with its
    embedding or output parameters) at its end; without overlap one bucket of all."""
    return rank_buckets(m, p)[pp_rank]


def rank_buckets(m: ModelSpec, p: Plan) -> list[list[tuple[float, float]]]:
    """:func:`layer_buckets` of every pipeline rank."""
    if not p.overlap_grad_reduce and p.zero_stage < 2:
        return [[rank_params(m, p, st)] for st in pipeline_rank_layers(p, m)]
    return [[b for chunk in rank for b in chunk] for rank in chunk_buckets(m, p)]


def chunk_buckets(m: ModelSpec, p: Plan) -> list[list[list[tuple[float, float]]]]:
    """Per pipeline rank, per chunk (virtual stage) it holds, the chunk's gradient buckets
    in the order its backward fills them (its last is the rest, with its embedding or
    output parameters)."""
    cap, flags = chunk_bucket_params(p), virtual_stage_moe(p, m)
    layer = {moe: layer_rank_params(m, p, moe) for moe in {f for fs in flags for f in fs}}
    edge = {vs: chunk_edge_params(m, p, vs) for vs in range(len(flags))
            if first_stage(p, vs) or last_stage(p, vs)}
    out: list[list[list[tuple[float, float]]]] = []
    for r in range(p.pp):
        chunks = []
        for vs in rank_virtual_stages(p, r):
            buckets, dense, expert = [], 0.0, 0.0
            for moe in reversed(flags[vs]):
                d, e = layer[moe]
                dense, expert = dense + d, expert + e
                if dense + expert >= cap:
                    buckets.append((dense, expert))
                    dense = expert = 0.0
            buckets.append((dense + edge.get(vs, 0.0), expert))
            chunks.append([(d, e) for d, e in buckets if d + e > 0])
        out.append(chunks)
    return out


def _dp_simulated(t: _Tally, m: ModelSpec, p: Plan, pp_rank: int) -> None:
    """The DES's account: layer-granular buckets; ZeRO-3 per layer of every chunk."""
    n = chain_microbatches(p)
    if p.zero_stage == 3:
        flags = virtual_stage_moe(p, m)
        for moe in (f for vs in rank_virtual_stages(p, pp_rank) for f in flags[vs]):
            dense, expert = layer_rank_params(m, p, moe)
            _dp_pair(t, p, "all_gather", dense, expert, (2 if regathers(p) else 1) * n)
            _dp_pair(t, p, "reduce_scatter", dense, expert, n)
        return
    coll = "all_reduce" if p.zero_stage == 0 else "reduce_scatter"
    for dense, expert in layer_buckets(m, p, pp_rank):
        _dp_pair(t, p, coll, dense, expert, n if p.zero_stage == 2 else 1)
    if p.zero_stage in (1, 2):
        _dp_pair(t, p, "all_gather", *rank_params(m, p, pipeline_rank_layers(p, m)[pp_rank]),
                 1)


def _pp(t: _Tally, m: ModelSpec, p: Plan, pp_rank: int, conv: Conventions) -> None:
    st = pipeline_rank_layers(p, m)[pp_rank]
    full = p.local_tokens * m.hidden_size * p.activation_bytes
    boundary = full / p.tp if conv.p2p_scatter_gather else \
        p.micro_batch_size * p.seq_len / p.cp * m.hidden_size * p.activation_bytes \
        / (p.tp if p.sequence_parallel else 1)
    # Each chunk sends its output forward (unless last) and its input gradient back
    # (unless first), and receives as many.
    mine = rank_virtual_stages(p, pp_rank)  # a neighbour on this rank (dualpipev's turn)
    per_mb = sum((not last_stage(p, vs) and vs + 1 not in mine)
                 + (not first_stage(p, vs) and vs - 1 not in mine) for vs in mine)
    t.add("pp", "send", boundary, per_mb * chain_microbatches(p))
    t.add("pp", "recv", boundary, per_mb * chain_microbatches(p))
    if conv.p2p_scatter_gather and p.tp > 1 and not p.sequence_parallel:
        t.add("tp", "all_gather", full, per_mb * chain_microbatches(p))  # the scatter/gather
    if mirrored(p):  # DualPipe: the mirror rank's copy of the same layers, after the DP
        t.add("mirror", "all_reduce", mirror_bytes(m, p, st))  # reduction
    if m.tied_embeddings and st.first != st.last:  # FSDP2: each rank's shard
        shards = p.dp if p.zero_stage >= 2 and not conv.layer_buckets else 1
        t.add("embedding", "all_reduce",
              m.vocab_size * m.hidden_size / p.tp / shards * p.activation_bytes)


def _expert_counts(t: _Tally, m: ModelSpec, p: Plan, st: StageLayers) -> None:
    """Each MoE layer's forward (and its replay under full recomputation) all-gathers every
    rank's per-expert token counts (int64) over its expert block, ``etp x ep`` ranks
    (Megatron-LM's ``tp_ep`` group); the group is the expert-parallel one when ``etp`` is
    1, the tensor-parallel one when ``ep`` is."""
    etp = expert_tp(p)
    if not st.moe or etp * p.ep == 1:
        return
    group = "ep" if etp == 1 else "tp" if p.ep == 1 else "tp_ep"
    forwards = 2 if p.recompute == "full" else 1
    t.add(group, "all_gather", etp * p.ep * m.num_experts * 8,
          forwards * st.moe * chain_microbatches(p))


def _ep_cp(t: _Tally, m: ModelSpec, p: Plan, st: StageLayers, conv: Conventions) -> None:
    n = chain_microbatches(p)
    if conv.expert_counts:
        _expert_counts(t, m, p, st)
    if p.ep > 1 and st.moe:
        size, fp8 = ep_bytes(m, p), dispatch_scale(p)
        replays = 1 if conv.expert_recompute and p.recompute == "full" else 0
        forwards = (1 + replays) * st.moe * n  # each forward's dispatch, maybe in fp8
        if fp8 != 1.0:
            t.add("ep", "all_to_all", size * fp8, forwards)
        t.add("ep", "all_to_all", size, (4 + 2 * replays) * st.moe * n
              - (forwards if fp8 != 1.0 else 0))
    if conv.context_parallel and p.cp > 1:  # sim.layout.stages.cp_exchanges, both passes
        for backward in (False, True):
            for kind, size in cp_exchanges(m, p, backward):
                t.add("cp", kind, size, st.total * n)


def expected_collectives(model: ModelSpec, plan: Plan, pp_rank: int = 0,
                         conventions: Conventions = TORCH, replica: int = 0
                         ) -> list[dict[str, Any]]:
    """Rows of (group, kind, count, bytes) for one step of the ranks of pipeline stage
    ``pp_rank`` in data-parallel ``replica`` (which matters where replicas run different
    numbers of micro-batches), as a framework of ``conventions`` issues them; groups of
    size one issue nothing."""
    p, m, conv = replica_plan(plan, replica), model, conventions
    st = pipeline_rank_layers(p, m)[pp_rank]
    t = _Tally()
    if p.tp > 1:
        _tp(t, m, p, st, conv)
    if conv.layer_buckets:
        _dp_simulated(t, m, p, pp_rank)
    else:
        _dp(t, m, p, st, pp_rank, conv)
    if p.pp > 1:
        _pp(t, m, p, pp_rank, conv)
    _ep_cp(t, m, p, st, conv)
    return t.rows()


def compare_inventory(expected: list[dict[str, Any]], measured: list[dict[str, Any]],
                      bytes_tol: float = 0.05) -> list[dict[str, Any]]:
    """Row per (group, kind) in either list: counts, bytes and whether they agree (count
    exactly, bytes within ``bytes_tol``)."""
    exp = {(r["group"], r["kind"]): r for r in expected}
    got = {(r["group"], r["kind"]): r for r in measured}
    rows = []
    for key in sorted(set(exp) | set(got)):
        e, g = exp.get(key, {"count": 0, "bytes": 0}), got.get(key, {"count": 0, "bytes": 0})
        rel = abs(g["bytes"] - e["bytes"]) / e["bytes"] if e["bytes"] else float(g["bytes"] > 0)
        rows.append({"group": key[0], "kind": key[1], "expected_count": e["count"],
                     "measured_count": g["count"], "expected_bytes": e["bytes"],
                     "measured_bytes": g["bytes"], "bytes_error": rel,
                     "match": e["count"] == g["count"] and rel <= bytes_tol})
    return rows
