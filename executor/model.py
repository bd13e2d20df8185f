"""A decoder-only transformer built from a ModelSpec, in plain torch.

The module names follow torchtitan's Llama (``tok_embeddings``, ``layers.N.attention.wqkv``,
``feed_forward.w13`` ...) so the tensor-parallel plan in :mod:`executor.parallel` reads like
torchtitan's. GPT-style (LayerNorm, GELU MLP, learned positions, biases) and Llama-style
(RMSNorm, SwiGLU, RoPE, GQA) models, tied embeddings, and MoE layers with top-k routing.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import nn

from sim.errors import SpecError
from sim.spec.model import ModelSpec

__all__ = ["Transformer", "scale_model", "moe_layer_ids"]


def scale_model(spec: ModelSpec, layers: int | None = None, hidden: int | None = None
                ) -> ModelSpec:
    """A smaller copy of ``spec`` that keeps its structure: ``layers`` layers and a hidden
    size of ``hidden`` (head dim, GQA ratio and the FFN/hidden ratio are kept)."""
    changes: dict[str, object] = {"name": f"{spec.name}-scaled"}
    if layers is not None:
        if layers < 1:
            raise SpecError("scale.layers", f"must be >= 1, got {layers}")
        changes["num_layers"] = layers
        changes["mlp_only_layers"] = tuple(i for i in spec.mlp_only_layers if i < layers)
    if hidden is not None:
        hd = spec.head_size
        if hidden < hd or hidden % hd:
            raise SpecError("scale.hidden", f"must be a multiple of the head dim {hd}, "
                            f"got {hidden}")
        heads = hidden // hd
        group = spec.num_heads // spec.kv_heads
        if heads % group:
            raise SpecError("scale.hidden", f"{heads} heads are not a multiple of the GQA "
                            f"group {group}")
        ratio = hidden / spec.hidden_size
        changes.update(hidden_size=hidden, num_heads=heads, head_dim=hd,
                       num_kv_heads=heads // group if spec.num_kv_heads else 0,
                       ffn_hidden_size=max(1, round(spec.ffn_hidden_size * ratio)))
        if spec.num_experts:
            changes["moe_ffn_hidden_size"] = max(1, round(spec.expert_ffn * ratio))
        if spec.shared_expert_ffn_hidden_size:
            changes["shared_expert_ffn_hidden_size"] = max(
                1, round(spec.shared_expert_ffn_hidden_size * ratio))
    return dataclasses.replace(spec, **changes)  # type: ignore[arg-type]


def moe_layer_ids(spec: ModelSpec) -> set[int]:
    """Layers whose MLP is a mixture of experts (as :attr:`ModelSpec.num_moe_layers`)."""
    return {i for i in range(spec.num_layers) if spec.moe_layer(i)}


def _norm(spec: ModelSpec) -> nn.Module:
    if spec.norm == "rmsnorm":
        return nn.RMSNorm(spec.hidden_size, eps=1e-5)
    return nn.LayerNorm(spec.hidden_size, bias=spec.linear_bias)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding on (batch, seq, heads, head_dim), rotating the two halves."""
    a, b = x.chunk(2, dim=-1)
    return torch.cat((a * cos - b * sin, b * cos + a * sin), dim=-1)


def rope_tables(spec: ModelSpec, seq_len: int, theta: float = 10000.0
                ) -> tuple[torch.Tensor, torch.Tensor]:
    half = spec.head_size // 2
    freq = theta ** (-torch.arange(half, dtype=torch.float32) / half)
    angle = torch.outer(torch.arange(seq_len, dtype=torch.float32), freq)
    return angle.cos()[None, :, None, :], angle.sin()[None, :, None, :]


