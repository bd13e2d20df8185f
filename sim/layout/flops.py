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
    "hardware_flops_per_token", "megatron_flops_per_token", "mtp_params",
    "attention_matrix_params", "attention_replicated_params",
]



def _norm_params(m: ModelSpec) -> int:
    return 2 * m.hidden_size if m.norm == "layernorm" else m.hidden_size


def _projection_outputs(m: ModelSpec) -> list[int]:
    """Output widths of the attention's input projections (not the output projection)."""
    if not m.is_mla:
        return [m.q_dim, m.kv_dim, m.v_dim]
    q = [m.q_lora_rank, m.q_dim] if m.q_lora_rank else [m.q_dim]
    return q + [m.kv_lora_rank + m.qk_rope_head_dim, m.num_heads * (m.head_dim + m.v_head_dim)]


def attention_matrix_params(m: ModelSpec) -> int:
    """Weights of the attention's matrices. With MLA: the query down- and up-projection
    (or one query projection), the joint key-value down-projection with the shared rotary
    key, the key-value up-projection and the output projection."""
    h = m.hidden_size
    if not m.is_mla:
        return h * (m.q_dim + m.kv_dim + m.v_dim) + m.o_dim * h
    q = m.q_lora_rank * (h + m.q_dim) if m.q_lora_rank else h * m.q_dim
    kv = h * (m.kv_lora_rank + m.qk_rope_head_dim) + m.kv_lora_rank * m.num_heads * (
        m.head_dim + m.v_head_dim)
    return q + kv + m.o_dim * h


def _latent_norm_params(m: ModelSpec) -> int:
    """MLA's norms on the query and key-value latents."""
    return (m.q_lora_rank + m.kv_lora_rank) * (2 if m.norm == "layernorm" else 1)


def attention_replicated_params(m: ModelSpec) -> int:
    """Attention parameters every tensor-parallel rank holds whole: MLA's down-projections
    and latent norms (Megatron-LM duplicates them across TP); none without MLA."""
    if not m.is_mla:
        return 0
    down = [m.q_lora_rank] if m.q_lora_rank else []
    down.append(m.kv_lora_rank + m.qk_rope_head_dim)
    bias = sum(down) if m.linear_bias or m.qkv_bias else 0
    return m.hidden_size * sum(down) + bias + _latent_norm_params(m)


def attention_params(m: ModelSpec) -> int:
    """Attention matrices (with biases where the model has them; MLA's latent norms)."""
    outs = _projection_outputs(m)
    bias = sum(outs) + m.hidden_size if m.linear_bias else sum(outs) if m.qkv_bias else 0
    return attention_matrix_params(m) + bias + _latent_norm_params(m)


def mlp_params(m: ModelSpec, ffn: int) -> int:
    """One MLP of width ``ffn``: two matrices, or three when gated (SwiGLU)."""
    mats = 3 if m.gated_mlp else 2
    bias = (ffn * (mats - 1) + m.hidden_size) if m.linear_bias else 0
    return mats * m.hidden_size * ffn + bias


def _moe_mlp_params(m: ModelSpec, experts: int) -> int:
    shared = 0
    if m.shared_expert_ffn_hidden_size:
        shared = mlp_params(m, m.shared_expert_ffn_hidden_size) + (
            m.hidden_size if m.shared_expert_gate else 0)
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


def mtp_params(m: ModelSpec, active: bool = False) -> int:
    """Multi-token prediction modules: each a ``2h x h`` projection, norms on the embedding,
    the hidden state and its output, and a layer like the model's last (the embedding and
    the output layer are shared with the model)."""
    if not m.num_mtp_layers:
        return 0
    h = m.hidden_size
    layer = layer_params(m, moe=m.moe_layer(m.num_layers - 1), active=active)
    return m.num_mtp_layers * (2 * h * h + 3 * _norm_params(m) + layer)


def _total(m: ModelSpec, active: bool) -> int:
    n_moe = m.num_moe_layers
    dense = (m.num_layers - n_moe) * layer_params(m)
    sparse = n_moe * layer_params(m, moe=True, active=active)
    return dense + sparse + embedding_params(m) + _norm_params(m) + mtp_params(m, active)


def param_count(m: ModelSpec) -> int:
    """All parameters, multi-token prediction modules included (:func:`mtp_params`; a model
    card's total usually leaves them out). GPT-3 style: ``12*l*h^2 + 13*l*h + V*h + s*h +
    2*h``."""
    return _total(m, active=False)


def active_param_count(m: ModelSpec) -> int:
    """Parameters touched by one token (top-k experts only); equals param_count when dense."""
    return _total(m, active=True)


def _matmul_weights_per_layer(m: ModelSpec, moe: bool) -> int:
    h = m.hidden_size
    attn = attention_matrix_params(m)
    mats = 3 if m.gated_mlp else 2
    if not moe:
        return attn + mats * h * m.ffn_hidden_size
    mlp = m.top_k * mats * h * m.expert_ffn + h * m.num_experts  # experts + router
    return attn + mlp + mats * h * m.shared_expert_ffn_hidden_size


def layer_forward_flops_per_token(m: ModelSpec, seq_len: int, moe: bool = False) -> float:
    """Forward FLOPs of one layer for one token: matmuls plus ``4*s*q_dim`` for attention."""
    return 2.0 * _matmul_weights_per_layer(m, moe) + attention_core_flops_per_token(m, seq_len)


