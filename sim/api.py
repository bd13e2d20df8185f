"""``simulate``: the one entry point to every fidelity tier."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sim.analytic.iteration import analytic_iteration
from sim.analytic.replicas import replica_analytic
from sim.cost.costmodel import CostModel
from sim.cost.profiled import cost_model_for
from sim.cost.scales import combine_scales, gpu_compute_scales, mean_peak_tflops
from sim.errors import SpecError
from sim.layout.flops import hardware_flops_per_token, model_flops_per_token
from sim.layout.memory import memory_report
from sim.layout.placement import site_aware, wan_crossings
from sim.layout.routing import routing
from sim.network.perturbation import NO_PERTURBATION, Perturbation
from sim.result import Result, Timing
from sim.spec.cluster import ClusterSpec
from sim.spec.limits import MAX_DES_MICROBATCHES
from sim.spec.model import ModelSpec
from sim.spec.plan import Plan, validate
from sim.spec.recompute import recomputed, stops_early
from sim.spec.sync import is_default_sync
from sim.spec.workload import Workload

if TYPE_CHECKING:
    from sim.des.watch import Watch
    from sim.spec.faults import Faults

__all__ = ["simulate", "FIDELITIES"]

FIDELITIES = ("analytic", "des")


def simulate(model: ModelSpec | Workload, cluster: ClusterSpec, plan: Plan,
             fidelity: str = "analytic", *, reduce: bool = True, trace: str | None = None,
             faults: Faults | None = None, watch: Watch | None = None) -> Result:
    """Predict one training iteration of ``model`` on ``cluster`` under ``plan``. The DES
    tier can run without symmetry reduction (``reduce=False``) and write a Chrome trace;
    ``watch`` (:class:`sim.des.watch.Watch`) shows its progress and may stop it at a
    wall-clock limit (raising :class:`sim.des.watch.WallLimit`).
    ``faults``: stragglers and link failures (:mod:`sim.spec.faults`). A workload graph
    (:class:`sim.spec.workload.Workload`) runs in the analytic tier (:mod:`sim.analytic.graph`)."""
    if fidelity not in FIDELITIES:
        raise SpecError("fidelity", f"must be one of {', '.join(FIDELITIES)}, got {fidelity!r}")
    if not is_default_sync(plan):
        raise SpecError("plan.sync", f"{strategy_of(plan)} runs over many steps: simulate it "
                        "with sim.strategies.simulate_sync (trainsim simulate does)")
    plan = site_aware(plan, cluster)  # sites: whole replicas at each
    if isinstance(model, Workload):
        return _graph(model, cluster, plan, fidelity, faults)
    validate(plan, model, cluster)
    if fidelity == "des" and plan.num_microbatches > MAX_DES_MICROBATCHES:  # sim.spec.limits
        raise SpecError("plan.global_batch_size", f"{plan.num_microbatches:,} micro-batches per "
                        f"replica: the des tier runs each one and takes at most "
                        f"{MAX_DES_MICROBATCHES:,} (the analytic tier takes any)")
    cost = cost_model_for(cluster)
    if faults is not None and not faults.empty:
        return _with_faults(model, cluster, plan, fidelity, cost, faults, reduce, trace, watch)
    scales = gpu_compute_scales(model, cluster, plan)  # GPU types other than the cost model's
    timing = _des(model, cluster, plan, cost, reduce, trace, NO_PERTURBATION.with_scale(scales),
                  watch) if fidelity == "des" else _analytic(model, cluster, plan, cost, scales)
    return _result(model, cluster, plan, fidelity, timing, cost)


def strategy_of(plan: Plan) -> str:
    """``ssp over ps`` (the strategy and the architecture in effect)."""
    from sim.spec.sync import architecture

    return f"{plan.sync.kind} over {architecture(plan)}" + (
        f" with {plan.compression.kind} compression" if plan.compression.kind != "none" else "")


def _with_faults(model: ModelSpec, cluster: ClusterSpec, plan: Plan, fidelity: str,
                 cost: CostModel, faults: Faults, reduce: bool, trace: str | None,
                 watch: Watch | None) -> Result:
    """Stragglers in both tiers (the analytic one per stage, at its slowest rank), slowed
    and failed links in the DES (reduced by symmetry classes, :mod:`sim.des.symmetry`)."""
    import dataclasses

    from sim.network.failures import fault_inputs

    f = fault_inputs(faults, cluster, plan, fidelity, reduce)
    gpu_scales = gpu_compute_scales(model, cluster, plan)
    scales = combine_scales(gpu_scales, f.perturbation.compute_scale)  # stragglers x GPU type
    if fidelity == "des":
        timing = _des(model, cluster, plan, cost, f.reduce, trace,
                      f.perturbation.with_scale(scales), watch)
    elif gpu_scales is not None or plan.micro_batches_per_replica is not None:
        timing = _analytic(model, cluster, plan, cost, scales)
    else:
        timing = analytic_iteration(model, cluster, plan, cost, f.stage_scale)
    timing.simulation.update(f.info)
    result = _result(model, cluster, plan, fidelity, timing, cost)
    notes = f.notes + ([f"step cannot complete: {timing.simulation['cannot_complete']}"]
                       if "cannot_complete" in timing.simulation else [])
    return dataclasses.replace(result, warnings=[*result.warnings, *notes])


def _analytic(model: ModelSpec, cluster: ClusterSpec, plan: Plan, cost: CostModel,
              scales: list[float] | None = None) -> Timing:
    """Per replica when devices differ in speed or replicas in micro-batches
    (:func:`sim.analytic.replicas.replica_analytic`)."""
    if scales is None and plan.micro_batches_per_replica is None:
        return analytic_iteration(model, cluster, plan, cost)
    return replica_analytic(model, cluster, plan, cost, scales)


def _des(model: ModelSpec, cluster: ClusterSpec, plan: Plan, cost: CostModel, reduce: bool,
         trace: str | None, perturbation: Perturbation, watch: Watch | None = None) -> Timing:
    """The DES tier (imported here: simulating analytically never loads SimPy)."""
    import time

    from sim.des.run import simulate_des

    t0 = time.perf_counter()
    if watch is not None and watch.estimate_s is None:  # what progress is measured against
        scale = perturbation.compute_scale
        watch.estimate_s = _analytic(model, cluster, plan, cost,
                                     None if scale is None else list(scale)).iteration_s
    out = simulate_des(model, cluster, plan, cost, reduce=reduce, record=trace is not None,
                       perturbation=perturbation, watch=watch)
    out.simulation["wall_s"] = time.perf_counter() - t0
    if trace:
        from sim.des.trace import write_chrome_trace

        sim_info = out.simulation
        write_chrome_trace(trace, out.timeline, cluster,
                           sim_info.get("classes") if sim_info.get("reduced") else None)
    return out


def _graph(w: Workload, cluster: ClusterSpec, plan: Plan, fidelity: str,
           faults: Faults | None) -> Result:
    from sim.analytic.graph import graph_iteration
    from sim.cost.graph import layer_times, measured_note
    from sim.layout.graph import check_graph_plan, graph_memory

    if faults is not None and not faults.empty:
        raise SpecError("--straggler/--fail-link", "are not modelled for workload graphs yet")
    check_graph_plan(w, plan, cluster)
    cost, times = cost_model_for(cluster), layer_times(w, cluster, plan)
    if fidelity == "des":
        from sim.des.graph import graph_des

        if plan.num_microbatches > MAX_DES_MICROBATCHES:
            raise SpecError("plan.global_batch_size", f"{plan.num_microbatches:,} micro-batches "
                            f"per replica: the des tier takes at most {MAX_DES_MICROBATCHES:,}")
        t = graph_des(w, cluster, plan, cost)
    else:
        t = graph_iteration(w, cluster, plan, cost, times)
    ranks = graph_memory(w, cluster, plan, times)
    peak, capacity = max(ranks), cluster.gpu.memory_gib
    flops = (w.forward_flops_per_sample + w.backward_flops_per_sample) * plan.global_batch_size
    recomputed = w.forward_flops_per_sample * plan.global_batch_size \
        if plan.recompute == "full" else 0.0
    if not t.iteration_s > 0:
        raise SpecError("workload", f"{w.name} has no FLOPs, bytes or parameters: nothing to "
                        "time")
    per_gpu = t.iteration_s * cluster.world_size * 1e12
    samples = plan.global_batch_size / t.iteration_s
    return Result(
        fidelity=fidelity, model=w.name, cluster=cluster.name, gpus=cluster.world_size,
        iteration_time_s=t.iteration_s, tokens_per_s=samples * plan.seq_len,
        model_tflops_per_gpu=flops / per_gpu, hardware_tflops_per_gpu=(flops + recomputed)
        / per_gpu, mfu=flops / per_gpu / mean_peak_tflops(cluster, plan.dtype),
        peak_memory_gib=peak, memory_capacity_gib=capacity, fits_in_memory=peak <= capacity,
        bubble_fraction=t.breakdown["bubble"] / t.pipeline_s if t.pipeline_s else 0.0,
        num_microbatches=plan.num_microbatches, breakdown=t.breakdown,
        communication=t.communication, memory_gib=[{"total": g} for g in ranks],
        warnings=_warnings(plan, peak, capacity) + [n for n in [measured_note(w, cluster, plan)]
                                                    if n], samples_per_s=samples)


def _result(model: ModelSpec, cluster: ClusterSpec, plan: Plan, fidelity: str, t: Timing,
            cost: CostModel) -> Result:
    tokens = plan.global_batch_size * plan.seq_len
    gpus = cluster.world_size
    per_gpu_s = t.iteration_s * gpus * 1e12
    model_tf = model_flops_per_token(model, plan.seq_len) * tokens / per_gpu_s
    hw_tf = hardware_flops_per_token(model, plan.seq_len, plan.recompute, recomputed(plan),
                                     stops_early(plan)) * tokens / per_gpu_s
    mem = memory_report(model, cluster, plan)  # each stage against its own GPUs
    peak, capacity = mem.peak_gib, mem.capacity_gib
    return Result(
        fidelity=fidelity, model=model.name, cluster=cluster.name, gpus=gpus,
        iteration_time_s=t.iteration_s, tokens_per_s=tokens / t.iteration_s,
        model_tflops_per_gpu=model_tf, hardware_tflops_per_gpu=hw_tf,
        mfu=model_tf / mean_peak_tflops(cluster, plan.dtype), peak_memory_gib=peak,
        memory_capacity_gib=capacity, fits_in_memory=peak <= capacity,
        bubble_fraction=t.breakdown["bubble"] / t.pipeline_s if t.pipeline_s else 0.0,
        num_microbatches=plan.num_microbatches, breakdown=t.breakdown,
        communication=t.communication, memory_gib=mem.ranks_gib,
        extrapolated=sorted(cost.extrapolated),
        warnings=_warnings(plan, peak, capacity) + _dropped(model, plan)
        + model.seq_len_warnings(plan.seq_len) + [
            f"{g} groups span sites: their traffic crosses the WAN (placement "
            f"{plan.placement}; the default order keeps whole replicas a site)"
            for g in wan_crossings(plan, cluster)],
        links=t.links, simulation=t.simulation,
        samples_per_s=plan.global_batch_size / t.iteration_s,
        routing=routing(model, plan).to_dict() if model.is_moe else {})


def _dropped(model: ModelSpec, plan: Plan) -> list[str]:
    dropped = routing(model, plan).dropped_fraction
    if dropped <= 0:
        return []
    return [f"capacity factor {plan.moe_capacity_factor:g} drops {dropped:.1%} of the routed "
            "tokens: their expert work is not done (and not timed)"]


def _warnings(plan: Plan, peak_gib: float, capacity_gib: float) -> list[str]:
    out = []
    if peak_gib > capacity_gib:
        out.append(f"peak memory {peak_gib:.1f} GiB exceeds {capacity_gib:.1f} GiB per device")
    if "core_attn" in recomputed(plan) and plan.attention == "flash":
        out.append("recompute=selective re-runs the attention core, but flash attention keeps "
                   "no s x s scores: it costs time and saves no memory")
    return out
