"""``simulate_sync``: data-parallel synchronisation strategies over many steps.

The one-step tiers (:func:`sim.api.simulate`) price one BSP step; this runs a clock per
worker (a data-parallel replica) for many steps. A worker's local step is the tier's BSP
iteration without its data-parallel reduction (compute, pipeline, TP/CP collectives,
optimizer), scaled by its slowest device (``--straggler``, heterogeneous GPUs) and a
per-step jitter draw, plus what compression and averaging compute. What it synchronises
with is the plan's ``sync`` over its ``communication`` (:mod:`sim.spec.sync`):

- ``fidelity="des"``: the multi-step DES (:mod:`sim.des.workers`): flows on the topology
  with parameter servers as vertices, staleness recorded per update, warm-up dropped by
  MSER-5;
- ``fidelity="analytic"``: the closed forms (:mod:`sim.analytic.sync`).

BSP over all-reduce with identical workers reproduces the one-step tier: its step is the
tier's iteration time (the reduction as the tier exposes it, the rest overlapped).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from sim.api import simulate
from sim.cost.scales import combine_scales, gpu_compute_scales
from sim.cost.sync import compression_s, elementwise_s, outer_step_s
from sim.errors import SpecError
from sim.layout.placement import group_span
from sim.layout.sync import PAYLOAD_BYTES, gradient, shard_fractions, worker_devices
from sim.network.algorithms import collective_time
from sim.network.alphabeta import fabric_for
from sim.network.servers import add_servers
from sim.network.topology import Topology, build_topology
from sim.network.workers import SyncSetup
from sim.spec.cluster import ClusterSpec
from sim.spec.gossip import gossip_edges
from sim.spec.model import ModelSpec
from sim.spec.plan import Plan, validate
from sim.spec.sync import architecture, as_bsp
from sim.spec.workload import Workload
from sim.strategies.byteps import aggregate_nodes, partition_count, partition_note
from sim.strategies.host import CPU_KEYS, host_cap, resampled
from sim.strategies.result import SyncResult, summarise

if TYPE_CHECKING:
    from sim.spec.faults import Dist, Faults

__all__ = ["simulate_sync", "build_setup", "covering_steps", "MAX_SYNC_STEPS"]

Measured = Mapping[str, "float | Sequence[float]"]  # a profile of the workers (_measured)
MAX_SYNC_STEPS = 100_000  # local steps per worker a run may simulate
MAX_SYNC_WORK = 20_000_000  # workers x steps x (servers or peers): bounds a run's events


def simulate_sync(model: ModelSpec | Workload, cluster: ClusterSpec, plan: Plan,
                  fidelity: str = "des", *, steps: int = 200, faults: Faults | None = None,
                  jitter: Dist | None = None, seed: int = 0, trace: str | None = None,
                  trace_steps: int = 5, convergence: str | None = None,
                  lr: float | None = None, target: float = 0.95,
                  measured: Measured | None = None) -> SyncResult:
    """Simulate ``steps`` local steps of every data-parallel worker under ``plan.sync``;
    with ``convergence`` (a bundled model name or a CSV of measured runs) and ``lr``, also
    the time to ``target`` test accuracy (:mod:`sim.strategies.accuracy`)."""
    out = _simulate(model, cluster, plan, fidelity, steps, faults, jitter, seed, trace,
                    trace_steps, measured)
    if convergence is None:
        return out
    from sim.strategies.accuracy import time_to_target

    if lr is None:
        raise SpecError("lr", "time-to-accuracy needs the learning rate the runs use")
    return dataclasses.replace(out, time_to_target=time_to_target(out, plan, convergence,
                                                                  lr, target))


def _simulate(model: ModelSpec | Workload, cluster: ClusterSpec, plan: Plan, fidelity: str,
              steps: int, faults: Faults | None, jitter: Dist | None, seed: int,
              trace: str | None, trace_steps: int, measured: Measured | None
              ) -> SyncResult:
    if fidelity not in ("analytic", "des"):
        raise SpecError("fidelity", f"must be analytic or des, got {fidelity!r}")
    if isinstance(steps, bool) or not isinstance(steps, int) or not 1 <= steps <= MAX_SYNC_STEPS:
        raise SpecError("steps", f"must be an integer in 1..{MAX_SYNC_STEPS:,}, got {steps!r}")
    if not isinstance(model, Workload):
        validate(plan, model, cluster)
    t0 = time.perf_counter()
    setup, tier = build_setup(model, cluster, plan, fidelity, faults, jitter, seed, measured)
    fan = max(1, len(setup.shards) * max(1, setup.partitions),
              max((len(setup.neighbours(w)) for w in range(setup.workers)), default=1))
    if setup.workers * steps * fan * len(setup.devices[0]) > MAX_SYNC_WORK:
        raise SpecError("steps", f"{setup.workers:,} workers x {steps:,} steps x {fan} "
                        f"servers or peers x {len(setup.devices[0])} ranks is over "
                        f"{MAX_SYNC_WORK:,} transfers: simulate fewer steps")
    if fidelity == "analytic":
        from sim.analytic.sync import sync_closed_form

        return _on_host(summarise(setup, tier, fidelity, rates=sync_closed_form(setup),
                                  wall_s=time.perf_counter() - t0, model=model,
                                  cluster=cluster), plan, measured)
    from sim.des.workers import run_workers

    sync = plan.sync
    if sync.kind in ("local-sgd", "diloco") and steps < 3 * sync.period + sync.warmup_steps:
        setup.notes.append(f"{steps} steps cover fewer than three averaging periods of "
                           f"{sync.period}: the rate is not a steady state (give more steps)")
    rec = run_workers(setup, steps, trace_steps if trace else 0)
    out = _on_host(summarise(setup, tier, fidelity, record=rec,
                             wall_s=time.perf_counter() - t0, model=model, cluster=cluster),
                   plan, measured)
    if trace:
        from sim.strategies.result import write_sync_trace

        write_sync_trace(trace, rec, setup)
    return out


def _on_host(out: SyncResult, plan: Plan, measured: Measured | None) -> SyncResult:
    """The host cap (:func:`sim.strategies.host.host_cap`) where the profile gives the
    host's cores and the ranks' CPU seconds."""
    if not measured or "host_cores" not in measured:
        return out
    cpu = {k: float(v) for k, v in measured.items() if k in CPU_KEYS}  # type: ignore[arg-type]
    return host_cap(out, plan, cpu, float(measured["host_cores"]))  # type: ignore[arg-type]


def covering_steps(plan: Plan, steps: int) -> int:
    """``steps``, or more for local SGD and DiLoCo: their warm-up and twenty averaging
    periods, so the rate is a steady state's."""
    sync = plan.sync
    if sync.kind in ("local-sgd", "diloco"):
        return max(steps, 20 * sync.period + sync.warmup_steps)
    return steps


