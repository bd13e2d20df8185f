"""Plan: how one training job is parallelised. Hardware-free, frozen, JSON on disk.

All rules live in :func:`validate`; its messages show the arithmetic that failed, e.g.
``plan.dp*tp*pp*cp: 8*8*16*1 = 1024 != 1536 GPUs of cluster 'dgx-a100:192'``.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sim.errors import SpecError, field_name
from sim.spec.batch import check_batch, check_layers, check_schedule
from sim.spec.experts import check_experts, check_experts_model, expert_tp
from sim.spec.hardware import DTYPE_BYTES, DTYPES
from sim.spec.limits import MAX_DEVICES, MAX_GLOBAL_BATCH, MAX_LAYERS, MAX_SEQ_LEN, at_most
from sim.spec.recompute import check_recompute, check_recompute_model, order_modules
from sim.spec.routing import check_routing, check_routing_model
from sim.spec.sync import Communication, Compression, Sync, check_sync, coerce_sync, sync_to_dict
from sim.spec.zero import check_zero

if TYPE_CHECKING:
    from sim.spec.cluster import ClusterSpec
    from sim.spec.model import ModelSpec

__all__ = ["Plan", "validate", "load_plan", "save_plan", "replica_plan", "SCHEMA_VERSION",
           "DEFAULT_PLACEMENT", "RECOMPUTE_MODES"]

RECOMPUTE_MODES = ("none", "selective", "full")

SCHEMA_VERSION = 1
SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b", "dualpipev", "dualpipe")
ATTENTION = ("flash", "standard")
GRAD_DTYPES = ("fp32", "bf16", "fp16")
DIMS = ("tp", "cp", "ep", "dp", "pp")
_REDUCTIONS = ("auto", "ring", "tree", "hierarchical", "halving-doubling", "nvls")
# Algorithms a group may be given: TP and DP reduce and gather, EP exchanges all-to-all,
# PP and CP only send/receive between neighbours (nothing to choose).
ALGORITHMS = {"tp": _REDUCTIONS, "dp": _REDUCTIONS, "ep": ("auto", "direct", "pairwise"),
              "pp": ("auto",), "cp": ("auto",)}
DEFAULT_PLACEMENT = "tp-cp-ep-dp-pp"  # innermost (fastest-varying rank) first, as Megatron-LM


@dataclass(frozen=True)
class Plan:
    """A parallel training plan. Batch sizes are in sequences.

    The experts of MoE layers sit on ``etp x ep`` blocks of each stage's ``tp*cp*dp`` ranks
    (:mod:`sim.spec.experts`), so the world size is ``dp*tp*pp*cp``. ``placement`` is a rank
    order, innermost first, or an explicit rank table: entry ``r`` is the device that logical
    rank ``r`` (default order) runs on.
    """

    global_batch_size: int  # sequences per iteration
    seq_len: int  # tokens per sequence
    micro_batch_size: int = 1  # sequences per micro-batch
    dp: int = 1  # data-parallel degree
    tp: int = 1  # tensor-parallel degree
    pp: int = 1  # pipeline-parallel degree
    cp: int = 1  # context-parallel degree
    ep: int = 1  # expert-parallel degree; etp*ep divides tp*cp*dp
    vpp: int = 1  # virtual stages per pipeline rank (interleaved-1f1b; 2 for dualpipe(v))
    schedule: str = "1f1b"  # one of SCHEDULES (dualpipe: both directions, sim.layout.dualpipe)
    zero_stage: int = 0  # ZeRO stage 0-3
    recompute: str = "none"  # activation recomputation: `none`, `selective` or `full`
    # split the TP group's norm and dropout activations (needs tp > 1)
    sequence_parallel: bool = False
    dtype: str = "bf16"  # training precision: `bf16`, `fp16`, `fp8` or `fp32`
    # rank order, innermost first, or an explicit rank table (list of devices)
    placement: str | tuple[int, ...] = DEFAULT_PLACEMENT
    collectives: tuple[tuple[str, str], ...] = ()  # (group, algorithm) pairs
    # layers of each (virtual) stage, pp·vpp counts (dualpipe: pp); null: an even split
    layers_per_stage: tuple[int, ...] | None = None
    attention: str = "flash"  # "standard" materialises the s x s scores (Megatron 2021)
    # overlap the data-parallel gradient reduction with the last backward
    overlap_grad_reduce: bool = True
    # Micro-batches of each data-parallel replica when they differ (heterogeneous clusters):
    # dp counts summing to global_batch_size / micro_batch_size; null: an even split.
    micro_batches_per_replica: tuple[int, ...] | None = None
    # MoE routing: tokens on the most-loaded expert-parallel rank over the mean (1: forced
    # balance), or the tokens each expert gets (relative; null: use moe_max_load)
    moe_max_load: float = 1.0
    moe_expert_load: tuple[float, ...] | None = None
    # tokens an expert takes, over its balanced share; the rest are dropped (null: dropless)
    moe_capacity_factor: float | None = None
    moe_dispatcher: str = "alltoall"  # MoE token dispatch: `alltoall`, `allgather` or `deepep`
    # what hides the expert all-to-alls: `none`, `shared-expert`, `a2a` (another micro-batch)
    # or `operator` (the layer's own GEMMs, MegaScale-MoE's; sim.cost.overlap)
    moe_overlap: str = "none"
    etp: int | None = None  # expert-tensor-parallel degree: 1 or tp (null: tp)
    # how data-parallel workers synchronise, over what, compressed how (sim.spec.sync)
    sync: Sync = Sync()
    communication: Communication = Communication()
    compression: Compression = Compression()
    # dtype gradients are accumulated and reduced in: `fp32` (Megatron-LM's default under
    # bf16, torchtitan's FSDP), `bf16` or `fp16` (null: fp32 for fp32 training, else 16 bits)
    grad_reduce_dtype: str | None = None
    # MoE: the forward dispatch's dtype, `fp8` (DeepEP's: E4M3 with an fp32 scale per 128
    # channels; the combine and the backward stay 16-bit) or null (the activation dtype)
    moe_dispatch_dtype: str | None = None
    # MoE: SMs the dispatch and combine kernels hold while they run beside compute (overlap);
    # null: DeepEP's default 20 for `deepep`, none for the NCCL dispatchers (not modelled)
    moe_comm_sms: int | None = None
    # context parallelism's exchange (Megatron-LM's --cp-comm-type): `p2p` (K/V ring beside
    # the attention), `allgather` (K/V gathered before it) or `a2a` (Ulysses: heads)
    cp_comm: str = "p2p"
    # selective recomputation's modules (Megatron-LM's --recompute-modules: core_attn,
    # layernorm, mlp, moe_act, shared_experts); null: the attention core
    recompute_modules: tuple[str, ...] | None = None
    # full recomputation's replay: `whole` (Megatron-LM, torchtitan) or `early-stop` (torch's
    # non-reentrant checkpoint, e.g. NeMo Automodel: stops at the last tensor backward needs)
    recompute_replay: str = "whole"
    # ZeRO-3: false keeps a layer's gathered weights from its forward to its backward (one
    reshard_after_forward: bool = True  # gather a micro-batch; FSDP2's reshard_after_forward)
    # tensor parallelism's all-gathers and reduce-scatters fused with the GEMMs beside them
    # (torch's async TP, Megatron-LM's --tp-comm-overlap; sim.cost.overlap); needs
    # sequence parallelism
    tp_overlap: bool = False

    def __post_init__(self) -> None:
        coerce_sync(self)
        order_modules(self)
        validate(self)

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp * self.cp

    @property
    def num_microbatches(self) -> int:
        """Micro-batches per replica (with an uneven split: the most any replica runs)."""
        if self.micro_batches_per_replica:
            return max(self.micro_batches_per_replica)
        return self.global_batch_size // (self.dp * self.micro_batch_size)

    @property
    def replica_microbatches(self) -> tuple[int, ...]:
        """Micro-batches of each data-parallel replica."""
        return self.micro_batches_per_replica or (self.num_microbatches,) * self.dp

    @property
    def activation_dtype(self) -> str:
        """Activations (and attention) stay in 16 bits under fp8 training (bf16); fp16 and
        fp32 training keep theirs."""
        return self.dtype if self.dtype in ("fp32", "fp16") else "bf16"

    @property
    def activation_bytes(self) -> int:
        return DTYPE_BYTES[self.activation_dtype]

    @property
    def grad_bytes(self) -> int:
        """Bytes of one gradient in the accumulation buffer and on the wire."""
        if self.grad_reduce_dtype is None:
            return self.activation_bytes
        return DTYPE_BYTES[self.grad_reduce_dtype]

    @property
    def local_tokens(self) -> int:
        """Tokens of one micro-batch on one context-parallel rank."""
        return self.seq_len // self.cp * self.micro_batch_size

    @property
    def dense_replicas(self) -> int:
        """Ranks holding the same dense weight shard (ZeRO shards over these): dp*cp."""
        return self.dp * self.cp

    @property
    def expert_replicas(self) -> int:
        """Ranks holding the same expert weight shard: tp*cp*dp / (etp*ep)."""
        return self.tp * self.cp * self.dp // (expert_tp(self) * self.ep)

    @property
    def placement_order(self) -> tuple[str, ...]:
        return tuple(self.placement.split("-")) if isinstance(self.placement, str) else DIMS

    def algorithm(self, group: str) -> str:
        return dict(self.collectives).get(group, "auto")

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["collectives"] = dict(self.collectives)
        d["placement"] = self.placement if isinstance(self.placement, str) else list(
            self.placement)
        for name in ("layers_per_stage", "micro_batches_per_replica", "moe_expert_load",
                     "recompute_modules"):
            d[name] = None if d[name] is None else list(d[name])
        return {"schema_version": SCHEMA_VERSION, **d, **sync_to_dict(self)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Plan:
        if not isinstance(data, dict):
            raise SpecError("plan", "must be a JSON object")
        data = dict(data)
        version = data.pop("schema_version", SCHEMA_VERSION)
        if version != SCHEMA_VERSION:
            raise SpecError("plan.schema_version", f"this trainsim reads version "
                            f"{SCHEMA_VERSION}, got {version!r}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise SpecError(f"plan.{field_name(unknown[0])}", "unknown field "
                            f"(known: {', '.join(sorted(known))})")
        for req in ("global_batch_size", "seq_len"):
            if req not in data:
                raise SpecError(f"plan.{req}", "is required")
        return cls(**_tuples(data))


def _tuples(data: dict[str, Any]) -> dict[str, Any]:
    out = dict(data)
    if isinstance(out.get("placement"), list):
        out["placement"] = tuple(out["placement"])
    for name in ("layers_per_stage", "micro_batches_per_replica", "moe_expert_load",
                 "recompute_modules"):
        if isinstance(out.get(name), list):
            out[name] = tuple(out[name])
    coll = out.get("collectives", {})
    if not isinstance(coll, dict):
        raise SpecError("plan.collectives", f"must be an object mapping group to algorithm, "
                        f"got {coll!r}")
    out["collectives"] = tuple(sorted(coll.items()))
    return out


def replica_plan(plan: Plan, replica: int) -> Plan:
    """The even-split plan in which every replica runs as many micro-batches as ``replica``
    does in ``plan`` (what that replica's pipeline schedule follows); ``plan`` itself when
    the split is even."""
    if plan.micro_batches_per_replica is None:
        return plan
    m = plan.micro_batches_per_replica[replica]
    return dataclasses.replace(plan, global_batch_size=m * plan.dp * plan.micro_batch_size,
                               micro_batches_per_replica=None)


# Validation -----------------------------------------------------------------------------
def validate(plan: Plan, model: ModelSpec | None = None, cluster: ClusterSpec | None = None
             ) -> None:
    """Every rule a plan must satisfy, alone and against a model and a cluster."""
    _check_fields(plan)
    check_zero(plan)
    check_batch(plan)
    check_schedule(plan)
    _check_placement(plan)
    check_experts(plan)
    check_routing(plan)
    check_sync(plan)
    check_recompute(plan)
    if model is not None:
        _check_model(plan, model)
        check_routing_model(plan, model)
        check_recompute_model(plan, model)
    if cluster is not None:
        _check_cluster(plan, cluster)


def _int_field(plan: Plan, name: str, low: int) -> None:
    v = getattr(plan, name)
    if isinstance(v, bool) or not isinstance(v, int) or v < low:
        raise SpecError(f"plan.{name}", f"must be an integer >= {low}, got {v!r}")


# Upper limits (sim.spec.limits): far above real runs, low enough to answer in seconds.
_LIMITS = {"global_batch_size": (MAX_GLOBAL_BATCH, "sequences"), "seq_len": (MAX_SEQ_LEN, "tokens"),
           "micro_batch_size": (MAX_GLOBAL_BATCH, "sequences"),
           **{d: (MAX_DEVICES, "ranks") for d in ("dp", "tp", "pp", "cp", "ep")},
           "vpp": (MAX_LAYERS, "stages")}


def _check_fields(plan: Plan) -> None:
    for name, (limit, unit) in _LIMITS.items():
        _int_field(plan, name, 1)
        at_most(f"plan.{name}", getattr(plan, name), limit, unit)
    if plan.world_size > MAX_DEVICES:
        raise SpecError("plan.dp*tp*pp*cp", f"{plan.dp}*{plan.tp}*{plan.pp}*{plan.cp} = "
                        f"{plan.world_size:,} must be at most {MAX_DEVICES:,} ranks")
    for name, choices in (("schedule", SCHEDULES), ("recompute", RECOMPUTE_MODES),
                          ("dtype", DTYPES), ("attention", ATTENTION)):
        if getattr(plan, name) not in choices:
            raise SpecError(f"plan.{name}", f"must be one of {', '.join(choices)}, "
                            f"got {getattr(plan, name)!r}")
    if plan.grad_reduce_dtype not in (None, *GRAD_DTYPES):
        raise SpecError("plan.grad_reduce_dtype", f"must be null or one of "
                        f"{', '.join(GRAD_DTYPES)}, got {plan.grad_reduce_dtype!r}")
    for name in ("sequence_parallel", "overlap_grad_reduce", "tp_overlap"):
        if not isinstance(getattr(plan, name), bool):
            raise SpecError(f"plan.{name}", f"must be true or false, got {getattr(plan, name)!r}")
    if plan.sequence_parallel and plan.tp == 1:
        raise SpecError("plan.sequence_parallel", "needs tp > 1 (it splits the tensor-parallel "
                        "group's activations)")
    if plan.tp_overlap and not plan.sequence_parallel:
        raise SpecError("plan.tp_overlap", "needs sequence_parallel (and so tp > 1): the "
                        "overlap pipelines its all-gathers and reduce-scatters, as torch's "
                        "async TP and Megatron-LM's --tp-comm-overlap do")
    _check_lists(plan)
    for group, algo in plan.collectives:
        if group not in ALGORITHMS:
            raise SpecError("plan.collectives", f"unknown group {group!r} (groups: "
                            f"{', '.join(ALGORITHMS)})")
        if algo not in ALGORITHMS[group]:
            raise SpecError(f"plan.collectives.{group}", f"{algo!r} is not an algorithm for "
                            f"this group (choose from: {', '.join(ALGORITHMS[group])})")


def _check_lists(plan: Plan) -> None:
    # a (virtual) stage may hold no layers, only the embedding or the loss (Megatron-LM's
    # layouts do); a replica runs at least one micro-batch
    for name, least in (("layers_per_stage", 0), ("micro_batches_per_replica", 1)):
        lps = getattr(plan, name)
        if lps is not None and (not isinstance(lps, tuple) or any(
                isinstance(n, bool) or not isinstance(n, int) or n < least for n in lps)):
            raise SpecError(f"plan.{name}", f"must be null or a list of integers >= {least}, "
                            f"got {lps!r}")
    if not isinstance(plan.collectives, tuple) or any(
            not isinstance(pair, tuple) or len(pair) != 2 for pair in plan.collectives):
        raise SpecError("plan.collectives", "must be an object mapping group to algorithm")


def _check_placement(plan: Plan) -> None:
    p = plan.placement
    if isinstance(p, str):
        dims = p.split("-")
        if sorted(dims) != sorted(DIMS):
            raise SpecError("plan.placement", f"must order each of {', '.join(DIMS)} exactly "
                            f"once, innermost first (e.g. {DEFAULT_PLACEMENT}), got {p!r}")
        return
    if not isinstance(p, tuple) or any(isinstance(r, bool) or not isinstance(r, int) for r in p):
        raise SpecError("plan.placement", "must be a rank order string or a list of device "
                        "indices")
    if sorted(p) != list(range(plan.world_size)):
        raise SpecError("plan.placement", "rank table must be a permutation of "
                        f"0..{plan.world_size - 1} (world size dp*tp*pp*cp = {plan.world_size}), "
                        f"got {len(p)} entries")


def _check_model(plan: Plan, m: ModelSpec) -> None:
    for what, count in (("num_heads", m.num_heads), ("num_kv_heads", m.kv_heads)):
        if count % plan.tp:
            raise SpecError("plan.tp", f"must divide model.{what}: {count} % {plan.tp} = "
                            f"{count % plan.tp} != 0")
        if plan.cp_comm == "a2a" and count // plan.tp % plan.cp:
            raise SpecError("plan.cp_comm", f"a2a splits each TP rank's heads over cp: "
                            f"model.{what}/tp = {count // plan.tp} is not a multiple of cp = "
                            f"{plan.cp} (use p2p or allgather)")
    check_layers(plan, m)
    check_experts_model(plan, m)
    if plan.tp_overlap and m.is_moe:
        raise SpecError("plan.tp_overlap", f"with an MoE model ({m.name!r}) is not modelled "
                        "(the TP collectives around its experts)")
    if m.position_embedding == "learned" and plan.seq_len > m.max_seq_len:
        raise SpecError("plan.seq_len", f"{plan.seq_len} exceeds the model's learned position "
                        f"table of {m.max_seq_len}")


def _check_cluster(plan: Plan, c: ClusterSpec) -> None:
    if plan.world_size != c.world_size:
        raise SpecError("plan.dp*tp*pp*cp", f"{plan.dp}*{plan.tp}*{plan.pp}*{plan.cp} = "
                        f"{plan.world_size} != {c.world_size} GPUs of cluster {c.name!r}")
    for gpu in {c.gpu, *(g.gpu for g in c.node_groups)}:
        gpu.peak_tflops(plan.dtype)  # raises for a dtype a device lacks
    nvls = [g for g, a in plan.collectives if a == "nvls"]
    if nvls and (c.intra_node.kind != "nvswitch" or not c.gpu.nvls_eff):
        raise SpecError(f"plan.collectives.{nvls[0]}", f"nvls needs NVSwitch in-switch "
                        f"reduction, which {c.gpu.name} on {c.intra_node.kind} does not have")
    sms = min(g.sm_count for g in {c.gpu, *(g.gpu for g in c.node_groups)})
    if plan.moe_comm_sms and sms and plan.moe_comm_sms >= sms:
        raise SpecError("plan.moe_comm_sms", f"{plan.moe_comm_sms} must be fewer than the "
                        f"{sms:g} SMs of {c.gpu.name}")


# Files ------------------------------------------------------------------------------------
def load_plan(path: str | Path) -> Plan:
    from sim.io import read_text

    p = Path(path)
    try:
        data = json.loads(read_text(p, "plan"))
    except json.JSONDecodeError as exc:
        raise SpecError(f"plan[{p.name}]", f"not valid JSON: {exc}") from None
    try:
        return Plan.from_dict(data)
    except TypeError as exc:  # a field of the wrong JSON type slipped through
        raise SpecError(f"plan[{p.name}]", str(exc)) from None


def save_plan(plan: Plan, path: str | Path) -> None:
    from sim.io import atomic_write_text

    atomic_write_text(Path(path), json.dumps(plan.to_dict(), indent=2) + "\n")
