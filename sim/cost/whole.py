"""Whole tensor-parallel layers and output heads measured as they run over TP ranks
(``trainsim profile tp``, :mod:`executor.layer_profile`), turned into corrections of the
operation sums.

A ``tp-layer`` row's time includes the layer's TP collectives, which the tiers charge
separately (:func:`sim.layout.stages.tp_pass`'s blocks, each an all-reduce or an all-gather
and a reduce-scatter, per pass); a ``tp-head`` row includes the output layer's and the
vocab-parallel loss's (:func:`sim.layout.stages.edge_tp_collectives`). The correction is
``(measured - collectives) / operation sum``, with the collectives timed by the same cost
model's measured fit, so a simulated layer plus its simulated collectives comes out at the
measured whole. Without a measured fit for the TP group the row cannot be split and is not
used (the cost model notes it).
"""

from __future__ import annotations

from sim.cost.costmodel import Cost, CostModel
from sim.layout.stages import edge_tp_collectives, tp_pass
from sim.spec.model import ModelSpec
from sim.spec.plan import Plan

__all__ = ["tp_layer_ratio", "tp_head_ratio", "head_spec"]


def _plan(tokens: int, seq: int, tp: int, sp: bool, dtype: str) -> Plan:
    mb = max(1, tokens // seq)
    return Plan(global_batch_size=mb, seq_len=seq, micro_batch_size=mb, tp=tp,
                sequence_parallel=sp, dtype=dtype)


def _coll(cm: CostModel, kind: str, tp: int, size: float) -> float | None:
    return cm.collective(kind, tp, False, size)


def _layer_comm(cm: CostModel, m: ModelSpec, plan: Plan) -> float | None:
    """One pass's TP collectives of a dense layer (forward, or backward)."""
    size = plan.local_tokens * m.hidden_size * plan.activation_bytes
    times = [_coll(cm, kind, plan.tp, size * scale) for kind, scale in tp_pass(m, plan, False)]
    if any(t is None for t in times):
        return None
    return sum(t for t in times if t is not None)


def tp_layer_ratio(cm: CostModel, spec: ModelSpec, seq: int, tokens: int, tp: int, sp: bool,
                   dtype: str, measured: Cost, scale: float) -> Cost | None:
    """(forward, backward) ratio of a measured TP layer, less its collectives, to its
    operations' sum; ``scale`` is the profile's compute scale (a calibration's), applied to
    the measured compute as to every other compute time."""
    from sim.cost.compute import ops_layer_time

    plan = _plan(tokens, seq, tp, sp, dtype)
    comm = _layer_comm(cm, spec, plan)
    if comm is None:
        return None
    ops = ops_layer_time(cm, spec, plan)
    f, b = (measured[0] - comm) * scale, (measured[1] - comm) * scale
    if f <= 0 or b <= 0:
        return None
    return f / ops.forward, b / ops.backward


def head_spec(variant: str, hidden: int, vocab: int, tokens: int) -> tuple[ModelSpec, int]:
    """(ModelSpec with the head's structure, TP degree) of a ``tp-head`` row."""
    raw = dict(item.split("=", 1) for item in variant.split(";"))
    spec = ModelSpec(name="profiled-head", num_layers=1, hidden_size=hidden, num_heads=1,
                     ffn_hidden_size=hidden, vocab_size=vocab, max_seq_len=tokens,
                     norm=raw["norm"])
    return spec, int(raw["tp"])


def tp_head_ratio(cm: CostModel, variant: str, tokens: int, hidden: int, vocab: int, sp: bool,
                  dtype: str, measured: Cost, scale: float) -> float | None:
    """Ratio of a measured TP output head (forward + backward), less its collectives, to the
    operations' sum of :func:`sim.cost.compute.logits_time`."""
    from sim.cost.compute import ops_logits_time

    spec, tp = head_spec(variant, hidden, vocab, tokens)
    plan = _plan(tokens, tokens, tp, sp, dtype)
    times = [_coll(cm, kind, tp, size)
             for _, kind, size in edge_tp_collectives(spec, plan, False, True)]
    if any(t is None for t in times):
        return None
    whole = (measured[0] + measured[1] - sum(t for t in times if t is not None)) * scale
    return whole / ops_logits_time(cm, spec, plan) if whole > 0 else None
