"""What data-parallel synchronisation moves: the parameter tensors of one worker (a
data-parallel replica), their split over parameter-server shards, and the bytes a gradient
takes on the wire under each compression.

A worker is one data-parallel replica: the ``tp*cp*pp`` ranks holding one copy of the model.
Its gradient is every parameter once, in the plan's gradient dtype (bf16 under bf16 or fp8
training, as the data-parallel reduction carries it), spread evenly over its ranks.
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.errors import SpecError
from sim.layout.flops import (
    attention_params,
    embedding_params,
    layer_params,
    mlp_params,
    mtp_params,
    param_count,
)
from sim.layout.placement import stage_devices
from sim.spec.model import ModelSpec
from sim.spec.plan import Plan
from sim.spec.sync import Compression
from sim.spec.workload import Workload

__all__ = ["parameter_tensors", "shard_fractions", "shard_assignment", "wire_bytes_per_element",
           "worker_devices",
           "Gradient", "gradient", "PAYLOAD_BYTES"]

PAYLOAD_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "int8": 1}


def parameter_tensors(model: ModelSpec | Workload) -> list[int]:
    """Element counts of the model's trainable tensors, in order (a transformer's as its
    checkpoints hold them: attention, each MLP matrix, norms; embeddings; each expert)."""
    if isinstance(model, Workload):
        return [n for n in model.param_tensors if n > 0]
    m, out = model, [embedding_params(model) - (0 if model.tied_embeddings else
                                                 model.vocab_size * model.hidden_size)]
    mats = 3 if m.gated_mlp else 2
    for i in range(m.num_layers):
        attn = attention_params(m)
        out.append(attn)
        if m.moe_layer(i):
            out.append(m.hidden_size * m.num_experts)  # router
            out += [mlp_params(m, m.expert_ffn) // mats] * (mats * m.num_experts)
            rest = layer_params(m, moe=True) - attn - m.hidden_size * m.num_experts \
                - mats * m.num_experts * (mlp_params(m, m.expert_ffn) // mats)
        else:
            out += [mlp_params(m, m.ffn_hidden_size) // mats] * mats
            rest = layer_params(m) - attn - mats * (mlp_params(m, m.ffn_hidden_size) // mats)
        out.append(rest)  # norms, shared expert, remainders
    if mtp_params(m):
        out.append(mtp_params(m))
    if not m.tied_embeddings:
        out.append(m.vocab_size * m.hidden_size)
    out.append(param_count(m) - sum(out))  # the final norm
    return [n for n in out if n > 0]


def shard_assignment(tensors: list[int], servers: int, sharding: str) -> list[list[int]]:
    """The parameter tensors (indices into ``tensors``) each server holds whole: dealt in
    turn (``round-robin``), or largest first onto the least-loaded server
    (``size-balanced``)."""
    if servers > len(tensors):
        raise SpecError("plan.communication.servers", f"{servers} parameter-server shards "
                        f"but the model has {len(tensors)} parameter tensors (a tensor is not "
                        f"split unless sharding is flat): at most {len(tensors)}")
    out: list[list[int]] = [[] for _ in range(servers)]
    if sharding == "round-robin":
        for i in range(len(tensors)):
            out[i % servers].append(i)
        return out
    load = [0] * servers
    for i in sorted(range(len(tensors)), key=lambda i: (-tensors[i], i)):
        s = load.index(min(load))
        load[s] += tensors[i]
        out[s].append(i)
    return out


def shard_fractions(tensors: list[int], servers: int, sharding: str) -> list[float]:
    """Share of the parameters on each server: ``flat``, equal slices of the flattened
    parameters (tensors split across servers); else whole tensors (:func:`shard_assignment`)."""
    if sharding == "flat":
        if servers > sum(tensors):
            raise SpecError("plan.communication.servers", f"{servers} shards of "
                            f"{sum(tensors)} parameters: at most one a parameter")
        return [1.0 / servers] * servers
    total = sum(tensors)
    return [sum(tensors[i] for i in mine) / total
            for mine in shard_assignment(tensors, servers, sharding)]


def wire_bytes_per_element(c: Compression, grad_bytes: int, shape: tuple[int, int] | None = None
                           ) -> float:
    """Bytes per gradient element on the wire: ``fp16`` 2, ``int8`` 1 (+ one fp32 scale per
    256-element block), ``topk`` the kept fraction as fp32 value + int32 index, ``onebit``
    1 bit (+ a scale per 256 elements, as 1-bit Adam's blocks), ``powersgd`` the two rank-r
    factors of an ``n x m`` matrix: ``r (n + m) / (n m)`` elements (``shape``: the typical
    matrix; the square default is a worst case for small ranks)."""
    kind = c.kind
    if kind == "none":
        return float(grad_bytes)
    if kind == "fp16":
        return 2.0
    if kind == "int8":
        return 1.0 + 4 / 256
    if kind == "topk":
        return c.ratio * 8.0
    if kind == "onebit":
        return 1 / 8 + 4 / 256
    n, m = shape or (4096, 4096)
    return min(float(grad_bytes), grad_bytes * c.rank * (n + m) / (n * m))


def worker_devices(plan: Plan) -> list[list[int]]:
    """The devices of each data-parallel replica (all its stages; an explicit rank table
    maps its ranks to devices)."""
    table = plan.placement if isinstance(plan.placement, tuple) else None
    return [[table[r] if table else r for stage in range(plan.pp)
             for r in stage_devices(plan, replica, stage)] for replica in range(plan.dp)]


@dataclass(frozen=True)
class Gradient:
    """One worker's gradient: its elements, bytes uncompressed, bytes on the wire."""

    elements: int
    raw_bytes: float
    wire_bytes: float
    tensors: int


def gradient(model: ModelSpec | Workload, plan: Plan, hidden: int | None = None) -> Gradient:
    """The gradient one worker pushes or reduces; ``hidden`` sizes PowerSGD's matrices."""
    tensors = parameter_tensors(model)
    elements = sum(tensors)
    if elements <= 0:
        raise SpecError("model", "has no trainable parameters: nothing to synchronise")
    grad = plan.grad_bytes  # the plan's gradient-reduction dtype
    shape = (hidden, 4 * hidden) if hidden else None
    per = wire_bytes_per_element(plan.compression, grad, shape)
    return Gradient(elements, float(elements * grad), float(elements * per), len(tensors))

