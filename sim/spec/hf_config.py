"""Read a Hugging Face ``config.json`` into a :class:`~sim.spec.model.ModelSpec`.

Each supported ``model_type`` has a converter in :data:`_CONVERTERS`. Optional fields get
the defaults that transformers' config classes give them (checked against
transformers 4.46.3 and 5.25.0), but the core size fields (width, depth, heads,
vocabulary, MLP width) are required: a silently assumed size would make every answer
wrong. Bad input raises :class:`~sim.errors.SpecError` naming the config field.

Known approximation: a Llama config with ``attention_bias`` but no ``mlp_bias`` maps to
``qkv_bias``, so the output projection's bias (``hidden_size`` per layer) is not counted.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sim.errors import SpecError
from sim.spec.model import ModelSpec

__all__ = ["SUPPORTED_MODEL_TYPES", "load_hf_config", "hf_config_to_spec"]

# transformers' ``attribute_map``: a config.json may use the left name for the right one.
_ALIASES: dict[str, dict[str, str]] = {
    "gpt2": {"hidden_size": "n_embd", "num_hidden_layers": "n_layer",
             "num_attention_heads": "n_head", "max_position_embeddings": "n_positions"},
    "mixtral": {"num_experts": "num_local_experts"},
}


class _Config:
    """A config.json dict with typed, field-naming accessors."""

    def __init__(self, raw: dict[str, Any], model_type: str) -> None:
        aliases = _ALIASES.get(model_type, {})
        self.raw = {**{aliases[k]: v for k, v in raw.items() if k in aliases}, **raw}
        self.model_type = model_type

    def _int(self, key: str, value: Any, minimum: int) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise SpecError(f"config.json {key}", f"must be an integer >= {minimum}, got {value!r}")
        return value

    def required(self, key: str) -> int:
        """A size field with no default: missing (or null) is an error."""
        if self.raw.get(key) is None:
            raise SpecError(f"config.json {key}", f"is required for model_type {self.model_type}")
        return self._int(key, self.raw[key], 1)

    def integer(self, key: str, default: int, minimum: int = 1) -> int:
        return self._int(key, self.raw.get(key, default), minimum)

    def optional(self, key: str, default: int | None = None) -> int | None:
        """A field transformers lets be null (it then derives the value): None stays None."""
        value = self.raw.get(key, default)
        return None if value is None else self._int(key, value, 1)

    def flag(self, key: str, default: bool) -> bool:
        value = self.raw.get(key, default)
        if not isinstance(value, bool):
            raise SpecError(f"config.json {key}", f"must be true or false, got {value!r}")
        return value

    def int_list(self, key: str) -> list[int]:
        value = self.raw.get(key)
        if value is None:
            return []
        if not isinstance(value, list):
            raise SpecError(f"config.json {key}", f"must be a list of integers, got {value!r}")
        return [self._int(key, v, 0) for v in value]


def _rope_fields(c: _Config, kv_default: int | None, max_positions: int) -> dict[str, Any]:
    """The ModelSpec fields shared by the Llama-like (RMSNorm, RoPE, SwiGLU) families."""
    heads = c.required("num_attention_heads")
    return {
        "num_layers": c.required("num_hidden_layers"),
        "hidden_size": c.required("hidden_size"),
        "num_heads": heads,
        "vocab_size": c.required("vocab_size"),
        "num_kv_heads": c.optional("num_key_value_heads", kv_default) or heads,
        "head_dim": c.optional("head_dim") or 0,
        "max_seq_len": c.integer("max_position_embeddings", max_positions),
        "tied_embeddings": c.flag("tie_word_embeddings", False),
        "gated_mlp": True,
        "norm": "rmsnorm",
        "position_embedding": "rope",
    }


def _llama_biases(c: _Config) -> dict[str, Any]:
    attn, mlp = c.flag("attention_bias", False), c.flag("mlp_bias", False)
    if mlp and not attn:
        raise SpecError("config.json mlp_bias", "true with attention_bias false is not supported")
    return {"linear_bias": attn and mlp, "qkv_bias": attn and not mlp}


def _llama(c: _Config, name: str) -> ModelSpec:
    return ModelSpec(name=name, **_rope_fields(c, None, 2048), **_llama_biases(c),
                     ffn_hidden_size=c.required("intermediate_size"))


def _mistral(c: _Config, name: str) -> ModelSpec:
    return ModelSpec(name=name, **_rope_fields(c, 8, 4096 * 32),
                     ffn_hidden_size=c.required("intermediate_size"))


def _mixtral(c: _Config, name: str) -> ModelSpec:
    ffn = c.required("intermediate_size")
    return ModelSpec(name=name, **_rope_fields(c, 8, 4096 * 32), ffn_hidden_size=ffn,
                     moe_ffn_hidden_size=ffn, num_experts=c.integer("num_local_experts", 8),
                     top_k=c.integer("num_experts_per_tok", 2))


def _qwen2(c: _Config, name: str) -> ModelSpec:
    return ModelSpec(name=name, **_rope_fields(c, 32, 32768), qkv_bias=True,
                     ffn_hidden_size=c.required("intermediate_size"))


def _qwen2_moe_experts(c: _Config) -> dict[str, Any]:
    """The MoE fields of a Qwen2-MoE config; none when ``num_experts`` is 0 (all dense)."""
    experts = c.integer("num_experts", 60, minimum=0)
    if experts == 0:
        return {}
    return {
        "num_experts": experts,
        "top_k": c.integer("num_experts_per_tok", 4),
        "moe_ffn_hidden_size": c.integer("moe_intermediate_size", 1408),
        "shared_expert_ffn_hidden_size": c.integer("shared_expert_intermediate_size", 5632, 0),
        "moe_layer_step": c.integer("decoder_sparse_step", 1),
        "mlp_only_layers": tuple(c.int_list("mlp_only_layers")),
    }


def _qwen2_moe(c: _Config, name: str) -> ModelSpec:
    fields = _rope_fields(c, 16, 32768)
    moe = _qwen2_moe_experts(c)
    layers = range(fields["num_layers"])
    has_dense = (not moe or moe["moe_layer_step"] > 1
                 or any(i in layers for i in moe["mlp_only_layers"]))
    # intermediate_size only sizes the dense layers; required only when there are some.
    ffn = c.required("intermediate_size") if has_dense else c.integer("intermediate_size", 5632)
    return ModelSpec(name=name, **fields, **moe, ffn_hidden_size=ffn,
                     qkv_bias=c.flag("qkv_bias", True))


def _gpt2(c: _Config, name: str) -> ModelSpec:
    hidden = c.required("n_embd")
    return ModelSpec(
        name=name, num_layers=c.required("n_layer"), hidden_size=hidden,
        num_heads=c.required("n_head"), vocab_size=c.required("vocab_size"),
        ffn_hidden_size=c.optional("n_inner") or 4 * hidden,
        max_seq_len=c.integer("n_positions", 1024),
        tied_embeddings=c.flag("tie_word_embeddings", True),
        gated_mlp=False, norm="layernorm", position_embedding="learned",
        linear_bias=True, dropout=True,
    )


_CONVERTERS: dict[str, Callable[[_Config, str], ModelSpec]] = {
    "llama": _llama,
    "mistral": _mistral,
    "mixtral": _mixtral,
    "gpt2": _gpt2,
    "qwen2": _qwen2,
    "qwen2_moe": _qwen2_moe,
}

SUPPORTED_MODEL_TYPES: tuple[str, ...] = tuple(sorted(_CONVERTERS))


def hf_config_to_spec(cfg: dict[str, Any], name: str) -> ModelSpec:
    """The ModelSpec described by a parsed ``config.json``, named ``name``."""
    model_type = cfg.get("model_type")
    supported = ", ".join(SUPPORTED_MODEL_TYPES)
    if model_type is None:
        raise SpecError("config.json model_type", f"is required (supported: {supported})")
    if not isinstance(model_type, str) or model_type not in _CONVERTERS:
        raise SpecError("config.json model_type",
                        f"unsupported {model_type!r} (supported: {supported})")
    return _CONVERTERS[model_type](_Config(cfg, model_type), name)


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise SpecError("model", f"no such file: {path}")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise SpecError("config.json", f"not valid JSON: {exc.msg} at line {exc.lineno} "
                        f"column {exc.colno} of {path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError("config.json", f"cannot read {path}: {exc}") from None
    if not isinstance(data, dict):
        raise SpecError("config.json", f"top level must be a JSON object, got "
                        f"{type(data).__name__} in {path}")
    return data


def _spec_name(cfg: dict[str, Any], path: Path) -> str:
    """``_name_or_path`` if set, else the folder holding the file, else ``hf-model``."""
    name = cfg.get("_name_or_path")
    if name is not None and not isinstance(name, str):
        raise SpecError("config.json _name_or_path", f"must be a string, got {name!r}")
    return name or path.absolute().parent.name or "hf-model"


def load_hf_config(path: str | Path) -> ModelSpec:
    """The ModelSpec of a ``config.json`` file, or of a folder that holds one."""
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    cfg = _read_json(path)
    return hf_config_to_spec(cfg, _spec_name(cfg, path))
