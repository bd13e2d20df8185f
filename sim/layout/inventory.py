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
  forward and backward and reduce-scatters its gradient every micro-batch, and does the same
  for the embedding/output parameters (one more unit).
- PP: one activation send forward and one gradient receive backward per micro-batch and
  stage boundary on the first stage (the mirror on later stages); with tied embeddings the
  first and last stage all-reduce the embedding gradient (Megatron's embedding group).
- EP: two all-to-alls (dispatch, combine) forward and two backward per MoE layer and
  micro-batch.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

from sim.layout.memory import layer_rank_params, rank_params
from sim.layout.stages import pipeline_rank_layers
from sim.spec.model import ModelSpec
from sim.spec.plan import Plan

__all__ = ["dp_bucket_params", "expected_collectives", "compare_inventory"]


def dp_bucket_params(plan: Plan) -> float:
    """Parameters per data-parallel gradient bucket: Megatron-LM's DDP bucket size."""
    return max(40e6, 1e6 * plan.dp)


FP32 = 4


class _Tally:
    def __init__(self) -> None:
        self.count: Counter[tuple[str, str]] = Counter()
        self.bytes: dict[tuple[str, str], float] = {}

    def add(self, group: str, kind: str, size_bytes: float, times: int = 1) -> None:
        if times > 0 and size_bytes > 0:
            self.count[(group, kind)] += times
            key = (group, kind)
            self.bytes[key] = self.bytes.get(key, 0.0) + size_bytes * times

    def rows(self) -> list[dict[str, Any]]:
        return [{"group": g, "kind": k, "count": self.count[(g, k)],
                 "bytes": int(round(self.bytes[(g, k)]))} for g, k in sorted(self.count)]


def _tp(t: _Tally, m: ModelSpec, p: Plan, layers: int, first: bool, last: bool) -> None:
    n = p.num_microbatches
    act = p.local_tokens * m.hidden_size * p.activation_bytes
    passes = 3 if p.recompute == "full" else 2  # forward, backward (and the replay)
    kinds = ("all_gather", "reduce_scatter") if p.sequence_parallel else ("all_reduce",)
    for kind in kinds:  # two of each kind per layer and pass
        t.add("tp", kind, act, 2 * passes * layers * n)
    if first:  # embedding: forward reduce (SP: a reduce-scatter, gathered in backward)
        for kind in kinds:
            t.add("tp", kind, act, n)
    if last:  # output layer: backward reduce of its input gradient (SP: forward gather too)
        for kind in kinds:
            t.add("tp", kind, act, n)
        t.add("tp", "all_reduce", p.local_tokens * FP32, 3 * n)  # vocab-parallel loss
    if p.sequence_parallel:  # norm weights see a sequence shard: their gradients are summed
        norms = 2 * layers + (1 if last else 0)
        t.add("tp", "all_reduce", m.hidden_size * p.activation_bytes, norms)


def _dp(t: _Tally, m: ModelSpec, p: Plan, dense: float, expert: float, units: list[float]
        ) -> None:
    grad = p.activation_bytes
    n = p.num_microbatches
    if p.zero_stage == 3:
        for params in units:
            t.add("dp", "all_gather", params * grad, 2 * n)
            t.add("dp", "reduce_scatter", params * grad, n)
        return
    coll = "all_reduce" if p.zero_stage == 0 else "reduce_scatter"
    buckets = max(1, math.ceil(dense / dp_bucket_params(p)))
    times = n if p.zero_stage == 2 else 1
    for _ in range(buckets):
        t.add("dp", coll, dense * grad / buckets, times)
    if p.zero_stage in (1, 2):
        t.add("dp", "all_gather", dense * grad)
    if expert and p.dp // p.ep > 1:
        t.add("edp", coll, expert * grad, times)


def expected_collectives(model: ModelSpec, plan: Plan, pp_rank: int = 0
                         ) -> list[dict[str, Any]]:
    """Rows of (group, kind, count, bytes) for one step of the ranks of pipeline stage
    ``pp_rank``; groups of size one issue nothing."""
    p, m = plan, model
    st = pipeline_rank_layers(p, m)[pp_rank]
    t = _Tally()
    if p.tp > 1:
        _tp(t, m, p, st.total, st.first, st.last)
    dense, expert = rank_params(m, p, st)
    if p.dp * p.cp > 1:
        layer = [sum(layer_rank_params(m, p, False))] * st.dense + \
            [sum(layer_rank_params(m, p, True))] * st.moe
        extra = dense - sum(layer_rank_params(m, p, False)) * st.dense - \
            layer_rank_params(m, p, True)[0] * st.moe
        _dp(t, m, p, dense, expert, layer + ([extra] if extra > 0 else []))
    if p.pp > 1:
        boundary = p.micro_batch_size * p.seq_len / p.cp * m.hidden_size * p.activation_bytes \
            / (p.tp if p.sequence_parallel else 1)
        last_vs = p.pp * p.vpp - 1
        # Each chunk sends its output forward (unless last) and its input gradient back
        # (unless first), and receives as many.
        per_mb = sum((vs != last_vs) + (vs != 0) for vs in range(pp_rank, last_vs + 1, p.pp))
        t.add("pp", "send", boundary, per_mb * p.num_microbatches)
        t.add("pp", "recv", boundary, per_mb * p.num_microbatches)
        if m.tied_embeddings and (st.first or st.last):
            t.add("embedding", "all_reduce",
                  m.vocab_size * m.hidden_size / p.tp * p.activation_bytes)
    if p.ep > 1 and st.moe:
        tokens = p.local_tokens / (p.tp if p.sequence_parallel else 1)
        size = tokens * m.top_k * m.hidden_size * p.activation_bytes
        t.add("ep", "all_to_all", size, 4 * st.moe * p.num_microbatches)
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
