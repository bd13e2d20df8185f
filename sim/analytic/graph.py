"""The analytic tier for workload graphs (:class:`sim.spec.workload.Workload`): data
parallelism (DDP's gradient buckets overlapped with backward), ZeRO-1/2/3 (FSDP) and
pipeline parallelism over the layer sequence (GPipe, 1F1B). Layer times:
:mod:`sim.cost.graph`; stages, buckets, units and memory: :mod:`sim.layout.graph`.

DDP: a bucket's all-reduce starts when the backward pass has produced all its gradients and
the previous bucket's is done, so what outlasts the last micro-batch's backward is exposed.
ZeRO-1 reduce-scatters the same buckets and all-gathers the updated parameters after the
step; ZeRO-2 reduce-scatters in every micro-batch's backward; ZeRO-3 (FSDP) gathers each
unit's parameters for forward and backward and reduce-scatters its gradients, prefetched
behind compute except the first unit's. Pipeline stages send the activations live across
their boundary (``boundary_bytes``) forward and the gradients back, asynchronously
(``torch.distributed.pipelining``): a stage's pace is its compute, or its transfers when
slower, and the pipeline takes ``m * t_max + sum(t) - t_max`` plus one crossing of every
boundary each way — exact for balanced stages, an upper bound otherwise (the DES follows
1F1B op by op).
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.cost.costmodel import CostModel
from sim.cost.graph import layer_times, optimizer_time
from sim.layout.graph import (
    activation_scale,
    check_graph_plan,
    comm_bytes,
    ddp_buckets,
    fsdp_units,
    graph_stages,
)
from sim.layout.placement import group_span
from sim.network.algorithms import collective_time
from sim.network.alphabeta import fabric_for
from sim.result import Timing
from sim.spec.cluster import ClusterSpec
from sim.spec.plan import Plan
from sim.spec.workload import Workload

__all__ = ["graph_iteration"]


@dataclass(frozen=True)
class _Stage:
    layers: range
    compute_s: float  # forward + backward of one micro-batch
    backward: list[float]  # each layer's backward seconds
    p2p_s: float
    params: int


def _overlapped(st: _Stage, buckets: list[tuple[float, int]], seconds: list[float]
                ) -> tuple[float, float]:
    """(exposed, overlapped) seconds of the buckets' collectives behind one backward pass:
    a bucket starts once the backward pass has reached its earliest layer and the previous
    bucket's collective has ended; what ends after the backward pass is exposed."""
    ready, acc = {}, 0.0
    for i in reversed(st.layers):  # backward runs from the last layer to the first
        acc += st.backward[i - st.layers.start]
        ready[i] = acc
    end = 0.0
    for (_, first), t in zip(buckets, seconds, strict=True):
        end = max(end, ready[first]) + t
    exposed = max(0.0, end - acc)
    return exposed, sum(seconds) - exposed


class _Coll:
    """Collective seconds on the fabric each group spans (alpha-beta, the plan's algorithm)."""

    def __init__(self, cluster: ClusterSpec, plan: Plan, cost: CostModel) -> None:
        self.plan, self.cost = plan, cost
        self.fabric = {g: fabric_for(cluster, group_span(plan, cluster, g)) for g in ("dp", "pp")}

    def __call__(self, group: str, kind: str, size: float) -> float:
        f = self.fabric[group]
        if f.span.size > 1 and size > 0:
            measured = self.cost.collective(kind, f.span.size, f.span.nodes > 1, size)
            if measured is not None:
                return measured
        return collective_time(kind, f, size, self.plan.algorithm(group))


def _stages(w: Workload, plan: Plan, times: list[tuple[float, float]], coll: _Coll
            ) -> list[_Stage]:
    out = []
    ranges = graph_stages(w, plan, times)
    s = activation_scale(w, plan) * plan.micro_batch_size
    for r, layers in enumerate(ranges):
        fwd = sum(times[i][0] for i in layers)
        compute = fwd + sum(times[i][1] for i in layers)
        sends = [w.layers[layers.start - 1].boundary_bytes * s] if r > 0 else []
        sends += [w.layers[layers.stop - 1].boundary_bytes * s] if r < len(ranges) - 1 else []
        p2p = sum(2 * coll("pp", "send_recv", size) for size in sends)  # activation, gradient
        out.append(_Stage(layers, compute, [times[i][1] for i in layers], p2p,
                          sum(w.layers[i].params for i in layers)))
    return out


