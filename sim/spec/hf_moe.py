"""Hugging Face config.json -> ModelSpec for the later Mixture-of-Experts families:
``qwen3_moe``, ``olmoe``, ``gpt_oss``, ``dbrx``, ``llama4_text`` and ``llama4`` (its
``text_config``). Registered in :mod:`sim.spec.hf_config`'s table; each reads the sizes
transformers' own model classes build (checked parameter for parameter against them on the
meta device, ``tests/test_hf_moe.py``). What a ModelSpec cannot hold is named where it is
dropped: gpt-oss's attention sinks and router biases, DBRX's bias-free LayerNorms, Llama 4's
chunked attention (recorded as a window) and weight-free q/k norms.

``deepseek_v3`` is read with its multi-head latent attention, its first dense layers, its
shared expert, node-limited routing (recorded) and its multi-token prediction modules.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sim.errors import SpecError
from sim.spec.hf_fields import Config, biases, qwen2_moe_experts, qwen3_fields, rope_fields, window
from sim.spec.model import ModelSpec

__all__ = ["MOE_CONVERTERS", "NOT_MODELLED"]

NOT_MODELLED: dict[str, str] = {}


def _qwen3_moe(c: Config, name: str) -> ModelSpec:
    """Qwen3's layer (per-head q/k norms, ``head_dim``) with Qwen2-MoE's expert keys; no
    shared expert unless the file names one."""
    moe = qwen2_moe_experts(c)
    layers = c.required("num_hidden_layers")
    dense = not moe or moe["moe_layer_step"] > 1 or any(i < layers
                                                        for i in moe["mlp_only_layers"])
    if not dense and c.raw.get("intermediate_size") is None:  # sizes only dense layers
        c.raw["intermediate_size"] = moe["moe_ffn_hidden_size"]
    return ModelSpec(name=name, **qwen3_fields(c), **moe)


def _olmoe(c: Config, name: str) -> ModelSpec:
    """OLMoE: every layer MoE, ``intermediate_size`` is the expert width; q/k norms over the
    full q and kv width (as OLMo 2)."""
    width = c.required("intermediate_size")
    return ModelSpec(name=name, **rope_fields(c), **biases(c), qk_norm="full",
                     num_experts=c.integer("num_experts"),
                     top_k=c.integer("num_experts_per_tok"), moe_ffn_hidden_size=width)


def _gpt_oss(c: Config, name: str) -> ModelSpec:
    """gpt-oss: every layer MoE with biases on attention and experts, alternating
    128-token sliding-window layers. Its attention sinks (one scalar a head) and router
    biases (one an expert) are not counted: 192 parameters a layer on gpt-oss-120b."""
    fields = rope_fields(c)
    return ModelSpec(name=name, **fields, linear_bias=True,
                     num_experts=c.integer("num_local_experts"),
                     top_k=c.integer("num_experts_per_tok"),
                     moe_ffn_hidden_size=c.required("intermediate_size"),
                     **window(c, fields["num_layers"], lambda n: (n + 1) // 2))


def _llama4_text(c: Config, name: str) -> ModelSpec:
    """Llama 4: ``intermediate_size`` sizes the experts and the shared expert,
    ``intermediate_size_mlp`` the dense layers; every ``interleave_moe_layer_step``-th layer
    is MoE. Chunked attention on three layers in four (not the NoPE ones) is recorded as a
    window of ``attention_chunk_size``; the q/k norms have no weights."""
    fields = rope_fields(c)
    expert = c.required("intermediate_size")
    fields["ffn_hidden_size"] = c.required("intermediate_size_mlp")
    layers = fields["num_layers"]
    nope = c.int_list("no_rope_layers")  # 1: uses RoPE (and chunked attention)
    chunked = sum(nope) if nope else layers - layers // 4
    chunk: dict[str, Any] = {"sliding_window": c.integer("attention_chunk_size"),
                             "sliding_window_layers": chunked} if chunked else {}
    return ModelSpec(name=name, **fields, **chunk, num_experts=c.integer("num_local_experts"),
                     top_k=c.integer("num_experts_per_tok"), moe_ffn_hidden_size=expert,
                     shared_expert_ffn_hidden_size=expert, shared_expert_gate=False,
                     moe_layer_step=c.integer("interleave_moe_layer_step"))


def _llama4(c: Config, name: str) -> ModelSpec:
    """The multimodal config's ``text_config`` only (the language model)."""
    text = c.raw.get("text_config")
    if not isinstance(text, dict):
        raise SpecError(f"{c.where}text_config", "must be the language model's config "
                        f"(model_type llama4_text), got {str(text)[:80]}")
    return _llama4_text(Config(text, "llama4_text", f"{c.where}text_config."), name)


