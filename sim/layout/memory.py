"""Peak memory per rank (weights, gradients, optimizer state, activations) and the
out-of-memory verdict against each stage's own GPUs: the one owner of a plan's memory.

* Model states follow the ZeRO paper (Rajbhandari et al. 2020, Sec. 3.1 and 5): mixed
  precision Adam keeps ``2`` bytes of weights, ``2`` of gradients and ``K = 12`` of fp32
  master weights, momentum and variance per parameter; ZeRO stage 1/2/3 shards the optimizer
  state / + gradients / + weights over the ``N`` data-parallel ranks. fp32 training keeps
  4 + 4 bytes and ``K = 8``.
* Activations follow Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large
  Transformer Models", Sec. 4): ``s*b*h*(34 + 5*a*s/h)`` bytes per layer for a GPT layer,
  ``s*b*h*(10 + 24/t + 5*a*s/(h*t))`` with tensor parallelism, ``s*b*h/t*(34 + 5*a*s/h)`` with
  sequence parallelism, ``34*s*b*h/t`` with selective recompute and ``2*s*b*h/t`` per layer
  with full recompute. Here every term is written per tensor, so the same code also covers
  GQA, gated MLPs, no-dropout models, flash attention and MoE layers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sim.layout.dualpipe import peak_activations, peak_held
from sim.layout.flops import attention_params, attention_replicated_params, layer_params, mlp_params
from sim.layout.placement import stage_devices
from sim.layout.routing import routing
from sim.layout.stages import (
    StageLayers,
    dualpipe_family,
    first_stage,
    last_stage,
    mirrored,
    pipeline_rank_layers,
    rank_virtual_stages,
    virtual_stage_moe,
)
from sim.spec.cluster import ClusterSpec
from sim.spec.experts import expert_tp
from sim.spec.hardware import HardwareSpec
from sim.spec.model import ModelSpec
from sim.spec.plan import Plan
from sim.spec.recompute import recomputed, recomputed_norms
from sim.spec.zero import regathers

__all__ = ["MemoryBreakdown", "layer_activation_bytes", "model_state_bytes_per_param",
           "rank_memory", "rank_params", "mirror_bytes", "layer_rank_params", "chunk_edge_params",
           "peak_memory",
           "inflight_microbatches", "GIB", "memory_verdict", "MemoryReport", "memory_report"]

GIB = 1024**3


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes on one pipeline rank (every rank of a pipeline stage holds the same)."""

    pipeline_rank: int
    weights: float
    gradients: float
    optimizer: float
    activations: float
    transient: float  # logits, one layer being recomputed, ZeRO-3 gathered weights
    reserved: float

    @property
    def total(self) -> float:
        return (self.weights + self.gradients + self.optimizer + self.activations
                + self.transient + self.reserved)


def model_state_bytes_per_param(dtype: str, zero_stage: int, shards: int,
                                grad_bytes: float | None = None
                                ) -> tuple[float, float, float]:
    """(weights, gradients, optimizer) bytes per parameter on one rank under ZeRO; the
    gradient buffer holds ``grad_bytes`` a parameter (default: the training dtype's)."""
    w, g, k = (4.0, 4.0, 8.0) if dtype == "fp32" else (2.0, 2.0, 12.0)
    g = g if grad_bytes is None else float(grad_bytes)
    if zero_stage >= 1:
        k /= shards
    if zero_stage >= 2:
        g /= shards
    if zero_stage >= 3:
        w /= shards
    return w, g, k


def _attention_core_bytes(m: ModelSpec, plan: Plan, s: float, b: int) -> float:
    """What attention itself keeps: the s x s scores unless fused or recomputed."""
    heads = m.num_heads / plan.tp
    if plan.attention == "flash":
        return 4.0 * heads * s * b  # fp32 log-sum-exp per query
    if "core_attn" in recomputed(plan):
        return 0.0
    kept = 2 + (3 if m.dropout else 0)  # softmax output (+ dropout mask and output)
    return kept * heads * s * plan.seq_len * b


def _mlp_inner_elems(m: ModelSpec, ffn: int) -> int:
    """Elements per token inside one MLP: activation inputs and output."""
    return 3 * ffn if m.gated_mlp else 2 * ffn