class Attention(nn.Module):
    """Causal self-attention with grouped KV heads, torch SDPA. One fused QKV projection
    (as Megatron-LM): its output is [q | k | v], and under tensor parallelism each rank's
    slice is [q_r | k_r | v_r] (see :func:`executor.parallel.apply_tp`), so the split reads
    the local width and needs no TP flag."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        hd, h = spec.head_size, spec.hidden_size
        self.head_dim = hd
        self.parts = (spec.num_heads, spec.kv_heads, spec.kv_heads)  # in heads
        self.wqkv = nn.Linear(h, sum(self.parts) * hd, bias=spec.linear_bias or spec.qkv_bias)
        self.wo = nn.Linear(spec.num_heads * hd, h, bias=spec.linear_bias)
        self.recompute_core = False  # selective recomputation: re-run softmax(QK^T)V

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None
                ) -> torch.Tensor:
        b, s, _ = x.shape
        qkv = self.wqkv(x)
        unit = qkv.shape[-1] // sum(self.parts)
        q, k, v = (t.view(b, s, -1, self.head_dim)
                   for t in qkv.split([n * unit for n in self.parts], dim=-1))
        if rope is not None:
            cos, sin = (t[:, :s] for t in rope)
            q, k = _rope(q, cos, sin), _rope(k, cos, sin)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        if self.recompute_core and torch.is_grad_enabled():
            from torch.utils.checkpoint import checkpoint

            out = checkpoint(_core, q, k, v, use_reentrant=False, preserve_rng_state=False)
        else:
            out = _core(q, k, v)
        return self.wo(out.transpose(1, 2).reshape(b, s, -1))


def _core(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                          enable_gqa=k.shape[1] != q.shape[1])


class FeedForward(nn.Module):
    """SwiGLU, w2(silu(a) * b) with [a | b] = w13 x (one fused GEMM, as Megatron-LM), or
    GELU, w2(gelu(w13 x))."""

    def __init__(self, hidden: int, width: int, gated: bool, bias: bool) -> None:
        super().__init__()
        self.gated = gated
        self.w13 = nn.Linear(hidden, 2 * width if gated else width, bias=bias)
        self.w2 = nn.Linear(width, hidden, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.gated:
            return self.w2(F.gelu(self.w13(x), approximate="tanh"))
        a, b = self.w13(x).chunk(2, dim=-1)
        return self.w2(F.silu(a) * b)


class Experts(nn.Module):
    """A layer's routed experts (this rank's), run once per exchange on rows grouped by
    expert: one module, so that data parallelism can shard them as one unit."""

    def __init__(self, experts: Iterable[FeedForward]) -> None:
        super().__init__()
        self.each = nn.ModuleList(experts)

    def __len__(self) -> int:
        return len(self.each)

    def __getitem__(self, i: int) -> FeedForward:
        return self.each[i]  # type: ignore[return-value]

    def forward(self, rows: torch.Tensor, expert_ids: torch.Tensor) -> torch.Tensor:
        """Each row through the expert ``expert_ids`` names (ids local to this rank)."""
        out = torch.empty_like(rows)
        for e, expert in enumerate(self.each):
            picked = (expert_ids == e).nonzero(as_tuple=True)[0]
            out[picked] = expert(rows[picked]) if picked.numel() else out[picked]
        return out


class MoE(nn.Module):
    """Top-k routed experts (softmax over the chosen experts' scores) plus an optional shared
    expert. ``experts`` holds this rank's experts (or their tensor-parallel shards); the
    expert grid's groups are set by :func:`executor.parallel.apply_ep` (see
    :mod:`executor.moe`)."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.top_k, self.num_experts = spec.top_k, spec.num_experts
        self.router = nn.Linear(spec.hidden_size, spec.num_experts, bias=False)
        self.experts = Experts(
            FeedForward(spec.hidden_size, spec.expert_ffn, spec.gated_mlp, spec.linear_bias)
            for _ in range(spec.num_experts))
        self.shared = FeedForward(spec.hidden_size, spec.shared_expert_ffn_hidden_size,
                                  spec.gated_mlp, spec.linear_bias) \
            if spec.shared_expert_ffn_hidden_size else None
        # the expert grid: none on one rank (every expert here, whole)
        self.ep = self.etp = 1
        self.ep_rank = self.etp_rank = 0
        self.block_group: object | None = None  # the etp x ep block (counts gathered)
        self.ep_group: object | None = None
        self.etp_group: object | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from executor.moe import forward  # local import: keeps the model free of distributed

        return forward(self, x)


class Block(nn.Module):
    def __init__(self, spec: ModelSpec, moe: bool) -> None:
        super().__init__()
        self.attention_norm = _norm(spec)
        self.attention = Attention(spec)
        self.ffn_norm = _norm(spec)
        self.feed_forward: nn.Module = MoE(spec) if moe else FeedForward(
            spec.hidden_size, spec.ffn_hidden_size, spec.gated_mlp, spec.linear_bias)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None = None
                ) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x), rope)
        return x + self.feed_forward(self.ffn_norm(x))


class Transformer(nn.Module):
    """The whole model. Pipeline stages are copies with some parts set to ``None``
    (:func:`executor.parallel.split_stage`), so ``forward`` skips what a stage lacks:
    token ids go in where there is an embedding, logits come out where there is an output."""

    def __init__(self, spec: ModelSpec, seq_len: int) -> None:
        super().__init__()
        if seq_len > spec.max_seq_len:
            raise SpecError("plan.seq_len", f"{seq_len} exceeds model.max_seq_len "
                            f"{spec.max_seq_len}")
        self.spec = spec
        self.tok_embeddings: nn.Embedding | None = nn.Embedding(spec.vocab_size,
                                                                spec.hidden_size)
        self.pos_embeddings = nn.Embedding(spec.max_seq_len, spec.hidden_size) \
            if spec.position_embedding == "learned" else None
        moe = moe_layer_ids(spec)
        self.layers = nn.ModuleDict({str(i): Block(spec, i in moe)
                                     for i in range(spec.num_layers)})
        self.norm: nn.Module | None = _norm(spec)
        self.output: nn.Linear | None = nn.Linear(spec.hidden_size, spec.vocab_size,
                                                  bias=False)
        if spec.tied_embeddings:
            self.output.weight = self.tok_embeddings.weight
        if spec.position_embedding == "rope":
            cos, sin = rope_tables(spec, seq_len)
            self.register_buffer("rope_cos", cos, persistent=False)
            self.register_buffer("rope_sin", sin, persistent=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        std = 0.02
        for name, p in self.named_parameters():
            if p.dim() == 1:
                nn.init.ones_(p) if name.endswith("norm.weight") else nn.init.zeros_(p)
            else:
                scale = std / math.sqrt(2 * self.spec.num_layers) if name.endswith(
                    ("wo.weight", "w2.weight")) else std
                nn.init.normal_(p, std=scale)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tok_embeddings is not None:
            ids = x
            x = self.tok_embeddings(ids)
            if self.pos_embeddings is not None:
                x = x + self.pos_embeddings(torch.arange(ids.shape[1], device=ids.device))
        rope = (self.rope_cos, self.rope_sin) if hasattr(self, "rope_cos") else None
        for layer in self.layers.values():
            x = layer(x, rope)
        if self.norm is not None:
            x = self.norm(x)
        if self.output is not None:
            x = self.output(x)
        return x
