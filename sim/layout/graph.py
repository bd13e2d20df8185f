"""How a workload graph (:class:`sim.spec.workload.Workload`) is laid out under a plan: what
a plan may ask of it (data and pipeline parallelism), its pipeline stages, DDP's gradient
buckets, ZeRO-3's gather units, and the memory of each stage's ranks.

Buckets follow ``torch.nn.parallel.DistributedDataParallel``: gradients in reverse
registration order, a first bucket of 1 MiB, then 25 MiB. ZeRO-3 gathers consecutive layers
holding 25 MiB of parameters at a time (a size-based auto-wrap policy, or DeepSpeed's
prefetch buckets): a collective per leaf layer would pay its latency hundreds of times.
"""

from __future__ import annotations

from sim.errors import SpecError
from sim.layout.memory import model_state_bytes_per_param
from sim.spec.cluster import ClusterSpec
from sim.spec.hardware import DTYPE_BYTES
from sim.spec.plan import Plan, validate
from sim.spec.workload import Workload

__all__ = ["check_graph_plan", "activation_scale", "graph_stages", "ddp_buckets", "comm_bytes",
           "fsdp_units", "graph_memory", "FIRST_BUCKET_BYTES", "BUCKET_BYTES",
           "FSDP_UNIT_BYTES"]

FIRST_BUCKET_BYTES = 2**20  # DDP's first bucket (torch's _DEFAULT_FIRST_BUCKET_BYTES)
BUCKET_BYTES = 25 * 2**20  # DDP's bucket_cap_mb default
FSDP_UNIT_BYTES = 25 * 2**20  # parameters per ZeRO-3 gather (see fsdp_units)
GIB = 2**30


def check_graph_plan(w: Workload, plan: Plan, cluster: ClusterSpec | None = None) -> None:
    """What a plan may ask of a workload graph: data and pipeline parallelism only."""
    validate(plan, None, cluster)
    for dim in ("tp", "cp", "ep", "vpp"):
        if getattr(plan, dim) != 1:
            raise SpecError(f"plan.{dim}", f"must be 1 for a workload graph ({w.name}): it "
                            "runs data and pipeline parallelism (tensor, context and expert "
                            "parallelism need a transformer spec)")
    if plan.sequence_parallel:
        raise SpecError("plan.sequence_parallel", f"needs tensor parallelism, which a "
                        f"workload graph ({w.name}) does not run")
    if plan.recompute != "none":
        raise SpecError("plan.recompute", f"{plan.recompute} is not modelled for workload "
                        "graphs (which layers to checkpoint is the model code's choice): use none")
    if plan.seq_len != 1:
        raise SpecError("plan.seq_len", f"must be 1 for a workload graph: its sample "
                        f"({w.sample}) fixes the input, got {plan.seq_len}")
    if plan.attention != "flash":
        raise SpecError("plan.attention", "names a transformer's attention kernel: leave it "
                        "at its default for a workload graph")
    other = sorted(g for g, a in plan.collectives if g not in ("dp", "pp") and a != "auto")
    if other:
        raise SpecError("plan.collectives", f"{other[0]}: a workload graph has only dp and pp "
                        "groups")
    if plan.dtype == "fp8":
        raise SpecError("plan.dtype", "fp8 is not modelled for workload graphs (fp32, bf16, "
                        "fp16)")
    if plan.micro_batches_per_replica is not None:
        raise SpecError("plan.micro_batches_per_replica", "is not modelled for workload graphs")
    if not plan.reshard_after_forward:
        raise SpecError("plan.reshard_after_forward", "false is not modelled for workload graphs")
    if plan.grad_reduce_dtype is not None:
        raise SpecError("plan.grad_reduce_dtype", "is not modelled for workload graphs: their "
                        "data parallelism moves what torch's DDP and FSDP do (fp32 under "
                        "autocast, 16 bits under FSDP's mixed precision)")
    if plan.pp > len(w.layers):
        raise SpecError("plan.pp", f"{plan.pp} stages exceed the workload's "
                        f"{len(w.layers)} layers")
    split = plan.layers_per_stage
    if split is not None and (len(split) != plan.pp or sum(split) != len(w.layers)
                              or min(split) < 1):
        raise SpecError("plan.layers_per_stage", f"must be {plan.pp} counts >= 1 adding up to "
                        f"the workload's {len(w.layers)} layers, got {list(split)}")


def activation_scale(w: Workload, plan: Plan) -> float:
    """Activation bytes at the plan's dtype over those traced."""
    return DTYPE_BYTES[plan.dtype] / DTYPE_BYTES[w.dtype]


