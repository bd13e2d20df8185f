"""Which shapes to measure: a preset grid per device kind, or the shapes of one model.

Preset grids are regular (a product of per-dimension values), so the cost model can
interpolate anywhere inside them; a model grid holds exactly the shapes that model needs at
the given TP degrees, micro-batch sizes and sequence lengths.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from profiler.ops import ROPE_HEAD_DIM, OpSpec
from sim.cost.compute import layer_variant
from sim.layout.flops import param_count
from sim.spec.model import ModelSpec

__all__ = ["preset_grid", "model_grid", "PRESETS", "Preset"]

# The Adam step is timed on at most this many parameters (2**28: about 5 GB of parameter,
# gradient and two moments in fp32); it streams memory linearly in their count, and the
# profiled cost model scales a larger rank's step from it. A 70B model's whole shard would
# not fit beside its own optimizer state (an H200 ran out of memory at Llama 3 8B, tp 1).
MAX_OPTIMIZER_NUMEL = 2**28

_ELEMENTWISE = ("rmsnorm", "layernorm", "residual", "dropout", "gelu", "swiglu", "rope")

@dataclass(frozen=True)
class Preset:
    """Axis values of a regular grid: tokens (GEMM m), GEMM n and k, attention
    (batch*heads, seq, head_dim), element-wise widths, vocabularies, optimizer sizes."""

    tokens: list[int]
    dims: list[int]
    heads: list[int]
    seqs: list[int]
    head_dims: list[int]
    widths: list[int]
    vocabs: list[int]
    numels: list[int]
    dtypes: list[str]
    layer_hiddens: list[int]  # whole layers (op "layer") at these widths x tokens
    layer_seq: int  # their sequence length (or the token count, if fewer)


# Sized so that the CPU grid runs in about six minutes on one core.
PRESETS = {
    "cpu": Preset(tokens=[128, 512, 2048], dims=[64, 128, 256, 512, 1024, 2048, 4096],
                  heads=[2, 8, 32], seqs=[128, 256, 512, 1024, 2048], head_dims=[32, 64, 128],
                  widths=[64, 128, 256, 512, 1024, 2048, 4096],
                  vocabs=[1024, 4096, 16384, 65536], numels=[10**4, 10**5, 10**6, 10**7, 10**8],
                  dtypes=["fp32", "bf16"], layer_hiddens=[128, 256, 512, 1024], layer_seq=512),
    "cuda": Preset(tokens=[512, 2048, 8192, 32768],
                   dims=[128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768],
                   heads=[4, 16, 64], seqs=[512, 1024, 2048, 4096, 8192, 16384],
                   head_dims=[64, 128], widths=[256, 1024, 4096, 16384, 65536],
                   vocabs=[4096, 32768, 131072], numels=[10**6, 10**7, 10**8, 10**9],
                   dtypes=["bf16"], layer_hiddens=[1024, 4096, 8192], layer_seq=4096),
}


def preset_grid(device: str, dtypes: list[str] | None = None) -> list[OpSpec]:
    p = PRESETS[device]
    grid = f"preset-{device}"
    out: list[OpSpec] = []
    for dt in dtypes or p.dtypes:
        out += [OpSpec("gemm", "", dt, grid, m, n, k)
                for m, n, k in itertools.product(p.tokens, p.dims, p.dims)]
        out += [OpSpec("attention", "causal", dt, grid, b, s, d)
                for b, s, d in itertools.product(p.heads, p.seqs, p.head_dims)]
        out += [OpSpec(op, "", dt, grid, t, w) for op in _ELEMENTWISE
                for t, w in itertools.product(p.tokens, p.widths)
                if op != "rope" or w % ROPE_HEAD_DIM == 0]
        out += [OpSpec(loss, "", dt, grid, t, v) for loss in ("loss", "loss-parallel")
                for t, v in itertools.product(p.tokens, p.vocabs)]
        out += [OpSpec("embedding", "", dt, grid, t, w, v) for t, w, v in
                itertools.product(p.tokens, p.widths[::2], p.vocabs)]
        out += _preset_layers(p, device, dt)
    out += [OpSpec("optimizer", "adam", "fp32", grid, n) for n in p.numels]
    return out


def _gemms(m: ModelSpec, tokens: int, tp: int) -> list[tuple[int, int, int]]:
    h, f, up = m.hidden_size, m.ffn_hidden_size, 2 if m.gated_mlp else 1
    shapes = [(tokens, (m.q_dim + 2 * m.kv_dim) // tp, h), (tokens, h, m.q_dim // tp),
              (tokens, up * f // tp, h), (tokens, h, f // tp), (tokens, m.vocab_size // tp, h)]
    if m.is_moe:
        routed = max(1, tokens * m.top_k // m.num_experts)
        fe = m.expert_ffn
        shapes += [(tokens, m.num_experts, h), (routed, up * fe // tp, h), (routed, h, fe // tp)]
    return shapes


def _pointwise(m: ModelSpec, tokens: int, tp: int) -> list[tuple[str, int, int]]:
    h, act = m.hidden_size, "swiglu" if m.gated_mlp else "gelu"
    out = [(op, t, h) for op in (m.norm, "residual") + (("dropout",) if m.dropout else ())
           for t in {tokens, tokens // tp}]
    out += [(act, tokens, m.ffn_hidden_size // tp),
            ("loss" if tp == 1 else "loss-parallel", tokens, m.vocab_size // tp)]
    if m.position_embedding == "rope":
        out.append(("rope", tokens, (m.q_dim + m.kv_dim) // tp))
    return out


def model_grid(m: ModelSpec, tps: list[int], micro_batches: list[int], seq_lens: list[int],
               dtype: str) -> list[OpSpec]:
    """The shapes ``m`` needs for every combination of the given degrees and sizes."""
    grid = f"model-{m.name}"
    out: set[OpSpec] = set()
    for tp, mb, s in itertools.product(tps, micro_batches, seq_lens):
        t = mb * s
        out |= {OpSpec("gemm", "", dtype, grid, *g) for g in _gemms(m, t, tp)}
        out.add(OpSpec("attention", "causal", dtype, grid, m.num_heads // tp * mb, s,
                       m.head_size))
        out |= {OpSpec(op, "", dtype, grid, a, b) for op, a, b in _pointwise(m, t, tp)}
        out.add(OpSpec("embedding", "", dtype, grid, t, m.hidden_size, m.vocab_size))
        out.add(OpSpec("optimizer", "adam", "fp32", grid,
                       min(param_count(m) // tp, MAX_OPTIMIZER_NUMEL)))
        out.add(OpSpec("layer", layer_variant(m, s), dtype, grid, t, m.hidden_size, tp))
    return sorted(out, key=lambda s: s.key)


def _preset_layers(p: Preset, device: str, dtype: str) -> list[OpSpec]:
    """Whole Llama-style layers (head dim 64, MHA, SwiGLU of 8/3 hidden) over the preset's
    tokens and layer widths, one TP rank: what :meth:`sim.cost.profiled.Profiled.layer_factor`
    compares with the sum of their operations."""
    out = []
    for h, t in itertools.product(p.layer_hiddens, p.tokens):
        seq = min(t, p.layer_seq)
        m = ModelSpec("preset-layer", 1, h, h // 64, 64 * round(8 * h / 3 / 64), 1000,
                      max_seq_len=seq, gated_mlp=True, norm="rmsnorm",
                      position_embedding="rope")
        out.append(OpSpec("layer", layer_variant(m, seq), dtype, f"preset-{device}", t, h, 1))
    return out
