"""A reference transformer layer in plain torch, built from a ModelSpec: what the compute
profile is checked against (``experiments/validate_profile_cpu.py``).

Llama-style models get RMSNorm, rotary embeddings, grouped-query attention through SDPA and a
SwiGLU MLP; GPT-style ones LayerNorm, learned positions (outside the layer), GELU, biases
and dropout. One layer, no tensor parallelism.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from sim.spec.model import ModelSpec

__all__ = ["ReferenceLayer"]


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


class ReferenceLayer(nn.Module):
    cos: torch.Tensor
    sin: torch.Tensor

    def __init__(self, m: ModelSpec, seq_len: int, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.m, bias = m, m.linear_bias
        norm = nn.RMSNorm if m.norm == "rmsnorm" else nn.LayerNorm
        self.norm1, self.norm2 = norm(m.hidden_size), norm(m.hidden_size)
        self.qkv = nn.Linear(m.hidden_size, m.q_dim + 2 * m.kv_dim, bias=bias or m.qkv_bias)
        self.proj = nn.Linear(m.q_dim, m.hidden_size, bias=bias)
        up = 2 * m.ffn_hidden_size if m.gated_mlp else m.ffn_hidden_size
        self.up = nn.Linear(m.hidden_size, up, bias=bias)
        self.down = nn.Linear(m.ffn_hidden_size, m.hidden_size, bias=bias)
        angle = torch.outer(torch.arange(seq_len, dtype=torch.float32),
                            torch.rand(m.head_size // 2))[None, None]
        self.register_buffer("cos", angle.cos(), persistent=False)
        self.register_buffer("sin", angle.sin(), persistent=False)
        self.to(dtype)

    def _attention(self, x: torch.Tensor) -> torch.Tensor:
        m, (b, s, _) = self.m, x.shape
        q, k, v = self.qkv(x).split([m.q_dim, m.kv_dim, m.kv_dim], dim=-1)
        q = q.view(b, s, m.num_heads, m.head_size).transpose(1, 2)
        k = k.view(b, s, m.kv_heads, m.head_size).transpose(1, 2)
        v = v.view(b, s, m.kv_heads, m.head_size).transpose(1, 2)
        if m.position_embedding == "rope":
            q, k = _rotate(q, self.cos, self.sin), _rotate(k, self.cos, self.sin)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                             enable_gqa=m.kv_heads != m.num_heads)
        return self.proj(out.transpose(1, 2).reshape(b, s, m.q_dim))

    def _mlp(self, x: torch.Tensor) -> torch.Tensor:
        h = self.up(x)
        if self.m.gated_mlp:
            gate, up = h.chunk(2, dim=-1)
            return self.down(F.silu(gate) * up)
        return self.down(F.gelu(h))

    def _drop(self, x: torch.Tensor) -> torch.Tensor:
        return F.dropout(x, 0.1, self.training) if self.m.dropout else x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self._drop(self._attention(self.norm1(x)))
        return x + self._drop(self._mlp(self.norm2(x)))