def build_setup(model: ModelSpec | Workload, cluster: ClusterSpec, plan: Plan,
                fidelity: str, faults: Faults | None = None, jitter: Dist | None = None,
                seed: int = 0, measured: Measured | None = None
                ) -> tuple[SyncSetup, object]:
    """The workers, their step times and their traffic for ``plan`` (and the one-step
    tier's BSP result it starts from). ``measured``: a profile of the workers themselves
    (``step_s``: a local step; ``step_samples_s``: measured local steps, drawn per worker
    and step; ``allreduce_s``: a whole all-reduce of the gradient over them, not
    overlapped) in place of the tier's figures (:func:`_measured`); ``host_cores`` and the
    ranks' CPU seconds (``step_cpu_s``, ...: :data:`sim.strategies.host.CPU_KEYS`) cap the
    result on a shared host (:func:`_on_host`)."""
    tier = simulate(model, cluster, as_bsp(plan), fidelity)
    if not math.isfinite(tier.iteration_time_s):
        raise SpecError("plan", "the BSP step it starts from cannot complete")
    exposed = tier.breakdown.get("dp", 0.0)
    local = tier.iteration_time_s - exposed
    devices = worker_devices(plan)
    factors, topo, failures = _worker_factors(model, cluster, plan, devices, faults)
    hidden = None if isinstance(model, Workload) else model.hidden_size
    grad = gradient(model, plan, hidden)
    ranks = len(devices[0])
    gpu = cluster.gpu
    extra = compression_s(gpu, plan.compression, grad.elements / ranks,
                          int(grad.raw_bytes / grad.elements), plan.dtype, hidden)
    s = SyncSetup(plan, topo, devices, [], plan.global_batch_size / plan.dp,
                  exposed_s=exposed, jitter=jitter, seed=seed)
    _traffic(s, model, cluster, grad, ranks)
    if plan.sync.kind == "two-stage":
        extra += elementwise_s(gpu, grad.raw_bytes / ranks * (1 - _important(s, model)), 2.0)
    if plan.sync.kind == "gossip":
        degree = max(len(s.neighbours(w)) for w in range(s.workers))
        extra += elementwise_s(gpu, grad.raw_bytes / ranks, 1.0 + degree)  # the average
    if measured:
        local = _measured(s, measured, local)
    s.compute_s = [(local + extra) * f for f in factors]
    if architecture(plan) == "ps":
        s.partitions = partition_count(grad.raw_bytes, plan.communication.partition_MB)
        if fidelity == "analytic":
            partition_note(s)
        if plan.communication.aggregate == "node":
            aggregate_nodes(s, cluster, grad.raw_bytes)
    if failures:
        from sim.strategies.failures import after_failure

        after_failure(s, model, cluster, plan, faults, tier, failures, fidelity)
    if plan.compression.kind != "none" and plan.compression.warmup_steps:
        s.notes.append(f"compression warm-up ({plan.compression.warmup_steps} uncompressed "
                       "steps) is not simulated: every step is compressed")
    return s, tier