def layer_activation_bytes(m: ModelSpec, plan: Plan, moe: bool = False) -> float:
    """Bytes one layer keeps for backward, per micro-batch, on one rank (no recompute
    other than ``selective``; see :func:`_stored_layer_bytes` for ``full``)."""
    s = plan.seq_len // plan.cp
    b = plan.micro_batch_size
    t = plan.tp
    e = plan.activation_bytes
    sbh = s * b * m.hidden_size
    again = recomputed(plan)  # modules re-run in the backward keep only their inputs
    norms = 4 - recomputed_norms(m, plan, moe)  # norm inputs, outputs (QKV/MLP inputs)
    replicated = (norms * sbh * e + (2 * sbh if m.dropout else 0)  # masks
                  ) / (t if plan.sequence_parallel else 1)
    tensors: float = m.q_dim + m.kv_dim + m.v_dim + m.o_dim  # Q, K, V, output projection input
    if m.is_mla:  # latents, before and after their norms, on every TP rank; the rotary key
        replicated += (2 * (m.q_lora_rank + m.kv_lora_rank) + m.qk_rope_head_dim) * s * b * e
    if moe:
        inner = _mlp_inner_elems(m, m.expert_ffn) - (m.expert_ffn if "moe_act" in again else 0)
        # the experts' input: each ETP rank holds every gathered token at full width
        routed = m.top_k * (inner + m.hidden_size * expert_tp(plan))
        tensors += routed * routing(m, plan).load_factor  # the most-loaded rank's
        if "shared_experts" not in again:
            tensors += _mlp_inner_elems(m, m.shared_expert_ffn_hidden_size)
    elif "mlp" not in again:
        tensors += _mlp_inner_elems(m, m.ffn_hidden_size)
    parallel = tensors * s * b * e / t
    return replicated + parallel + _attention_core_bytes(m, plan, s, b)


def _norm(m: ModelSpec) -> int:
    return (2 if m.norm == "layernorm" else 1) * m.hidden_size


def _stored_layer_bytes(m: ModelSpec, plan: Plan, moe: bool) -> float:
    if plan.recompute == "full":  # only the layer input is kept
        sbh = plan.local_tokens * m.hidden_size
        return plan.activation_bytes * sbh / (plan.tp if plan.sequence_parallel else 1)
    return layer_activation_bytes(m, plan, moe)


def inflight_microbatches(plan: Plan, rank: int) -> float:
    """Micro-batches whose activations pipeline rank ``rank`` holds at its peak: all of
    them under GPipe, ``pp - rank`` under 1F1B, Megatron-LM's warm-up count of virtual
    chunks (in whole micro-batches through this rank's layers) when interleaved; one more
    micro-batch (or chunk) with all-to-all overlap's merged steps. DualPipeV: the most
    chunks its program holds at once (``2 pp + 1``, DeepSeek's ``PP + 1``), halved; its
    bytes are counted stage by stage (:func:`_dualpipev_activations`: deferred weight
    gradients hold more than a chunk's stored activations)."""
    m = plan.num_microbatches
    merged = 1 if plan.moe_overlap == "a2a" else 0  # a merged step's second micro-batch
    if plan.schedule == "gpipe":
        return float(m)
    if dualpipe_family(plan):
        return peak_activations(plan.pp, m, rank, mirrored(plan)) / 2
    if plan.schedule == "1f1b":
        return float(min(plan.pp - rank + merged, m))
    chunks = min(2 * (plan.pp - rank - 1) + (plan.vpp - 1) * plan.pp + 1 + merged, m * plan.vpp)
    return chunks / plan.vpp


def _output_grad_bytes(m: ModelSpec, plan: Plan, moe: bool) -> float:
    """Bytes of one layer's GEMM output gradients on one rank per micro-batch: what a
    weight gradient (``dW = X^T dY``) needs beside its inputs. Column-parallel outputs
    split over TP (QKV, up/gate), row-parallel ones whole (O, down); routed experts as the
    routed activations are counted."""
    up = 2 if m.gated_mlp else 1
    t, h = plan.tp, m.hidden_size
    elems = (m.q_dim + m.kv_dim + m.v_dim) / t + h
    if moe:
        shared = m.shared_expert_ffn_hidden_size
        elems += (up * shared / t + h) if shared else 0.0
        elems += m.top_k * routing(m, plan).load_factor * (up * m.expert_ffn / t
                                                           + h * expert_tp(plan) / t)
    else:
        elems += up * m.ffn_hidden_size / t + h
    return plan.micro_batch_size * plan.seq_len / plan.cp * elems * plan.activation_bytes


def _dualpipev_activations(m: ModelSpec, plan: Plan, rank: int) -> float:
    """The most DualPipeV's program holds at once on ``rank``, stage by stage: a chunk's
    stored activations until its backward, and what a deferred weight gradient needs (its
    layers' activations, recomputed ones too, and their GEMMs' output gradients) until its
    ``W``."""
    flags = virtual_stage_moe(plan, m)
    stored = {vs: sum(_stored_layer_bytes(m, plan, f) for f in flags[vs])
              for vs in rank_virtual_stages(plan, rank)}
    waiting = {vs: sum(layer_activation_bytes(m, plan, f) + _output_grad_bytes(m, plan, f)
                       for f in flags[vs]) for vs in rank_virtual_stages(plan, rank)}
    return peak_held(plan.pp, plan.num_microbatches, rank, stored, waiting, mirrored(plan))


