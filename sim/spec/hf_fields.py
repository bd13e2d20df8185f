"""What reading a Hugging Face ``config.json`` shares across model families: transformers'
defaults and key aliases per ``model_type``, the size limits its keys share with ModelSpec
fields, a typed accessor (:class:`Config`) and the field groups several families build
from. The families' converters are in :mod:`sim.spec.hf_config` (dense, the first MoE) and
:mod:`sim.spec.hf_moe` (the later MoE families)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sim.errors import SpecError
from sim.spec.limits import MODEL_LIMITS, at_most

__all__ = ["Config", "rope_fields", "biases", "window", "all_layers", "from_max_window",
           "qwen3_fields", "qwen2_moe_experts"]

# transformers' defaults for the optional keys (5.24), as hf_config's _DEFAULTS.
_MOE_DEFAULTS: dict[str, dict[str, Any]] = {
    "qwen3_moe": {"num_key_value_heads": 4, "head_dim": 128, "max_position_embeddings": 32768,
                  "num_experts": 128, "num_experts_per_tok": 8, "moe_intermediate_size": 768,
                  "decoder_sparse_step": 1, "sliding_window": 4096, "max_window_layers": 28},
    "olmoe": {"num_key_value_heads": 16, "max_position_embeddings": 4096, "num_experts": 64,
              "num_experts_per_tok": 8},
    "gpt_oss": {"num_key_value_heads": 8, "head_dim": 64, "max_position_embeddings": 131072,
                "num_local_experts": 128, "num_experts_per_tok": 4, "sliding_window": 128},
    "llama4_text": {"num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 131072,
                    "num_local_experts": 16, "num_experts_per_tok": 1,
                    "interleave_moe_layer_step": 1, "attention_chunk_size": 8192},
    "dbrx": {"max_seq_len": 2048},
    "deepseek_v3": {"vocab_size": 129280, "hidden_size": 7168, "intermediate_size": 18432,
                    "moe_intermediate_size": 2048, "num_hidden_layers": 61,
                    "num_attention_heads": 128, "num_key_value_heads": 128,
                    "n_shared_experts": 1, "n_routed_experts": 256, "kv_lora_rank": 512,
                    "q_lora_rank": 1536, "qk_rope_head_dim": 64, "v_head_dim": 128,
                    "qk_nope_head_dim": 128, "n_group": 8, "topk_group": 4,
                    "num_experts_per_tok": 8, "first_k_dense_replace": 3,
                    "max_position_embeddings": 4096, "num_nextn_predict_layers": 1},
}
# A config.json may use the left name for the right one.
_MOE_ALIASES: dict[str, dict[str, str]] = {
    "qwen3_moe": {"num_local_experts": "num_experts"},
    "olmoe": {"num_local_experts": "num_experts"},
    "gpt_oss": {"num_experts": "num_local_experts"},
    "deepseek_v3": {"num_local_experts": "n_routed_experts",
                    "num_mtp_layers": "num_nextn_predict_layers"},
}

# transformers' ``attribute_map``: a config.json may use the left name for the right one.
_ALIASES: dict[str, dict[str, str]] = {
    "gpt2": {"hidden_size": "n_embd", "num_hidden_layers": "n_layer",
             "num_attention_heads": "n_head", "max_position_embeddings": "n_positions"},
    "mixtral": {"num_experts": "num_local_experts"},
    **_MOE_ALIASES,
}

_ROPE_WINDOW = {"sliding_window": 4096, "max_window_layers": 28}  # Qwen's, off by default
_GEMMA = {"num_key_value_heads": 4, "head_dim": 256, "tie_word_embeddings": True,
          "sliding_window": 4096}
# transformers' defaults for optional keys (configuration_<model_type>.py), under the file's.
_DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": {"max_position_embeddings": 2048},
    "mistral": {"num_key_value_heads": 8, "max_position_embeddings": 4096 * 32,
                "sliding_window": 4096},
    "mixtral": {"num_key_value_heads": 8, "max_position_embeddings": 4096 * 32,
                "num_local_experts": 8, "num_experts_per_tok": 2},
    "qwen2": {"num_key_value_heads": 32, "max_position_embeddings": 32768, **_ROPE_WINDOW},
    "qwen2_moe": {"num_key_value_heads": 16, "max_position_embeddings": 32768, **_ROPE_WINDOW,
                  "num_experts": 60, "num_experts_per_tok": 4, "moe_intermediate_size": 1408,
                  "decoder_sparse_step": 1, "qkv_bias": True},
    "qwen3": {"num_key_value_heads": 32, "head_dim": 128, "max_position_embeddings": 32768,
              **_ROPE_WINDOW},
    "gemma2": {**_GEMMA, "max_position_embeddings": 8192},
    "gemma3_text": {**_GEMMA, "num_attention_heads": 8, "vocab_size": 262_208,
                    "max_position_embeddings": 131_072, "sliding_window_pattern": 6},
    "phi3": {"max_position_embeddings": 4096},
    "olmo2": {"max_position_embeddings": 2048},
    "gpt2": {"n_positions": 1024, "tie_word_embeddings": True},
    **_MOE_DEFAULTS,
}

# Config keys that size a ModelSpec field: they share its upper limit (sim.spec.limits).
_LIMITED = {"num_hidden_layers": "num_layers", "n_layer": "num_layers", "n_embd": "hidden_size",
            "hidden_size": "hidden_size", "num_attention_heads": "num_heads",
            "n_head": "num_heads", "num_key_value_heads": "num_kv_heads",
            "head_dim": "head_dim", "intermediate_size": "ffn_hidden_size",
            "n_inner": "ffn_hidden_size", "vocab_size": "vocab_size",
            "max_position_embeddings": "max_seq_len", "n_positions": "max_seq_len",
            "num_experts": "num_experts", "num_local_experts": "num_experts",
            "moe_intermediate_size": "moe_ffn_hidden_size",
            "shared_expert_intermediate_size": "shared_expert_ffn_hidden_size",
            "decoder_sparse_step": "moe_layer_step", "sliding_window": "sliding_window",
            "max_window_layers": "num_layers", "sliding_window_pattern": "num_layers",
            "n_routed_experts": "num_experts", "q_lora_rank": "q_lora_rank",
            "kv_lora_rank": "kv_lora_rank", "qk_rope_head_dim": "qk_rope_head_dim",
            "qk_nope_head_dim": "head_dim", "v_head_dim": "v_head_dim",
            "n_group": "expert_groups", "first_k_dense_replace": "num_layers",
            "num_nextn_predict_layers": "num_mtp_layers"}


class Config:
    """A config.json dict, under transformers' defaults, with typed, key-naming accessors."""

    def __init__(self, raw: dict[str, Any], model_type: str, where: str = "config.json ") -> None:
        aliases = _ALIASES.get(model_type, {})
        own = {**{aliases[k]: v for k, v in raw.items() if k in aliases}, **raw}
        self.raw = {**_DEFAULTS.get(model_type, {}), **own}
        self.model_type, self.where = model_type, where

    def _int(self, key: str, value: Any, minimum: int) -> int:
        field = f"{self.where}{key}"
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise SpecError(field, f"must be an integer >= {minimum}, got {value!r}")
        if key in _LIMITED:
            at_most(field, value, *MODEL_LIMITS[_LIMITED[key]])
        return value

    def required(self, key: str) -> int:
        """A size field with no default: missing (or null) is an error."""
        if self.raw.get(key) is None:
            raise SpecError(f"{self.where}{key}", f"is required for model_type {self.model_type}")
        return self._int(key, self.raw[key], 1)

    def integer(self, key: str, minimum: int = 1) -> int:
        """A field with a default in :data:`_DEFAULTS`."""
        return self._int(key, self.raw.get(key), minimum)

    def optional(self, key: str, minimum: int = 1) -> int | None:
        """A field transformers lets be null (it then derives the value): None stays None."""
        value = self.raw.get(key)
        return None if value is None else self._int(key, value, minimum)

    def flag(self, key: str) -> bool:
        value = self.raw.get(key, False)
        if not isinstance(value, bool):
            raise SpecError(f"{self.where}{key}", f"must be true or false, got {value!r}")
        return value

    def int_list(self, key: str) -> list[int]:
        value = self.raw.get(key)
        if value is None:
            return []
        if not isinstance(value, list):
            raise SpecError(f"{self.where}{key}", f"must be a list of integers, got {value!r}")
        at_most(f"{self.where}{key}", len(value), MODEL_LIMITS["num_layers"][0], "entries")
        return [self._int(key, v, 0) for v in value]

    def layer_types(self, layers: int) -> list[str] | None:
        """``layer_types`` (one attention kind per layer) if the file lists them."""
        value, field = self.raw.get("layer_types"), f"{self.where}layer_types"
        if value is None:
            return None
        if not isinstance(value, list) or not all(isinstance(t, str) for t in value):
            raise SpecError(field, f"must be a list of strings, got {str(value)[:80]}")
        if len(value) != layers:
            raise SpecError(field, f"lists {len(value)} layers, num_hidden_layers is {layers}")
        return value


