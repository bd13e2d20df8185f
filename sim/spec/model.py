"""ModelSpec: the architecture of a decoder-only transformer.

Zoo presets and loading by reference live in :mod:`sim.spec.zoo`; Hugging Face
``config.json`` files are read by :mod:`sim.spec.hf_config`. Nothing here knows about
hardware or plans.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from sim.errors import SpecError, field_name
from sim.spec.limits import MAX_LAYERS, MODEL_LIMITS, at_most

__all__ = ["ModelSpec"]

NORMS = ("layernorm", "rmsnorm")
MLA_FIELDS = ("q_lora_rank", "kv_lora_rank", "qk_rope_head_dim", "v_head_dim")
POSITIONS = ("learned", "rope")
QK_NORMS = ("none", "head", "full")


@dataclass(frozen=True)
class ModelSpec:
    """Architecture only. Sizes are counts of elements, not bytes.

    MoE: ``num_experts > 0`` makes the MLP of every ``moe_layer_step``-th layer
    (except those in ``mlp_only_layers``) a mixture of ``num_experts`` experts of
    width ``moe_ffn_hidden_size``, ``top_k`` active per token, plus an optional
    always-on shared expert of width ``shared_expert_ffn_hidden_size``.

    Multi-head latent attention (MLA, DeepSeek-V2/V3): ``kv_lora_rank > 0`` compresses keys
    and values through a rank-``kv_lora_rank`` latent (and queries through ``q_lora_rank``
    when set); every head's query and key are ``head_dim`` (the part without position)
    plus ``qk_rope_head_dim`` (rotary) wide, its value ``v_head_dim``. Multi-token prediction
    adds ``num_mtp_layers`` modules after the last layer (DeepSeek-V3: one), each a
    projection of ``2h`` to ``h``, two norms and a layer like the last, sharing the
    embedding and the output layer. Node-limited routing (``expert_groups``,
    ``expert_groups_per_token``: DeepSeek-V3's n_group and topk_group) is recorded.

    Sliding-window attention is recorded, not simulated: every layer runs full attention,
    and :meth:`seq_len_warnings` says so when the window is shorter than the sequence.
    Sizes are capped (:mod:`sim.spec.limits`), far above any real model.
    """

    name: str  # label of the model (a zoo name, the config's folder, or the TOML file's stem)
    num_layers: int  # transformer layers
    hidden_size: int  # model width h
    num_heads: int  # attention heads a
    ffn_hidden_size: int  # MLP inner width (of a dense layer)
    vocab_size: int  # vocabulary size (embedding and output layer rows)
    num_kv_heads: int = 0  # 0: same as num_heads (multi-head attention)
    head_dim: int = 0  # 0: hidden_size // num_heads
    max_seq_len: int = 2048  # longest sequence the model is built for (learned positions)
    gated_mlp: bool = False  # SwiGLU-style: three matrices instead of two
    norm: str = "layernorm"  # `layernorm` or `rmsnorm`
    position_embedding: str = "learned"  # `learned` (GPT) or `rope` (rotary, Llama)
    tied_embeddings: bool = True  # output layer shares the input embedding's weights
    linear_bias: bool = False  # biases on every linear layer (GPT-2 / Megatron GPT)
    qkv_bias: bool = False  # bias on the QKV projection only (Qwen2)
    dropout: bool = False  # dropout layers present (they keep masks in memory)
    num_experts: int = 0  # experts per MoE layer; 0: a dense model
    top_k: int = 0  # experts active per token (1..num_experts; 0 for a dense model)
    moe_ffn_hidden_size: int = 0  # 0: ffn_hidden_size
    shared_expert_ffn_hidden_size: int = 0  # width of an always-on shared expert; 0: none
    moe_layer_step: int = 1  # every k-th layer is an MoE layer
    mlp_only_layers: tuple[int, ...] = ()  # indices of layers kept dense in an MoE model
    # hidden-size norms in a layer: 2 (before attention and MLP); Gemma 2 and 3 add two after
    norms_per_layer: int = 2
    # norm on queries and keys: `none`, `head` (one head_dim-wide weight each: Qwen3,
    # Gemma 3) or `full` (q_dim- and kv_dim-wide: OLMo 2)
    qk_norm: str = "none"
    sliding_window: int = 0  # tokens a sliding-window layer looks back over; 0: none
    # layers that use the window (simulated as full attention, with a warning)
    sliding_window_layers: int = 0
    # the shared expert's output goes through a sigmoid gate (Qwen2-MoE; not DeepSeek, Llama 4)
    shared_expert_gate: bool = True
    q_lora_rank: int = 0  # MLA: rank of the query down-projection; 0: queries projected directly
    kv_lora_rank: int = 0  # MLA: rank of the joint key-value latent; 0: no MLA
    qk_rope_head_dim: int = 0  # MLA: rotary part of each query and key head
    v_head_dim: int = 0  # MLA: width of each value head
    expert_groups: int = 0  # experts fall in this many groups (n_group); 0: no groups
    expert_groups_per_token: int = 0  # groups a token's experts come from (topk_group)
    num_mtp_layers: int = 0  # multi-token prediction modules after the last layer

    def __post_init__(self) -> None:
        self._check_types()
        for f in ("num_layers", "hidden_size", "num_heads", "ffn_hidden_size", "vocab_size",
                  "max_seq_len", "moe_layer_step"):
            _require_positive_int(f, getattr(self, f))
        for f in ("num_kv_heads", "head_dim", "num_experts", "top_k", "moe_ffn_hidden_size",
                  "shared_expert_ffn_hidden_size", "norms_per_layer", "sliding_window",
                  "sliding_window_layers", *MLA_FIELDS, "expert_groups",
                  "expert_groups_per_token", "num_mtp_layers"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise SpecError(f"model.{f}", f"must be an integer >= 0, got {v!r}")
        for f, (limit, unit) in MODEL_LIMITS.items():
            at_most(f"model.{f}", getattr(self, f), limit, unit)
        self._check_choices()
        self._check_sizes()
        self._check_mla()
        self._check_groups()

    def _check_choices(self) -> None:
        if self.norm not in NORMS:
            raise SpecError("model.norm", f"must be one of {', '.join(NORMS)}, got {self.norm!r}")
        if self.position_embedding not in POSITIONS:
            raise SpecError("model.position_embedding", f"must be one of {', '.join(POSITIONS)}, "
                            f"got {self.position_embedding!r}")
        if self.qk_norm not in QK_NORMS:
            raise SpecError("model.qk_norm", f"must be one of {', '.join(QK_NORMS)}, "
                            f"got {self.qk_norm!r}")

    def _check_sizes(self) -> None:
        if self.num_heads % self.kv_heads:
            raise SpecError("model.num_kv_heads", f"num_heads {self.num_heads} must be a multiple "
                            f"of num_kv_heads {self.kv_heads}")
        if self.num_experts and not 1 <= self.top_k <= self.num_experts:
            raise SpecError("model.top_k", f"must be in 1..num_experts={self.num_experts}, "
                            f"got {self.top_k}")
        if not self.num_experts and self.top_k:
            raise SpecError("model.top_k", "is set but num_experts is 0 (dense model)")
        if self.head_dim == 0 and self.hidden_size % self.num_heads:
            raise SpecError("model.head_dim", f"hidden_size {self.hidden_size} is not divisible by "
                            f"num_heads {self.num_heads}; give head_dim explicitly")
        if not self.sliding_window_layers <= self.num_layers:
            raise SpecError("model.sliding_window_layers", f"must be at most num_layers = "
                            f"{self.num_layers}, got {self.sliding_window_layers}")
        if bool(self.sliding_window) != bool(self.sliding_window_layers):
            raise SpecError("model.sliding_window_layers", "must be set together with "
                            f"sliding_window (both 0: no sliding window), got "
                            f"{self.sliding_window_layers} with sliding_window "
                            f"{self.sliding_window}")

    def _check_mla(self) -> None:
        if not self.kv_lora_rank:
            for f in MLA_FIELDS[:1] + MLA_FIELDS[2:]:
                if getattr(self, f):
                    raise SpecError(f"model.{f}", f"is multi-head latent attention's and needs "
                                    f"kv_lora_rank > 0, got {f} = {getattr(self, f)} with "
                                    "kv_lora_rank 0")
            return
        for f in ("head_dim", "v_head_dim"):
            if getattr(self, f) < 1:
                raise SpecError(f"model.{f}", "must be a positive integer with multi-head "
                                f"latent attention (kv_lora_rank > 0), got {getattr(self, f)}")
        if self.kv_heads != self.num_heads:
            raise SpecError("model.num_kv_heads", f"must be 0 or num_heads = {self.num_heads} "
                            "with multi-head latent attention (every head has its own key "
                            f"and value), got {self.num_kv_heads}")

    def _check_groups(self) -> None:
        g, k = self.expert_groups, self.expert_groups_per_token
        if not g:
            if k:
                raise SpecError("model.expert_groups_per_token", f"needs expert_groups > 0, "
                                f"got {k}")
            return
        if not self.is_moe or self.num_experts % g:
            raise SpecError("model.expert_groups", f"must divide num_experts: "
                            f"{self.num_experts} % {g} = "
                            f"{self.num_experts % g if self.num_experts else 'no experts'}")
        if not 1 <= k <= g:
            raise SpecError("model.expert_groups_per_token", f"must be in 1..expert_groups"
                            f"={g}, got {k}")
        if self.top_k > k * self.num_experts // g:
            raise SpecError("model.top_k", f"{self.top_k} experts cannot come from "
                            f"{k} groups of {self.num_experts // g}")

    def _check_types(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise SpecError("model.name", f"must be a non-empty string, got {self.name!r}")
        for f in ("gated_mlp", "tied_embeddings", "linear_bias", "qkv_bias", "dropout",
                  "shared_expert_gate"):
            if not isinstance(getattr(self, f), bool):
                raise SpecError(f"model.{f}", f"must be true or false, got {getattr(self, f)!r}")
        layers = self.mlp_only_layers
        if not isinstance(layers, tuple) or any(
                isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in layers):
            raise SpecError("model.mlp_only_layers", f"must be a list of layer indices, "
                            f"got {layers!r}")
        at_most("model.mlp_only_layers", len(layers), MAX_LAYERS, "entries")

    # Derived sizes -----------------------------------------------------------------
    @property
    def kv_heads(self) -> int:
        return self.num_kv_heads or self.num_heads

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def head_size(self) -> int:
        """Width of a query and key head (with MLA: its rotary part included)."""
        return (self.head_dim or self.hidden_size // self.num_heads) + self.qk_rope_head_dim

    @property
    def q_dim(self) -> int:
        """Width of the query projection output (= heads * head size)."""
        return self.num_heads * self.head_size

    @property
    def kv_dim(self) -> int:
        """Width of the key projection output (and of the value's, without MLA)."""
        return self.kv_heads * self.head_size

    @property
    def v_dim(self) -> int:
        """Width of the value projection output (all heads' values with MLA)."""
        return self.num_heads * self.v_head_dim if self.is_mla else self.kv_dim

    @property
    def o_dim(self) -> int:
        """Width of the output projection's input (all heads' weighted values)."""
        return self.num_heads * self.v_head_dim if self.is_mla else self.q_dim

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def expert_ffn(self) -> int:
        return self.moe_ffn_hidden_size or self.ffn_hidden_size

    @property
    def num_moe_layers(self) -> int:
        if not self.is_moe:
            return 0
        only = set(self.mlp_only_layers)
        return sum(1 for i in range(self.num_layers)
                   if (i + 1) % self.moe_layer_step == 0 and i not in only)

    def moe_layer(self, i: int) -> bool:
        """Whether layer ``i`` (from 0) has a mixture-of-experts MLP."""
        return (self.is_moe and (i + 1) % self.moe_layer_step == 0
                and i not in self.mlp_only_layers)

    def seq_len_warnings(self, seq_len: int) -> list[str]:
        """What training at ``seq_len`` tokens does that the simulator does not model."""
        out = []
        if self.position_embedding == "rope" and seq_len > self.max_seq_len:
            out.append(f"seq_len {seq_len:,} exceeds the model's max_seq_len "
                       f"{self.max_seq_len:,} (its max_position_embeddings): rotary "
                       "positions run at any length, but the model was not built for this one")
        if self.sliding_window and seq_len > self.sliding_window:
            out.append(f"{self.sliding_window_layers} of {self.num_layers} layers attend over a "
                       f"sliding window of {self.sliding_window:,} tokens, simulated as full "
                       f"attention over {seq_len:,}: their attention time and FLOPs are "
                       "overestimated")
        return out

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["mlp_only_layers"] = list(self.mlp_only_layers)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any], source: str = "model") -> ModelSpec:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise SpecError(f"{source}.{field_name(unknown[0])}",
                            f"unknown field (known: {', '.join(sorted(known))})")
        for f in ("name", "num_layers", "hidden_size", "num_heads", "ffn_hidden_size",
                  "vocab_size"):
            if f not in d:
                raise SpecError(f"{source}.{f}", "is required")
        d = dict(d)
        if isinstance(d.get("mlp_only_layers"), list):
            d["mlp_only_layers"] = tuple(d["mlp_only_layers"])
        return cls(**d)


def _require_positive_int(field: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise SpecError(f"model.{field}", f"must be a positive integer, got {value!r}")