def layer_rank_params(m: ModelSpec, plan: Plan, moe: bool) -> tuple[float, float]:
    """(dense, expert) parameters of one layer on one rank: matrices split over TP, norms
    replicated, experts split over EP (and TP), router and shared-expert gate replicated."""
    norms = layer_params(m) - attention_params(m) - mlp_params(m, m.ffn_hidden_size)
    whole = attention_replicated_params(m)  # MLA's down-projections: on every TP rank
    if not moe:
        return (layer_params(m) - norms - whole) / plan.tp + norms + whole, 0.0
    attention = (attention_params(m) - whole) / plan.tp + whole
    shared = m.shared_expert_ffn_hidden_size
    gate = m.hidden_size if m.shared_expert_gate else 0
    shared_params = mlp_params(m, shared) / plan.tp + gate if shared else 0.0
    dense = attention + shared_params + norms + m.hidden_size * m.num_experts
    return dense, m.num_experts / plan.ep * mlp_params(m, m.expert_ffn) / expert_tp(plan)


def chunk_edge_params(m: ModelSpec, plan: Plan, vs: int) -> float:
    """Embedding and output-layer parameters on one rank of virtual stage ``vs`` (the
    first holds the input embedding, the last the output projection unless it is the
    tied embedding on the same stage, and multi-token prediction's projections)."""
    out = 0.0
    vh = m.vocab_size * m.hidden_size / plan.tp
    if first_stage(plan, vs):
        out += vh + (m.max_seq_len * m.hidden_size if m.position_embedding == "learned" else 0)
    if last_stage(plan, vs):
        if not m.tied_embeddings or not first_stage(plan, vs):
            out += vh
        out += _mtp_params(m, plan)
    return out


def rank_params(m: ModelSpec, plan: Plan, st: StageLayers) -> tuple[float, float]:
    """(dense, expert) parameters on one rank; ZeRO shards dense ones over dp*cp ranks,
    expert ones over ``plan.expert_replicas``."""
    d_dense, _ = layer_rank_params(m, plan, False)
    m_dense, m_expert = layer_rank_params(m, plan, True) if st.moe else (0.0, 0.0)
    dense = st.dense * d_dense + st.moe * m_dense
    expert = st.moe * m_expert
    vh = m.vocab_size * m.hidden_size / plan.tp
    if st.first:
        dense += vh + (m.max_seq_len * m.hidden_size if m.position_embedding == "learned" else 0)
    if st.last and (not m.tied_embeddings or plan.pp * plan.vpp > 1):
        dense += vh  # output projection (a copy of the tied embedding on a separate stage,
        # dualpipev's on the first stage's rank too)
    if st.last:
        dense += _mtp_params(m, plan)
    return dense, expert


def mirror_bytes(m: ModelSpec, plan: Plan, st: StageLayers) -> float:
    """Bytes a DualPipe rank all-reduces with its mirror (rank ``pp - 1 - r``, the same
    layers) after the data-parallel reduction: its gradients, ZeRO-1's shard of them."""
    dense, expert = rank_params(m, plan, st)
    if plan.zero_stage >= 1:
        dense, expert = dense / plan.dense_replicas, expert / plan.expert_replicas
    return (dense + expert) * plan.grad_bytes


def _mtp_params(m: ModelSpec, plan: Plan) -> float:
    """Multi-token prediction's projections and norms on a rank of the last stage (its
    layers are counted as layers)."""
    return m.num_mtp_layers * (2 * m.hidden_size ** 2 / plan.tp + 3 * _norm(m))


def _transient_bytes(m: ModelSpec, plan: Plan, st: StageLayers) -> float:
    tokens = plan.local_tokens
    out = 0.0
    if st.last:
        out += 6.0 * tokens * m.vocab_size / plan.tp  # logits in dtype and fp32 for the loss
    if plan.recompute == "full" and st.total:  # a rank of no layers recomputes none
        out += layer_activation_bytes(m, plan, moe=st.moe > 0)
    if regathers(plan):  # the current and the prefetched layer, gathered
        out += 2 * plan.activation_bytes * sum(layer_rank_params(m, plan, st.moe > 0))
    elif plan.zero_stage == 3:  # every layer's, kept from its forward to its backward
        out += plan.activation_bytes * sum(rank_params(m, plan, st))
    if plan.cp > 1 and st.total:  # context parallelism's K/V buffers for one layer
        chunk = tokens * (m.kv_dim + m.v_dim) / plan.tp * plan.activation_bytes
        # the ring: a chunk in use and one arriving, and the same for dK/dV in the backward;
        # the all-gather: the gathered K/V and, in the backward, their full-size gradients
        # before the reduce-scatter; Ulysses' exchanged tensors are the activations
        out += {"p2p": 4 * chunk, "allgather": 2 * plan.cp * chunk}.get(plan.cp_comm, 0.0)
    return out


