"""Benchmarks of the layer building blocks: each op prepares its tensors once and returns a
forward callable and a backward callable (autograd over the saved graph, so the backward
is timed alone).

Shapes follow the profile DB (``sim/cost/profile_db.py``): ``gemm`` (m, n, k) is ``x[m,k] @
W[n,k]^T``; ``attention`` (batch*heads, seq, head_dim) is causal SDPA; element-wise ops
(tokens, width); ``embedding`` (tokens, hidden, vocab); ``optimizer`` (numel) is one Adam
step over fp32 parameters; ``layer`` (tokens, hidden, tp) a whole transformer layer
(``profiler/layer.py``) on one TP rank.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

__all__ = ["OpSpec", "build_op", "TORCH_DTYPES", "ROPE_HEAD_DIM"]

TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
ROPE_HEAD_DIM = 64
Fn = Callable[[], object]


@dataclass(frozen=True)
class OpSpec:
    """One measurement to make."""

    op: str
    variant: str
    dtype: str
    grid: str
    m: int
    n: int = 0
    k: int = 0

    @property
    def key(self) -> tuple:
        return (self.op, self.variant, self.dtype, self.grid, self.m, self.n, self.k)


def _leaf(shape: tuple[int, ...], dtype: torch.dtype, device: str) -> torch.Tensor:
    return torch.randn(shape, dtype=dtype, device=device).mul_(0.02).requires_grad_()


def _with_backward(forward: Callable[[], torch.Tensor], inputs: list[torch.Tensor]
                   ) -> tuple[Fn, Fn]:
    out = forward()
    grad = torch.ones_like(out) if out.dim() == 0 else torch.randn_like(out)

    def backward() -> object:
        return torch.autograd.grad(out, inputs, grad, retain_graph=True)

    return forward, backward


def _gemm(s: OpSpec, dt: torch.dtype, dev: str) -> tuple[Fn, Fn]:
    x, w = _leaf((s.m, s.k), dt, dev), _leaf((s.n, s.k), dt, dev)
    return _with_backward(lambda: F.linear(x, w), [x, w])


def _attention(s: OpSpec, dt: torch.dtype, dev: str) -> tuple[Fn, Fn]:
    q, k, v = (_leaf((1, s.m, s.n, s.k), dt, dev) for _ in range(3))
    return _with_backward(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
                          [q, k, v])


def _norm(s: OpSpec, dt: torch.dtype, dev: str) -> tuple[Fn, Fn]:
    x, w, b = _leaf((s.m, s.n), dt, dev), _leaf((s.n,), dt, dev), _leaf((s.n,), dt, dev)
    if s.op == "rmsnorm":
        return _with_backward(lambda: F.rms_norm(x, (s.n,), w), [x, w])
    return _with_backward(lambda: F.layer_norm(x, (s.n,), w, b), [x, w, b])


def _pointwise(s: OpSpec, dt: torch.dtype, dev: str) -> tuple[Fn, Fn]:
    if s.op == "swiglu":
        x = _leaf((s.m, 2 * s.n), dt, dev)
        return _with_backward(lambda: F.silu(x[:, :s.n]) * x[:, s.n:], [x])
    x, y = _leaf((s.m, s.n), dt, dev), _leaf((s.m, s.n), dt, dev)
    table: dict[str, Callable[[], torch.Tensor]] = {
        "residual": lambda: x + y, "gelu": lambda: F.gelu(x),
        "dropout": lambda: F.dropout(x, 0.1, training=True)}
    return _with_backward(table[s.op], [x, y] if s.op == "residual" else [x])


def _rope(s: OpSpec, dt: torch.dtype, dev: str) -> tuple[Fn, Fn]:
    head_dim = math.gcd(s.n, ROPE_HEAD_DIM)
    heads, half = s.n // head_dim, head_dim // 2
    x = _leaf((s.m, heads, head_dim), dt, dev)
    angle = torch.rand(s.m, 1, half, device=dev)
    cos, sin = angle.cos().to(dt), angle.sin().to(dt)

    def rotate() -> torch.Tensor:
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)

    return _with_backward(rotate, [x])


def _embedding(s: OpSpec, dt: torch.dtype, dev: str) -> tuple[Fn, Fn]:
    w = _leaf((s.k, s.n), dt, dev)
    idx = torch.randint(0, s.k, (s.m,), device=dev)
    return _with_backward(lambda: F.embedding(idx, w), [w])


def _loss(s: OpSpec, dt: torch.dtype, dev: str) -> tuple[Fn, Fn]:
    logits = _leaf((s.m, s.n), dt, dev)
    target = torch.randint(0, s.n, (s.m,), device=dev)
    return _with_backward(lambda: F.cross_entropy(logits.float(), target), [logits])


def _loss_parallel(s: OpSpec, dt: torch.dtype, dev: str) -> tuple[Fn, Fn]:
    """One TP rank's share of a vocab-parallel cross-entropy (torch's ``loss_parallel``,
    Megatron's): max, shifted exponentials and their sum, log, target pick — separate passes
    over the local logits, their all-reduces left to the communication profile."""
    logits = _leaf((s.m, s.n), dt, dev)
    target = torch.randint(0, s.n, (s.m, 1), device=dev)

    def forward() -> torch.Tensor:
        x = logits.float()
        shifted = x - x.amax(dim=-1, keepdim=True).detach()
        logprobs = shifted - shifted.exp().sum(dim=-1, keepdim=True).log()
        return -logprobs.gather(-1, target).mean()

    return _with_backward(forward, [logits])


def _optimizer(s: OpSpec, dt: torch.dtype, dev: str) -> tuple[Fn, Fn]:
    p = torch.nn.Parameter(torch.zeros(s.m, device=dev))
    p.grad = torch.randn_like(p)
    opt = torch.optim.Adam([p], lr=1e-4)
    return opt.step, lambda: None


def _layer(s: OpSpec, dt: torch.dtype, dev: str) -> tuple[Fn, Fn]:
    """A whole layer on one of ``k`` TP ranks (its heads and FFN split, no communication):
    ``m`` tokens of ``n`` hidden, structure from the variant."""
    from profiler.layer import ReferenceLayer
    from sim.cost.compute import variant_layer

    spec, seq = variant_layer(s.variant, s.n)
    local = dataclasses.replace(spec, num_heads=spec.num_heads // s.k,
                                num_kv_heads=spec.kv_heads // s.k, head_dim=spec.head_size,
                                ffn_hidden_size=spec.ffn_hidden_size // s.k)
    layer = ReferenceLayer(local, seq, dt).to(dev)
    x = _leaf((max(1, s.m // seq), seq, s.n), dt, dev)
    return _with_backward(lambda: layer(x), [x, *layer.parameters()])


_BUILDERS = {"gemm": _gemm, "attention": _attention, "rmsnorm": _norm, "layernorm": _norm,
             "residual": _pointwise, "gelu": _pointwise, "swiglu": _pointwise,
             "dropout": _pointwise, "rope": _rope, "embedding": _embedding, "loss": _loss,
             "loss-parallel": _loss_parallel,
             "optimizer": _optimizer, "layer": _layer}


def build_op(spec: OpSpec, device: str) -> tuple[Fn, Fn]:
    """(forward, backward) callables for one measurement."""
    return _BUILDERS[spec.op](spec, TORCH_DTYPES[spec.dtype], device)
