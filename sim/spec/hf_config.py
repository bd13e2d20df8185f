"""Read a Hugging Face ``config.json`` into a :class:`~sim.spec.model.ModelSpec`.

Each supported ``model_type`` has a converter in :data:`_CONVERTERS` (the later MoE families'
in :mod:`sim.spec.hf_moe`; what they share, in :mod:`sim.spec.hf_fields`). Optional keys take
the defaults transformers' config classes give them (``hf_fields._DEFAULTS``; checked against
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
from sim.spec.hf_fields import Config as _Config
from sim.spec.hf_fields import all_layers as _all
from sim.spec.hf_fields import biases as _biases
from sim.spec.hf_fields import from_max_window as _from_max_window
from sim.spec.hf_fields import qwen2_moe_experts as _qwen2_moe_experts
from sim.spec.hf_fields import qwen3_fields as _qwen3_fields
from sim.spec.hf_fields import rope_fields as _rope_fields
from sim.spec.hf_fields import window as _window
from sim.spec.hf_moe import MOE_CONVERTERS, NOT_MODELLED
from sim.spec.model import ModelSpec

__all__ = ["SUPPORTED_MODEL_TYPES", "load_hf_config", "hf_config_to_spec"]

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
    return ModelSpec(name=name, **_qwen3_fields(c))


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
    **MOE_CONVERTERS,
}

SUPPORTED_MODEL_TYPES: tuple[str, ...] = tuple(sorted(_CONVERTERS))


def hf_config_to_spec(cfg: dict[str, Any], name: str) -> ModelSpec:
    """The ModelSpec described by a parsed ``config.json``, named ``name``."""
    model_type = cfg.get("model_type")
    supported = ", ".join(SUPPORTED_MODEL_TYPES)
    if model_type is None:
        raise SpecError("config.json model_type", f"is required (supported: {supported})")
    if model_type in NOT_MODELLED:
        raise SpecError("config.json model_type", f"{model_type}: {NOT_MODELLED[model_type]}")
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