def rope_fields(c: Config) -> dict[str, Any]:
    """The ModelSpec fields shared by the Llama-like (RMSNorm, RoPE, gated MLP) families."""
    heads = c.required("num_attention_heads")
    return {
        "num_layers": c.required("num_hidden_layers"),
        "hidden_size": c.required("hidden_size"),
        "num_heads": heads,
        "vocab_size": c.required("vocab_size"),
        "ffn_hidden_size": c.required("intermediate_size"),
        "num_kv_heads": c.optional("num_key_value_heads") or heads,
        "head_dim": c.optional("head_dim") or 0,
        "max_seq_len": c.integer("max_position_embeddings"),
        "tied_embeddings": c.flag("tie_word_embeddings"),
        "gated_mlp": True,
        "norm": "rmsnorm",
        "position_embedding": "rope",
    }


def biases(c: Config) -> dict[str, Any]:
    attn, mlp = c.flag("attention_bias"), c.flag("mlp_bias")
    if mlp and not attn:
        raise SpecError(f"{c.where}mlp_bias", "true with attention_bias false is not supported")
    return {"linear_bias": attn and mlp, "qkv_bias": attn and not mlp}


def window(c: Config, layers: int, pattern: Callable[[int], int],
            switch: str | None = None) -> dict[str, Any]:
    """``sliding_window`` and the number of layers using it: from ``layer_types`` when the
    file lists them, else ``pattern(layers)`` (the family's rule); none when the window is
    null or 0, or ``switch`` (``use_sliding_window``) is false."""
    window = c.optional("sliding_window", minimum=0)
    if not window or (switch is not None and not c.flag(switch)):
        return {}
    types = c.layer_types(layers)
    count = pattern(layers) if types is None else types.count("sliding_attention")
    return {"sliding_window": window, "sliding_window_layers": count} if count else {}


def all_layers(layers: int) -> int:
    return layers


def from_max_window(c: Config) -> Callable[[int], int]:
    """Qwen2/Qwen3: layers from ``max_window_layers`` on use the window."""
    return lambda layers: max(0, layers - c.integer("max_window_layers", 0))



def qwen3_fields(c: Config) -> dict[str, Any]:
    fields = rope_fields(c)
    return {**fields, **biases(c), "qk_norm": "head", **window(
        c, fields["num_layers"], from_max_window(c), "use_sliding_window")}



def qwen2_moe_experts(c: Config) -> dict[str, Any]:
    """The MoE fields of a Qwen2-MoE config; none when ``num_experts`` is 0 (all dense)."""
    experts = c.integer("num_experts", minimum=0)
    if experts == 0:
        return {}
    return {
        "num_experts": experts,
        "top_k": c.integer("num_experts_per_tok"),
        "moe_ffn_hidden_size": c.integer("moe_intermediate_size"),
        "shared_expert_ffn_hidden_size": c.optional("shared_expert_intermediate_size", 0) or 0,
        "moe_layer_step": c.integer("decoder_sparse_step"),
        "mlp_only_layers": tuple(c.int_list("mlp_only_layers")),
    }


