"""Parameter counts and FLOPs of a ModelSpec, as pure functions.

FLOPs follow Megatron-LM's convention (Narayanan et al. SC'21, Eq. 3): a matmul of an
``m x k`` by a ``k x n`` matrix is ``2mkn`` FLOPs; attention scores and the weighted sum
are counted over the full ``s x s`` matrix (no causal halving); the backward pass costs
twice the forward; biases, norms and activations are not counted.
"""

from __future__ import annotations

from sim.spec.model import ModelSpec
from sim.spec.plan import RECOMPUTE_MODES

__all__ = [
    "attention_params", "mlp_params", "layer_params", "embedding_params", "param_count",
    "active_param_count", "forward_flops_per_token", "model_flops_per_token",
    "hardware_flops_per_token",
]



def _norm_params(m: ModelSpec) -> int:
    return 2 * m.hidden_size if m.norm == "layernorm" else m.hidden_size


def attention_params(m: ModelSpec) -> int:
    """QKV and output projections (with biases where the model has them)."""
    h, q, kv = m.hidden_size, m.q_dim, m.kv_dim
    weights = h * (q + 2 * kv) + q * h
    if m.linear_bias:
        return weights + q + 2 * kv + h
    return weights + (q + 2 * kv if m.qkv_bias else 0)


def mlp_params(m: ModelSpec, ffn: int) -> int:
    """One MLP of width ``ffn``: two matrices, or three when gated (SwiGLU)."""
    mats = 3 if m.gated_mlp else 2
    bias = (ffn * (mats - 1) + m.hidden_size) if m.linear_bias else 0
    return mats * m.hidden_size * ffn + bias


def _moe_mlp_params(m: ModelSpec, experts: int) -> int:
    shared = 0
    if m.shared_expert_ffn_hidden_size:
        shared = mlp_params(m, m.shared_expert_ffn_hidden_size) + m.hidden_size  # + its gate
    return m.hidden_size * m.num_experts + experts * mlp_params(m, m.expert_ffn) + shared


def _qk_norm_params(m: ModelSpec) -> int:
    """Norms on queries and keys: one head-wide weight each, or q_dim and kv_dim wide."""
    width = {"none": 0, "head": 2 * m.head_size, "full": m.q_dim + m.kv_dim}[m.qk_norm]
    return width * (2 if m.norm == "layernorm" else 1)


def layer_params(m: ModelSpec, moe: bool = False, active: bool = False) -> int:
    """One transformer layer; ``moe`` picks an MoE layer, ``active`` counts top-k experts."""
    if moe:
        mlp = _moe_mlp_params(m, m.top_k if active else m.num_experts)
    else:
        mlp = mlp_params(m, m.ffn_hidden_size)
    return attention_params(m) + mlp + m.norms_per_layer * _norm_params(m) + _qk_norm_params(m)


def embedding_params(m: ModelSpec) -> int:
    """Input embedding, learned positions, and the output projection when untied."""
    pos = m.max_seq_len * m.hidden_size if m.position_embedding == "learned" else 0
    out = 0 if m.tied_embeddings else m.vocab_size * m.hidden_size
    return m.vocab_size * m.hidden_size + pos + out


def _total(m: ModelSpec, active: bool) -> int:
    n_moe = m.num_moe_layers
    dense = (m.num_layers - n_moe) * layer_params(m)
    sparse = n_moe * layer_params(m, moe=True, active=active)
    return dense + sparse + embedding_params(m) + _norm_params(m)


def param_count(m: ModelSpec) -> int:
    """All parameters. GPT-3 style: ``12*l*h^2 + 13*l*h + V*h + s*h + 2*h``."""
    return _total(m, active=False)


def active_param_count(m: ModelSpec) -> int:
    """Parameters touched by one token (top-k experts only); equals param_count when dense."""
    return _total(m, active=True)


def _matmul_weights_per_layer(m: ModelSpec, moe: bool) -> int:
    h = m.hidden_size
    attn = h * (m.q_dim + 2 * m.kv_dim) + m.q_dim * h
    mats = 3 if m.gated_mlp else 2
    if not moe:
        return attn + mats * h * m.ffn_hidden_size
    mlp = m.top_k * mats * h * m.expert_ffn + h * m.num_experts  # experts + router
    return attn + mlp + mats * h * m.shared_expert_ffn_hidden_size


def layer_forward_flops_per_token(m: ModelSpec, seq_len: int, moe: bool = False) -> float:
    """Forward FLOPs of one layer for one token: matmuls plus ``4*s*q_dim`` for attention."""
    return 2.0 * _matmul_weights_per_layer(m, moe) + attention_core_flops_per_token(m, seq_len)


def attention_core_flops_per_token(m: ModelSpec, seq_len: int) -> float:
    """``Q K^T`` and ``softmax(.) V``: ``2 * 2 * s * q_dim`` per token per layer."""
    return 4.0 * seq_len * m.q_dim


def logits_flops_per_token(m: ModelSpec) -> float:
    return 2.0 * m.hidden_size * m.vocab_size


def forward_flops_per_token(m: ModelSpec, seq_len: int) -> float:
    """Forward FLOPs of the whole model for one token of a ``seq_len`` sequence."""
    n_moe = m.num_moe_layers
    layers = (m.num_layers - n_moe) * layer_forward_flops_per_token(m, seq_len)
    layers += n_moe * layer_forward_flops_per_token(m, seq_len, moe=True)
    return layers + logits_flops_per_token(m)


def model_flops_per_token(m: ModelSpec, seq_len: int) -> float:
    """Training FLOPs per token counted for MFU: forward + backward (3x forward)."""
    return 3.0 * forward_flops_per_token(m, seq_len)


def hardware_flops_per_token(m: ModelSpec, seq_len: int, recompute: str = "none") -> float:
    """FLOPs actually executed: full recompute re-runs every layer's forward (not the logits),
    selective recompute re-runs the attention core only."""
    if recompute not in RECOMPUTE_MODES:
        raise ValueError(f"recompute must be one of {RECOMPUTE_MODES}, got {recompute!r}")
    base = model_flops_per_token(m, seq_len)
    if recompute == "full":
        return base + forward_flops_per_token(m, seq_len) - logits_flops_per_token(m)
    if recompute == "selective":
        return base + m.num_layers * attention_core_flops_per_token(m, seq_len)
    return base