def rank_memory(m: ModelSpec, plan: Plan, st: StageLayers, rank: int, reserved_gib: float
                ) -> MemoryBreakdown:
    dense, expert = rank_params(m, plan, st)
    wd, gd, od = model_state_bytes_per_param(plan.dtype, plan.zero_stage, plan.dense_replicas,
                                             plan.grad_bytes)
    we, ge, oe = model_state_bytes_per_param(plan.dtype, plan.zero_stage, plan.expert_replicas,
                                             plan.grad_bytes)
    per_mb = (st.dense * _stored_layer_bytes(m, plan, False)
              + st.moe * _stored_layer_bytes(m, plan, True))
    acts = _dualpipev_activations(m, plan, rank) if dualpipe_family(plan) else \
        per_mb * inflight_microbatches(plan, rank)
    return MemoryBreakdown(rank, dense * wd + expert * we, dense * gd + expert * ge,
                           dense * od + expert * oe, acts, _transient_bytes(m, plan, st),
                           reserved_gib * GIB)


def peak_memory(m: ModelSpec, plan: Plan, reserved_gib: float) -> list[MemoryBreakdown]:
    """Memory of every pipeline rank; the caller takes the max for the peak."""
    stages = pipeline_rank_layers(plan, m)
    return [rank_memory(m, plan, st, r, reserved_gib) for r, st in enumerate(stages)]


def _stage_gpus(cluster: ClusterSpec, plan: Plan, stage: int) -> set[HardwareSpec]:
    pl = plan.placement
    return {cluster.gpu_of(r if isinstance(pl, str) else pl[r])
            for d in range(plan.dp) for r in stage_devices(plan, d, stage)}


def memory_verdict(model: ModelSpec, cluster: ClusterSpec, plan: Plan,
                   ranks: Sequence[MemoryBreakdown] | None = None) -> tuple[float, float]:
    """(peak GiB, capacity GiB) of the tightest pipeline stage, each stage held against the
    GPU type among its devices with the least room (own memory and reserve); the plan fits
    when peak <= capacity. On a homogeneous cluster: the largest peak and the GPU's memory.
    ``ranks``: :func:`peak_memory` at ``cluster.gpu``'s reserve, when already computed."""
    ref = cluster.gpu.reserved_gib
    ranks = peak_memory(model, plan, ref) if ranks is None else ranks
    totals = [mb.total / GIB for mb in ranks]
    if not cluster.heterogeneous:
        return max(totals), cluster.gpu.memory_gib
    rows = [t - ref for t in totals]
    best: tuple[float, float, float] | None = None
    for stage, need in enumerate(rows):
        gpu = min(_stage_gpus(cluster, plan, stage),
                  key=lambda g: (g.memory_gib - g.reserved_gib, g.name))
        slack = gpu.memory_gib - gpu.reserved_gib - need
        if best is None or slack < best[0]:
            best = (slack, need + gpu.reserved_gib, gpu.memory_gib)
    assert best is not None
    return best[1], best[2]


@dataclass(frozen=True)
class MemoryReport:
    """A plan's memory, computed once: per pipeline rank the breakdown in GiB (at
    ``cluster.gpu``'s reserve), and the verdict of :func:`memory_verdict`."""

    ranks_gib: list[dict[str, float]]
    peak_gib: float
    capacity_gib: float

    @property
    def fits(self) -> bool:
        return self.peak_gib <= self.capacity_gib


def memory_report(model: ModelSpec, cluster: ClusterSpec, plan: Plan) -> MemoryReport:
    """Per-rank breakdown and verdict from one :func:`peak_memory` evaluation."""
    ranks = peak_memory(model, plan, cluster.gpu.reserved_gib)
    peak, capacity = memory_verdict(model, cluster, plan, ranks)
    return MemoryReport([_gib_row(mb) for mb in ranks], peak, capacity)


def _gib_row(mb: MemoryBreakdown) -> dict[str, float]:
    return {"pipeline_rank": mb.pipeline_rank, "weights": mb.weights / GIB,
            "gradients": mb.gradients / GIB, "optimizer": mb.optimizer / GIB,
            "activations": mb.activations / GIB, "transient": mb.transient / GIB,
            "reserved": mb.reserved / GIB, "total": mb.total / GIB}