def _measured(s: SyncSetup, measured: Measured, local: float) -> float:
    """Apply a measured profile of the workers; returns their local step. ``step_s``: the
    mean local step; ``step_samples_s``: the measured steps themselves, drawn per worker and
    step as a jitter (:mod:`sim.strategies.host`; their mean is the step unless ``step_s``
    is given); ``allreduce_s``: a whole all-reduce, replacing the collective model's (and
    BSP's exposed share: a step measured without overlap); ``host_cores`` (>= 1) and the
    CPU seconds of :data:`sim.strategies.host.CPU_KEYS` are checked here and applied after
    the run (:func:`_on_host`)."""
    known = {"step_s", "step_samples_s", "allreduce_s", "host_cores", *CPU_KEYS}
    seconds: dict[str, float] = {}
    for key, value in measured.items():
        if key not in known:
            raise SpecError(f"measured.{key}", f"unknown (known: {', '.join(sorted(known))})")
        if key == "step_samples_s":
            continue
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise SpecError(f"measured.{key}", f"must be a number, got {value!r}")
        if key == "host_cores":
            if not 1 <= value < math.inf:
                raise SpecError("measured.host_cores", f"must be a number >= 1, got {value!r}")
            continue
        if not 0 <= value < math.inf:
            raise SpecError(f"measured.{key}", f"must be seconds >= 0, got {value!r}")
        seconds[key] = float(value)
    samples = measured.get("step_samples_s")
    if samples is not None:
        if s.jitter is not None:
            raise SpecError("measured.step_samples_s", "give measured steps or a jitter, "
                            "not both")
        if isinstance(samples, (int, float)):
            raise SpecError("measured.step_samples_s", "must be a list of step times")
        s.jitter = resampled(samples)
        local = sum(samples) / len(samples)
    if "allreduce_s" in seconds:
        _measured_allreduce(s, seconds["allreduce_s"])
    return seconds.get("step_s", local)


def _measured_allreduce(s: SyncSetup, t: float) -> None:
    kind = s.plan.sync.kind
    s.exposed_s = t
    s.average_s = t + (s.average_s - s.allreduce_s if kind == "diloco" else 0.0)
    if kind == "local-sgd" or kind == "bsp":
        s.average_s = t
    if kind == "two-stage":
        f = s.stage1_s / max(s.stage1_s + s.stage2_s, 1e-30)
        s.stage1_s, s.stage2_s = t * f, t * (1 - f)
    s.allreduce_s = t


