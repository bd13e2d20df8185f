"""Read a Hugging Face ``config.json`` into a :class:`~sim.spec.model.ModelSpec`.

Each supported ``model_type`` has a converter in :data:`_CONVERTERS`. Optional keys take the
defaults transformers' config classes give them (:data:`_DEFAULTS`; checked against
transformers 5.25.0, and 4.46.3 for the types it has), but the core size fields (width,
depth, heads, vocabulary, MLP width) are required: a silently assumed size would make every
answer wrong. Gemma 3 is the exception: Google's configs leave heads, ``head_dim`` and the
vocabulary to transformers' defaults (gemma-3-4b names only width, depth and MLP width).
A multimodal ``gemma3`` config is read from its ``text_config``: the ModelSpec is the
language model; the vision tower and projector (0.42 B of gemma-3-12b's 12.19 B) are not
in it. Bad input raises :class:`~sim.errors.SpecError` naming the config key.

Known approximations:

* ``attention_bias`` without ``mlp_bias`` maps to ``qkv_bias``, so the output projection's
  bias (``hidden_size`` per layer) is not counted;
* sliding-window attention (mistral, mixtral, phi3, gemma2, gemma3, and qwen2/qwen2_moe/qwen3
  with ``use_sliding_window``) is recorded in ``sliding_window`` and
  ``sliding_window_layers`` but simulated as full attention, with a warning in the result.

A ``qwen2_moe`` config has a shared expert only if it names
``shared_expert_intermediate_size``: transformers would default it to 5632, but a config
without the key is most likely another model's relabelled (Qwen3-MoE has no shared expert),
and an expert the file does not describe would inflate every number.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sim.errors import SpecError
from sim.spec.limits import MODEL_LIMITS, at_most
from sim.spec.model import ModelSpec

__all__ = ["SUPPORTED_MODEL_TYPES", "load_hf_config", "hf_config_to_spec"]

# transformers' ``attribute_map``: a config.json may use the left name for the right one.
_ALIASES: dict[str, dict[str, str]] = {
    "gpt2": {"hidden_size": "n_embd", "num_hidden_layers": "n_layer",
             "num_attention_heads": "n_head", "max_position_embeddings": "n_positions"},
    "mixtral": {"num_experts": "num_local_experts"},
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
            "max_window_layers": "num_layers", "sliding_window_pattern": "num_layers"}


class _Config:
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


def _rope_fields(c: _Config) -> dict[str, Any]:
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


def _biases(c: _Config) -> dict[str, Any]:
    attn, mlp = c.flag("attention_bias"), c.flag("mlp_bias")
    if mlp and not attn:
        raise SpecError(f"{c.where}mlp_bias", "true with attention_bias false is not supported")
    return {"linear_bias": attn and mlp, "qkv_bias": attn and not mlp}


def _window(c: _Config, layers: int, pattern: Callable[[int], int],
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


def _all(layers: int) -> int:
    return layers


def _from_max_window(c: _Config) -> Callable[[int], int]:
    """Qwen2/Qwen3: layers from ``max_window_layers`` on use the window."""
    return lambda layers: max(0, layers - c.integer("max_window_layers", 0))


def _llama(c: _Config, name: str) -> ModelSpec:
    return ModelSpec(name=name, **_rope_fields(c), **_biases(c))


def _mistral(c: _Config, name: str) -> ModelSpec:  # also mixtral and phi3 (dense part)
    fields = _rope_fields(c)
    return ModelSpec(name=name, **fields, **_window(c, fields["num_layers"], _all))


def _mixtral(c: _Config, name: str) -> ModelSpec:
    fields = _rope_fields(c)
    return ModelSpec(name=name, **fields, **_window(c, fields["num_layers"], _all),
                     moe_ffn_hidden_size=fields["ffn_hidden_size"],
                     num_experts=c.integer("num_local_experts"),
                     top_k=c.integer("num_experts_per_tok"))


def _qwen2(c: _Config, name: str) -> ModelSpec:
    fields = _rope_fields(c)
    return ModelSpec(name=name, **fields, qkv_bias=True, **_window(
        c, fields["num_layers"], _from_max_window(c), "use_sliding_window"))


def _qwen3(c: _Config, name: str) -> ModelSpec:
    fields = _rope_fields(c)
    return ModelSpec(name=name, **fields, **_biases(c), qk_norm="head", **_window(
        c, fields["num_layers"], _from_max_window(c), "use_sliding_window"))


def _olmo2(c: _Config, name: str) -> ModelSpec:
    """OLMo 2: norms after attention and MLP (two a layer), q/k norms over the full width."""
    return ModelSpec(name=name, **_rope_fields(c), **_biases(c), qk_norm="full")


def _gemma2(c: _Config, name: str) -> ModelSpec:
    """Gemma 2: a norm before and after attention and MLP; every other layer (0, 2, ...)
    uses the sliding window. GeGLU is gated like SwiGLU: three matrices."""
    fields = _rope_fields(c)
    return ModelSpec(name=name, **fields, **_biases(c), norms_per_layer=4,
                     **_window(c, fields["num_layers"], lambda n: (n + 1) // 2))


def _gemma3_text(c: _Config, name: str) -> ModelSpec:
    """Gemma 3: Gemma 2's layer with per-head q/k norms; layer i uses the window unless
    ``(i + 1) % sliding_window_pattern == 0`` (five local layers to one global)."""
    fields = _rope_fields(c)
    every = c.integer("sliding_window_pattern")
    return ModelSpec(name=name, **fields, **_biases(c), norms_per_layer=4, qk_norm="head",
                     **_window(c, fields["num_layers"], lambda n: n - n // every))


def _gemma3(c: _Config, name: str) -> ModelSpec:
    """A multimodal Gemma 3: its language model, ``text_config`` (tied embeddings unless
    the text or the top level says otherwise)."""
    text = c.raw.get("text_config")
    if not isinstance(text, dict):
        raise SpecError(f"{c.where}text_config", "must be an object holding the language "
                        f"model's config (model_type gemma3_text), got {str(text)[:80]}")
    if text.get("model_type", "gemma3_text") != "gemma3_text":
        raise SpecError(f"{c.where}text_config.model_type",
                        f"must be gemma3_text, got {text['model_type']!r}")
    tie = {"tie_word_embeddings": c.raw["tie_word_embeddings"]} \
        if "tie_word_embeddings" in c.raw else {}
    return _gemma3_text(_Config({**tie, **text}, "gemma3_text", f"{c.where}text_config."), name)


def _qwen2_moe_experts(c: _Config) -> dict[str, Any]:
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


def _qwen2_moe(c: _Config, name: str) -> ModelSpec:
    moe = _qwen2_moe_experts(c)
    layers = c.required("num_hidden_layers")
    has_dense = (not moe or moe["moe_layer_step"] > 1
                 or any(i < layers for i in moe["mlp_only_layers"]))
    # intermediate_size only sizes the dense layers; required only when there are some.
    if not has_dense and c.raw.get("intermediate_size") is None:
        c.raw["intermediate_size"] = 5632
    window = _window(c, layers, lambda n: (min(n, c.integer("max_window_layers", 0)) + 1) // 2,
                     "use_sliding_window")  # even layers below max_window_layers
    return ModelSpec(name=name, **_rope_fields(c), **moe, **window,
                     qkv_bias=c.flag("qkv_bias"))


def _gpt2(c: _Config, name: str) -> ModelSpec:
    hidden = c.required("n_embd")
    return ModelSpec(
        name=name, num_layers=c.required("n_layer"), hidden_size=hidden,
        num_heads=c.required("n_head"), vocab_size=c.required("vocab_size"),
        ffn_hidden_size=c.optional("n_inner") or 4 * hidden,
        max_seq_len=c.integer("n_positions"), tied_embeddings=c.flag("tie_word_embeddings"),
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
    "qwen3": _qwen3,
    "gemma2": _gemma2,
    "gemma3": _gemma3,
    "gemma3_text": _gemma3_text,
    "phi3": _mistral,  # Llama's layer with fused QKV and gate/up matrices: the same sizes
    "olmo2": _olmo2,
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
                        f"unsupported {str(model_type)[:80]!r} (supported: {supported})")
    return _CONVERTERS[model_type](_Config(cfg, model_type), name)


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise SpecError("model", f"no such file: {path}")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise SpecError("config.json", f"not valid JSON: {exc.msg} at line {exc.lineno} "
                        f"column {exc.colno} of {path}") from None
    except (OSError, ValueError) as exc:  # ValueError: not UTF-8, or over 4,300 digits
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