def graph_stages(w: Workload, plan: Plan, times: list[tuple[float, float]]) -> list[range]:
    """Each pipeline stage's layers: the plan's split, else contiguous stages whose largest
    forward + backward time is the smallest possible."""
    if plan.layers_per_stage is not None:
        starts = [sum(plan.layers_per_stage[:i]) for i in range(plan.pp + 1)]
        return [range(starts[i], starts[i + 1]) for i in range(plan.pp)]
    cost = [f + b for f, b in times]
    lo, hi = max(cost), sum(cost)
    for _ in range(60):  # bisection on the bottleneck; the greedy packing decides
        mid = (lo + hi) / 2
        if len(_pack(cost, mid, plan.pp)) <= plan.pp:
            hi = mid
        else:
            lo = mid
    return _pack(cost, hi, plan.pp)


def _pack(cost: list[float], cap: float, stages: int) -> list[range]:
    """Greedy contiguous packing under ``cap``, leaving at least a layer per later stage."""
    out: list[range] = []
    start, acc = 0, 0.0
    for i, c in enumerate(cost):
        left = len(cost) - i
        if i > start and (acc + c > cap or left < stages - len(out)):
            out.append(range(start, i))
            start, acc = i, 0.0
        acc += c
    out.append(range(start, len(cost)))
    return out


def comm_bytes(plan: Plan) -> float:
    """Bytes per parameter element that data parallelism moves: bf16 training keeps fp32
    weights and gradients under autocast (DDP reduces fp32), except where FSDP's
    mixed-precision policy gathers and reduces in bf16 (ZeRO-2/3)."""
    return 2.0 if plan.dtype in ("bf16", "fp16") and plan.zero_stage >= 2 else 4.0


def ddp_buckets(w: Workload, layers: range, e: float) -> list[tuple[float, int]]:
    """DDP's buckets of a stage's gradients: (bytes, first layer index in the bucket).
    Tensors join in reverse registration order and a bucket closes once it holds at least
    its cap (1 MiB the first, then 25 MiB), as ``compute_bucket_assignment_by_size``."""
    tensors = [(n * e, i) for i in layers for n in w.layers[i].param_tensors]
    out: list[tuple[float, int]] = []
    size, first, cap = 0.0, -1, FIRST_BUCKET_BYTES
    for nbytes, i in reversed(tensors):
        size, first = size + nbytes, i
        if size >= cap:
            out.append((size, first))
            size, cap = 0.0, BUCKET_BYTES
    if size:
        out.append((size, first))
    return out


def fsdp_units(w: Workload, layers: range, e: float) -> list[tuple[float, range]]:
    """ZeRO-3's units: consecutive layers grouped until they hold FSDP_UNIT_BYTES of
    parameters (as a size-based auto-wrap policy or DeepSpeed's prefetch buckets do; a
    collective per leaf layer would pay its latency hundreds of times). (bytes, layers)."""
    out: list[tuple[float, range]] = []
    start, size = layers.start, 0.0
    for i in layers:
        size += w.layers[i].params * e
        if size >= FSDP_UNIT_BYTES or i == layers.stop - 1:
            out.append((size, range(start, i + 1)))
            start, size = i + 1, 0.0
    return [u for u in out if u[0] > 0] or [(0.0, layers)]


def graph_memory(w: Workload, cluster: ClusterSpec, plan: Plan,
                 times: list[tuple[float, float]]) -> list[float]:
    """Peak GiB of each pipeline stage's ranks: parameters, gradients and Adam states under
    ZeRO, saved activations of the micro-batches in flight (1F1B: pp - stage; GPipe: all),
    the largest layer output as working space, and the device's reserve."""
    w_b, g_b, o_b = model_state_bytes_per_param(plan.dtype, plan.zero_stage, plan.dp,
                                                plan.grad_bytes)
    s = activation_scale(w, plan) * plan.micro_batch_size
    out = []
    for r, layers in enumerate(graph_stages(w, plan, times)):
        params = sum(w.layers[i].params for i in layers)
        frozen = sum(w.layers[i].frozen_params for i in layers)
        kept = sum(w.layers[i].saved_bytes for i in layers)
        flight = plan.num_microbatches if plan.schedule == "gpipe" and plan.pp > 1 else \
            min(plan.num_microbatches, plan.pp - r)
        work = max(w.layers[i].output_bytes for i in layers) * s
        gathered = max((b for b, _ in fsdp_units(w, layers, 4.0)), default=0.0) \
            if plan.zero_stage == 3 and plan.dp > 1 else 0.0  # the unit being computed
        total = params * (w_b + g_b + o_b) + frozen * DTYPE_BYTES[plan.dtype] \
            + kept * s * flight + work + gathered
        out.append(total / GIB + cluster.gpu.reserved_gib)
    return out