def _worker_factors(model: ModelSpec | Workload, cluster: ClusterSpec, plan: Plan,
                    devices: list[list[int]], faults: Faults | None
                    ) -> tuple[list[float], Topology, tuple[Any, ...]]:
    """Each worker's slow-down (its slowest device: GPU type and stragglers), the topology
    with slowed links, and the links failing during the run."""
    scales = None if isinstance(model, Workload) else gpu_compute_scales(model, cluster, plan)
    topo: Topology | None = None
    failures: tuple[Any, ...] = ()
    if faults is not None and not faults.empty:
        from sim.network.failures import fault_inputs

        f = fault_inputs(faults, cluster, plan, "des", True)
        scales = combine_scales(scales, f.perturbation.compute_scale)
        topo = f.perturbation.topology
        failures = f.perturbation.link_failures
    topo = topo or build_topology(cluster)
    if scales is None:
        return [1.0] * len(devices), topo, failures
    return [max(scales[d] for d in ranks) for ranks in devices], topo, failures


def _allreduce_s(cluster: ClusterSpec, plan: Plan, nbytes: float, kind: str = "all_reduce"
                 ) -> float:
    """One whole all-reduce (all-gather for top-k) of ``nbytes`` per rank over the
    data-parallel group, closed form (:func:`sim.network.algorithms.collective_time`)."""
    fabric = fabric_for(cluster, group_span(plan, cluster, "dp"))
    return collective_time(kind, fabric, nbytes, plan.algorithm("dp"))


def _traffic(s: SyncSetup, model: ModelSpec | Workload, cluster: ClusterSpec, grad: object,
             ranks: int) -> None:
    plan = s.plan
    arch, kind = architecture(plan), plan.sync.kind
    wire, raw = grad.wire_bytes, grad.raw_bytes  # type: ignore[attr-defined]
    elements = grad.elements  # type: ignore[attr-defined]
    coll = "all_gather" if plan.compression.kind == "topk" else "all_reduce"
    per_rank = wire / ranks * (plan.dp if coll == "all_gather" else 1)
    s.allreduce_s = _allreduce_s(cluster, plan, per_rank, coll)
    if arch == "allreduce" and plan.compression.kind != "none":
        # the tier overlapped the uncompressed reduction; compressed, it exposes at most
        # what remains of the whole compressed one
        s.exposed_s = min(s.exposed_s, s.allreduce_s)
    if kind == "local-sgd":  # H = 1 is BSP: DDP's reduction, overlapped as the tier has it
        s.average_s = s.allreduce_s if plan.sync.period > 1 else s.exposed_s
    elif kind == "diloco":
        pseudo = elements * PAYLOAD_BYTES[plan.sync.pseudo_gradient_dtype] / ranks
        s.average_s = _allreduce_s(cluster, plan, pseudo) + outer_step_s(
            cluster.gpu, elements / ranks)
    elif kind == "two-stage":
        f = _important(s, model)
        s.stage1_s = _allreduce_s(cluster, plan, per_rank * f, coll)
        s.stage2_s = _allreduce_s(cluster, plan, per_rank * (1 - f), coll)
    s.push_bytes = wire
    s.pull_bytes = wire if plan.compression.kind in ("none", "fp16", "int8", "onebit") else raw
    s.server_bytes = raw
    if arch == "ps":
        from sim.layout.sync import parameter_tensors

        comm = plan.communication
        s.shards = shard_fractions(parameter_tensors(model), comm.servers, comm.sharding)
        s.servers = add_servers(s.topo, comm, [d for w in s.devices for d in w])
    if kind == "gossip":
        s.edges = gossip_edges(plan.sync.graph, plan.sync.edges, plan.dp)


def _important(s: SyncSetup, model: ModelSpec | Workload) -> float:
    """Two-stage's share of the gradient synchronised at once."""
    names = s.plan.sync.important_layers
    if not names:
        return s.plan.sync.important_fraction
    if not isinstance(model, Workload):
        raise SpecError("plan.sync.important_layers", "names layers of a workload graph; for a "
                        "transformer spec give important_fraction")
    known = {layer.name: layer.params for layer in model.layers}
    missing = [n for n in names if n not in known]
    if missing:
        raise SpecError("plan.sync.important_layers", f"{missing[0]!r} is not a layer of "
                        f"{model.name} (e.g. {', '.join(list(known)[:4])})")
    total = sum(known.values())
    return max(1e-9, sum(known[n] for n in names) / total)