def _dp(w: Workload, plan: Plan, st: _Stage, coll: _Coll) -> tuple[float, float, float, float]:
    """(exposed per micro-batch, overlapped per micro-batch, exposed tail, overlapped tail)."""
    if plan.dp == 1:
        return 0.0, 0.0, 0.0, 0.0
    e = comm_bytes(plan)
    buckets = ddp_buckets(w, st.layers, e)
    if plan.zero_stage == 3:  # per unit: gathered for forward and backward, reduce-scattered
        per_unit = [2 * coll("dp", "all_gather", b) + coll("dp", "reduce_scatter", b)
                    for b, _ in fsdp_units(w, st.layers, e)]
        comm, unhidden = sum(per_unit), per_unit[0]  # nothing computes before unit 0 arrives
        exposed = max(0.0, comm - unhidden - st.compute_s) + unhidden
        return exposed, comm - exposed, 0.0, 0.0
    kind = "all_reduce" if plan.zero_stage == 0 else "reduce_scatter"
    seconds = [coll("dp", kind, size) for size, _ in buckets]
    exposed, hidden = _overlapped(st, buckets, seconds) if plan.overlap_grad_reduce \
        else (sum(seconds), 0.0)
    gather = coll("dp", "all_gather", st.params * e) if plan.zero_stage >= 1 else 0.0
    if plan.zero_stage == 2:  # every micro-batch reduce-scatters its gradients
        return exposed, hidden, gather, 0.0
    return 0.0, 0.0, exposed + gather, hidden


def graph_iteration(w: Workload, cluster: ClusterSpec, plan: Plan, cost: CostModel,
                    times: list[tuple[float, float]] | None = None) -> Timing:
    """One training iteration of a workload graph (see the module docstring); ``times``:
    the layers' :func:`~sim.cost.graph.layer_times`, when the caller has them already."""
    check_graph_plan(w, plan, cluster)
    times = times if times is not None else layer_times(w, cluster, plan)
    coll = _Coll(cluster, plan, cost)
    stages = _stages(w, plan, times, coll)
    dp = [_dp(w, plan, st, coll) for st in stages]
    shards = plan.dp if plan.zero_stage >= 1 else 1
    opt = [optimizer_time(w, cluster, st.params / shards, cost) for st in stages]
    # sends are asynchronous: a stage's pace is its compute, or its transfers if slower;
    # the first micro-batch's activations and last gradients cross every boundary in series
    per_mb = [max(st.compute_s + d[0], st.p2p_s) for st, d in zip(stages, dp, strict=True)]
    m = plan.num_microbatches
    slow = max(range(len(stages)), key=per_mb.__getitem__)
    fill = sum(st.p2p_s for st in stages) / 2  # each boundary counted by both its stages
    pipe = m * per_mb[slow] + sum(per_mb) - per_mb[slow] + fill
    tails = [d[2] + o for d, o in zip(dp, opt, strict=True)]
    # the last micro-batch's backward runs from the last stage to the first: stage r is
    # done that much before stage 0, and its own tail (reduction, step) starts then
    ahead = [sum(sum(stages[j].backward) for j in range(r)) for r in range(len(stages))]
    last = max(range(len(stages)), key=lambda r: tails[r] - ahead[r])
    b, t = stages[slow], dp[last]
    pp_s = fill + m * max(0.0, per_mb[slow] - b.compute_s - dp[slow][0])
    breakdown = {"compute": m * b.compute_s, "tp": 0.0, "cp": 0.0, "ep": 0.0,
                 "pp": pp_s, "dp": m * dp[slow][0] + max(0.0, t[2] - ahead[last]),
                 "optimizer": opt[last] - max(0.0, ahead[last] - t[2]),
                 "bubble": pipe - m * b.compute_s - m * dp[slow][0] - pp_s}
    comm = {"pp": {"exposed_s": breakdown["pp"], "overlapped_s": 0.0},
            "dp": {"exposed_s": breakdown["dp"],
                   "overlapped_s": m * dp[slow][1] + t[3]}}
    return Timing(pipe + max(0.0, tails[last] - ahead[last]), pipe, breakdown, comm)