def attention_core_flops_per_token(m: ModelSpec, seq_len: int) -> float:
    """``Q K^T`` and ``softmax(.) V``: ``2 * s * (q_dim + o_dim)`` per token per layer
    (``4 * s * q_dim`` without MLA)."""
    return 2.0 * seq_len * (m.q_dim + m.o_dim)


def logits_flops_per_token(m: ModelSpec) -> float:
    return 2.0 * m.hidden_size * m.vocab_size


def _mtp_forward_flops_per_token(m: ModelSpec, seq_len: int) -> float:
    """One token through the multi-token prediction modules: projection, layer, logits."""
    h, last = m.hidden_size, m.moe_layer(m.num_layers - 1)
    return m.num_mtp_layers * (2.0 * 2 * h * h + layer_forward_flops_per_token(m, seq_len, last)
                               + logits_flops_per_token(m))


def forward_flops_per_token(m: ModelSpec, seq_len: int) -> float:
    """Forward FLOPs of the whole model for one token of a ``seq_len`` sequence."""
    n_moe = m.num_moe_layers
    layers = (m.num_layers - n_moe) * layer_forward_flops_per_token(m, seq_len)
    layers += n_moe * layer_forward_flops_per_token(m, seq_len, moe=True)
    return layers + logits_flops_per_token(m) + _mtp_forward_flops_per_token(m, seq_len)


def model_flops_per_token(m: ModelSpec, seq_len: int) -> float:
    """Training FLOPs per token counted for MFU: forward + backward (3x forward)."""
    return 3.0 * forward_flops_per_token(m, seq_len)


def hardware_flops_per_token(m: ModelSpec, seq_len: int, recompute: str = "none",
                             modules: frozenset[str] = frozenset({"core_attn"}),
                             early_stop: bool = False) -> float:
    """FLOPs actually executed: full recompute re-runs every layer's forward (not the logits;
    with ``early_stop``, torch's, not a dense layer's last GEMM, the MLP's down projection),
    selective recompute re-runs ``modules`` (:mod:`sim.spec.recompute`; the attention core
    by default): the core, dense layers' MLPs, MoE layers' shared experts (norms and
    activation functions have no matmul FLOPs)."""
    if recompute not in RECOMPUTE_MODES:
        raise ValueError(f"recompute must be one of {RECOMPUTE_MODES}, got {recompute!r}")
    base = model_flops_per_token(m, seq_len)
    logits = (1 + m.num_mtp_layers) * logits_flops_per_token(m)
    if recompute == "full":  # a replay that stops early skips dense layers' down projection
        dense = m.num_layers + m.num_mtp_layers - m.num_moe_layers \
            - (m.num_mtp_layers if m.moe_layer(m.num_layers - 1) else 0)
        skipped = dense * 2.0 * m.hidden_size * m.ffn_hidden_size if early_stop else 0.0
        return base + forward_flops_per_token(m, seq_len) - logits - skipped
    if recompute == "selective":
        layers = m.num_layers + m.num_mtp_layers
        n_moe = m.num_moe_layers + (m.num_mtp_layers if m.moe_layer(m.num_layers - 1) else 0)
        mats = 3 if m.gated_mlp else 2
        again = {"core_attn": layers * attention_core_flops_per_token(m, seq_len),
                 "mlp": (layers - n_moe) * 2.0 * mats * m.hidden_size * m.ffn_hidden_size,
                 "shared_experts": n_moe * 2.0 * mats * m.hidden_size
                 * m.shared_expert_ffn_hidden_size}
        return base + sum(v for k, v in again.items() if k in modules)
    return base


def megatron_flops_per_token(m: ModelSpec, seq_len: int) -> float:
    """Training FLOPs per token as Megatron-LM counts them for its TFLOP/s log line
    (``num_floating_point_operations`` in megatron/training/training.py, 2025): 3 x 2 x
    every matmul of the layers (MTP layers counted like the last), causal attention (half
    the ``s x s`` products), MLA's latent projections and norms, MTP's projection and
    norms, and ``1 + num_mtp_layers`` logits; no router, no biases, and the vocabulary
    unpadded."""
    h, mats = m.hidden_size, 3 if m.gated_mlp else 2
    layers = m.num_layers + m.num_mtp_layers
    n_moe = m.num_moe_layers + (m.num_mtp_layers if m.moe_layer(m.num_layers - 1) else 0)
    mlp = h * mats * (m.ffn_hidden_size * (layers - n_moe) + n_moe * (
        m.expert_ffn * m.top_k + m.shared_expert_ffn_hidden_size))
    if m.is_mla:
        q = m.q_lora_rank * (h + m.q_dim + 1) if m.q_lora_rank else h * m.q_dim
        attn = (q + m.kv_lora_rank * (h + m.num_heads * (m.head_dim + m.v_head_dim) + 1)
                + h * m.qk_rope_head_dim + m.o_dim * h)
    else:
        attn = h * (m.q_dim + m.kv_dim + m.v_dim) + m.o_dim * h
    core = seq_len * (m.q_dim + m.o_dim) / 2
    mtp = m.num_mtp_layers * (3 * h + 2 * h * h)
    logits = h * m.vocab_size * (1 + m.num_mtp_layers)
    return 6.0 * (mlp + layers * (attn + core) + mtp + logits)