def _dbrx(c: Config, name: str) -> ModelSpec:
    """DBRX: sizes under ``attn_config`` and ``ffn_config``; its LayerNorms have no bias
    (counted with one here: 2 x d_model a layer)."""
    attn, ffn = (_sub(c, key) for key in ("attn_config", "ffn_config"))
    heads = c.required("n_heads")
    return ModelSpec(
        name=name, num_layers=c.required("n_layers"), hidden_size=c.required("d_model"),
        num_heads=heads, num_kv_heads=Config(attn, "dbrx", f"{c.where}attn_config.")
        .required("kv_n_heads"), vocab_size=c.required("vocab_size"),
        ffn_hidden_size=Config(ffn, "dbrx", f"{c.where}ffn_config.").required(
            "ffn_hidden_size"),
        max_seq_len=c.integer("max_seq_len"), tied_embeddings=c.flag("tie_word_embeddings"),
        gated_mlp=True, norm="layernorm", position_embedding="rope",
        num_experts=Config(ffn, "dbrx", f"{c.where}ffn_config.").required("moe_num_experts"),
        top_k=Config(ffn, "dbrx", f"{c.where}ffn_config.").required("moe_top_k"))


def _deepseek_v3(c: Config, name: str) -> ModelSpec:
    """DeepSeek-V3: multi-head latent attention (``q_lora_rank`` null: queries projected
    directly), ``first_k_dense_replace`` dense layers first, ``n_shared_experts`` always-on
    experts of the expert width (no gate), routing limited to ``topk_group`` of ``n_group``
    expert groups, and ``num_nextn_predict_layers`` multi-token prediction modules, which
    transformers does not build but Megatron-LM trains (``--mtp-num-layers``). The router's
    score-correction bias is a buffer, not a parameter."""
    if c.flag("attention_bias"):
        raise SpecError(f"{c.where}attention_bias", "true is not modelled for multi-head "
                        "latent attention (DeepSeek-V3 has none)")
    fields = rope_fields(c)
    first_dense = c.integer("first_k_dense_replace", minimum=0)
    expert = c.integer("moe_intermediate_size")
    groups = c.optional("n_group") or 0
    return ModelSpec(
        name=name, **{**fields, "head_dim": c.integer("qk_nope_head_dim")},
        q_lora_rank=c.optional("q_lora_rank") or 0, kv_lora_rank=c.integer("kv_lora_rank"),
        qk_rope_head_dim=c.integer("qk_rope_head_dim", minimum=0),
        v_head_dim=c.integer("v_head_dim"), num_experts=c.integer("n_routed_experts"),
        top_k=c.integer("num_experts_per_tok"), moe_ffn_hidden_size=expert,
        shared_expert_ffn_hidden_size=expert * c.integer("n_shared_experts", minimum=0),
        shared_expert_gate=False,
        mlp_only_layers=tuple(range(min(first_dense, fields["num_layers"]))),
        expert_groups=groups,
        expert_groups_per_token=(c.optional("topk_group") or groups) if groups else 0,
        num_mtp_layers=c.integer("num_nextn_predict_layers", minimum=0))


def _sub(c: Config, key: str) -> dict[str, Any]:
    value = c.raw.get(key, {})
    if not isinstance(value, dict):
        raise SpecError(f"{c.where}{key}", f"must be an object, got {str(value)[:80]}")
    return value


MOE_CONVERTERS: dict[str, Callable[[Config, str], ModelSpec]] = {
    "qwen3_moe": _qwen3_moe,
    "olmoe": _olmoe,
    "gpt_oss": _gpt_oss,
    "llama4_text": _llama4_text,
    "llama4": _llama4,
    "dbrx": _dbrx,
    "deepseek_v3": _deepseek_v3,
}
