"""Compute time of one transformer layer from a roofline with efficiency curves.

A GEMM of ``M x K`` by ``K x N`` runs at ``peak * gemm_eff_max * prod(d / (d + d_half))``
over its three dimensions, or at the memory roofline if that is slower; element-wise
operations (norms, residual adds, activations, dropout, softmax) stream their bytes at
``hbm_GBps * hbm_eff``. Backward costs twice the forward (two GEMMs of the same shape per
forward GEMM; gradients of element-wise operations read and write twice as much), fused
attention 2.5 times (FlashAttention-2 recomputes the scores in backward).
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.hardware import DTYPE_BYTES, HardwareSpec
from sim.model import ModelSpec
from sim.plan import Plan

__all__ = ["gemm_efficiency", "gemm_time", "stream_time", "LayerTime", "layer_time",
           "logits_time", "embedding_time", "BACKWARD_FACTOR", "FLASH_BACKWARD_FACTOR"]

BACKWARD_FACTOR = 2.0
FLASH_BACKWARD_FACTOR = 2.5


def gemm_efficiency(hw: HardwareSpec, m: float, n: float, k: float) -> float:
    """Fraction of peak a GEMM of this shape reaches (compute-bound part)."""
    h = hw.gemm_dim_half
    return hw.gemm_eff_max * (m / (m + h)) * (n / (n + h)) * (k / (k + h))


def gemm_time(hw: HardwareSpec, dtype: str, m: float, n: float, k: float, batch: float = 1.0
              ) -> float:
    """Seconds for ``batch`` GEMMs of ``(m x k) @ (k x n)``: max of compute and memory."""
    flops = 2.0 * m * n * k * batch
    compute = flops / (hw.peak_tflops(dtype) * 1e12 * gemm_efficiency(hw, m, n, k))
    bytes_moved = (m * k + k * n + m * n) * batch * DTYPE_BYTES[dtype]
    return max(compute, stream_time(hw, bytes_moved))


def stream_time(hw: HardwareSpec, bytes_moved: float) -> float:
    """Seconds to stream ``bytes_moved`` through HBM."""
    return bytes_moved / (hw.hbm_GBps * 1e9 * hw.hbm_eff)


@dataclass(frozen=True)
class LayerTime:
    """Seconds of one layer for one micro-batch on one rank."""

    forward: float
    backward: float
    attention_forward: float  # the attention core alone (what selective recompute re-runs)


def _act_dtype(plan: Plan) -> str:
    """Activations stay in 16 bits under fp8 training; GEMMs run in ``plan.dtype``."""
    return "fp32" if plan.dtype == "fp32" else "bf16"


def _attention_core(hw: HardwareSpec, m: ModelSpec, plan: Plan, tokens: float
                    ) -> tuple[float, float]:
    """(forward, backward) seconds of scores, softmax and weighted sum on one rank."""
    heads = m.num_heads / plan.tp
    q_len, kv_len, d = plan.seq_len / plan.cp, plan.seq_len, m.head_size
    batch = heads * plan.micro_batch_size
    if plan.attention == "flash":  # causal: the kernel skips the masked half
        flops = 4.0 * batch * q_len * kv_len * d * 0.5
        fwd = flops / (hw.peak_tflops(_act_dtype(plan)) * 1e12 * hw.attention_eff)
        return fwd, FLASH_BACKWARD_FACTOR * fwd
    dt = _act_dtype(plan)
    scores = gemm_time(hw, dt, q_len, kv_len, d, batch) + gemm_time(hw, dt, q_len, d, kv_len,
                                                                       batch)
    per_elem = 4 + (5 if m.dropout else 0)  # scale+mask+softmax read/write, dropout
    softmax = stream_time(hw, batch * q_len * kv_len * per_elem)
    return scores + softmax, BACKWARD_FACTOR * (scores + softmax)


def _mlp_forward(hw: HardwareSpec, m: ModelSpec, plan: Plan, tokens: float, moe: bool) -> float:
    dt, h, t = plan.dtype, m.hidden_size, plan.tp
    up = 2 if m.gated_mlp else 1
    if not moe:
        f = m.ffn_hidden_size
        return gemm_time(hw, dt, tokens, up * f / t, h) + gemm_time(hw, dt, tokens, h, f / t)
    local_experts = m.num_experts / plan.ep
    per_expert = tokens * m.top_k * plan.ep / m.num_experts  # balanced routing
    f = m.expert_ffn
    experts = local_experts * (gemm_time(hw, dt, per_expert, up * f / t, h)
                               + gemm_time(hw, dt, per_expert, h, f / t))
    router = gemm_time(hw, dt, tokens, m.num_experts, h)
    shared = 0.0
    if m.shared_expert_ffn_hidden_size:
        fs = m.shared_expert_ffn_hidden_size
        shared = gemm_time(hw, dt, tokens, up * fs / t, h) + gemm_time(hw, dt, tokens, h, fs / t)
    return experts + router + shared


def _elementwise_bytes(m: ModelSpec, plan: Plan, tokens: float, moe: bool) -> float:
    """Bytes streamed by the element-wise operations of one layer's forward."""
    e, h = DTYPE_BYTES[_act_dtype(plan)], m.hidden_size
    replicated = tokens / (plan.tp if plan.sequence_parallel else 1)
    per_token = 2 * 2 * h + 2 * 3 * h + (2 * 2.5 * h if m.dropout else 0)  # norms, adds
    ffn = m.expert_ffn * m.top_k if moe else m.ffn_hidden_size
    act = (3 * ffn if m.gated_mlp else 2 * ffn) / plan.tp
    rope = 4 * (m.q_dim + m.kv_dim) / plan.tp if m.position_embedding == "rope" else 0
    return (replicated * per_token + tokens * (act + rope)) * e


def layer_time(hw: HardwareSpec, m: ModelSpec, plan: Plan, moe: bool = False) -> LayerTime:
    """Forward and backward seconds of one layer for one micro-batch on one rank."""
    dt, h, t = plan.dtype, m.hidden_size, plan.tp
    tokens = plan.seq_len / plan.cp * plan.micro_batch_size
    qkv = gemm_time(hw, dt, tokens, (m.q_dim + 2 * m.kv_dim) / t, h)
    proj = gemm_time(hw, dt, tokens, h, m.q_dim / t)
    attn_f, attn_b = _attention_core(hw, m, plan, tokens)
    mlp = _mlp_forward(hw, m, plan, tokens, moe)
    elem = stream_time(hw, _elementwise_bytes(m, plan, tokens, moe))
    linear = qkv + proj + mlp + elem
    return LayerTime(linear + attn_f, BACKWARD_FACTOR * linear + attn_b, attn_f)


def logits_time(hw: HardwareSpec, m: ModelSpec, plan: Plan) -> float:
    """Forward + backward of the output projection and the cross-entropy loss."""
    tokens = plan.seq_len / plan.cp * plan.micro_batch_size
    v = m.vocab_size / plan.tp
    gemm = gemm_time(hw, plan.dtype, tokens, v, m.hidden_size)
    loss = stream_time(hw, tokens * v * (2 + 4 + 4 + 2))  # logits, fp32 softmax, grad
    return (1 + BACKWARD_FACTOR) * gemm + loss


def embedding_time(hw: HardwareSpec, m: ModelSpec, plan: Plan) -> float:
    """Forward + backward of the input embedding lookup (memory-bound)."""
    tokens = plan.seq_len / plan.cp * plan.micro_batch_size
    return stream_time(hw, 3 * tokens * m.hidden_size * DTYPE_BYTES[_act_dtype(plan)])
