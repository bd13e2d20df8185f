"""The discrete-event tier: one training iteration simulated in SimPy.

Each unit (one tensor-parallel group at one pipeline stage, :mod:`sim.des.context`) runs
its stage's schedule (:mod:`sim.layout.schedule`): per micro-batch and virtual stage the
chunk's forward or backward (:mod:`sim.des.layers`), and between them the pipeline's
point-to-point calls (:mod:`sim.des.pipeline`). Gradients are reduced in buckets on a
separate data-parallel stream while backward goes on; ZeRO-3 prefetches each layer's
weights (:mod:`sim.des.data_parallel`); the first and last stage all-reduce the tied
embedding's gradient; the optimizer step ends it. Every collective goes through
:mod:`sim.des.comm`.

Reduction (default): one unit per stage and symmetry class of the data-parallel replicas
(:mod:`sim.des.symmetry`: one class on a healthy cluster; a straggler's replica, the
replicas that share its collective groups, a failed NIC's replica become their own); every
collective's flows stand for those of the groups of its kind and class mix that run at the
same time on that stage, and a collective whose links nothing else uses is simulated once
per shape and then replayed as a delay. The network checks that every aggregate flow's
members would run at its rate unreduced; where one would not, the step is run again
unreduced and says why. ``reduce=False`` simulates every unit and every flow.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import simpy

from sim.cost import compute as cm
from sim.cost.costmodel import CostModel
from sim.des.comm import Collectives
from sim.des.context import CATEGORIES, Acct, Context, CountingEnv, Proc, Unit
from sim.des.data_parallel import DataParallel
from sim.des.layers import Layers
from sim.des.pipeline import Pipeline
from sim.des.symmetry import Classes, Replica, refine
from sim.des.watch import Watch
from sim.layout.memory import rank_params
from sim.layout.placement import rank_coords
from sim.layout.schedule import Exchange, Op, stage_program
from sim.layout.stages import StageLayers, pipeline_rank_layers, rank_virtual_stages
from sim.network.engine import CommEngine
from sim.network.failures import CannotComplete, install_failures
from sim.network.flows import AsymmetricFlows
from sim.network.links import link_table
from sim.network.perturbation import NO_PERTURBATION, LinkFailure, Perturbation
from sim.network.topology import Topology, build_topology
from sim.result import Timing
from sim.spec.cluster import ClusterSpec
from sim.spec.model import ModelSpec
from sim.spec.plan import Plan, replica_plan

__all__ = ["simulate_des", "issued_collectives", "reducible", "Step", "CATEGORIES",
           "CountingEnv"]


_PARTS = {"B": "full", "I": "input", "W": "weight"}


def _program(plan: Plan, stage: int) -> list[Op | Exchange]:
    """The stage's program; with ``a2a`` overlap and no pipeline, Megatron-LM's merged order
    (the forward of micro-batch i+1 beside the backward of i: F0, F1 B0, ..., B_last)."""
    program = stage_program(plan, stage)
    if plan.moe_overlap != "a2a" or plan.pp > 1 or plan.vpp > 1:
        return program  # (dualpipev pairs its passes itself)
    m = plan.num_microbatches
    out: list[Op | Exchange] = [("F", 0, 0)]
    for k in range(1, m):
        out += [("F", k, 0), ("B", k - 1, 0)]
    return out + [("B", m - 1, 0)]


class Step:
    """One simulated iteration, composed of its parts over one shared context."""

    def __init__(self, model: ModelSpec, cluster: ClusterSpec, plan: Plan, cost: CostModel,
                 topo: Topology, reduce: bool | Classes, record: bool,
                 compute_scale: Sequence[float] | None = None,
                 engine: CommEngine | None = None, devices: Sequence[int] | None = None
                 ) -> None:
        """See :class:`~sim.des.context.Context` for ``engine`` and ``devices``."""
        self.x = Context(model, cluster, plan, cost, topo, reduce, record, compute_scale,
                         engine, devices)
        self.comm = Collectives(self.x)
        self.dp = DataParallel(self.x, self.comm)
        self.layers = Layers(self.x, self.comm, self.dp)
        self.pipeline = Pipeline(self.x, self.comm)

    @property
    def units(self) -> list[Unit]:
        return self.x.units

    def unit(self, u: Unit, stage: StageLayers) -> Proc:
        """Process: the unit's whole step."""
        x = self.x
        items = _program(replica_plan(x.p, u.dp), u.stage)
        merging = x.p.moe_overlap == "a2a"
        stages = rank_virtual_stages(x.p, u.stage)
        i = 0
        while i < len(items):
            item = items[i]
            i += 1
            if isinstance(item, Exchange):
                yield from self.pipeline.exchange(u, item)
                continue
            kind, mb, chunk = item
            vs = stages[chunk]
            nxt = items[i] if i < len(items) else None
            if merging and kind == "F" and isinstance(nxt, tuple) and nxt[0] == "B":
                # a merged step: this forward and the next backward, all-to-alls aside
                self.layers.merge(u)
                yield from self.layers.forward(u, vs, mb)
                yield from self.layers.backward(u, stages[nxt[2]], nxt[1])
                yield from self.layers.join(u)
                i += 1
                continue
            if kind == "F":
                yield from self.layers.forward(u, vs, mb)
            else:  # B: the whole backward; I, W: its input and weight gradients apart
                yield from self.layers.backward(u, vs, mb, _PARTS[kind])
        x.acct[u].pipeline_end = x.env.now
        yield from self.finish(u, stage)
        x.acct[u].end = x.env.now

    def finish(self, u: Unit, stage: StageLayers) -> Proc:
        """Remaining gradient reduction, the embedding group's all-reduce, the optimizer
        step, ZeRO-1/2's weight gather."""
        x, p = self.x, self.x.p
        yield from self.dp.tail(u, stage)
        yield from self.pipeline.embedding_allreduce(u, stage)
        dense, expert = rank_params(x.m, p, stage)
        shards = (p.dense_replicas, p.expert_replicas) if p.zero_stage >= 1 else (1, 1)
        seconds = cm.optimizer_time(x.cost, dense / shards[0] + expert / shards[1])
        yield from x.wait(u, "optimizer", x.env.timeout(seconds * x.scale[u]), "optimizer")
        yield from self.dp.zero_gather(u, stage)


def _links(x: Context, seconds: float, top: int | None = 10) -> list[dict[str, Any]]:
    """The busiest links: utilisation = bytes / (capacity x iteration)."""
    return link_table(x.topo, x.net.stats.bytes, x.net.stats.busy_s, seconds, top)


def _communication(a: Acct) -> dict[str, dict[str, float]]:
    out = {}
    for kind in ("tp", "cp", "ep", "pp", "dp"):
        exposed = a.spent[kind]
        out[kind] = {"exposed_s": exposed,
                     "overlapped_s": max(0.0, a.comm_total[kind] - exposed)}
    return out


def reducible(plan: Plan, compute_scale: Sequence[float] | None,
              dev: Callable[[int], int] | None = None) -> bool:
    """Whether one unit per stage can stand for all: every replica runs as many
    micro-batches and every rank of a pipeline stage has the same compute scale (``dev``
    maps a logical rank to its device)."""
    if len(set(plan.replica_microbatches)) > 1:
        return False
    if compute_scale is None:
        return True
    dev = dev or (lambda r: r)
    sizes, strides = rank_coords(plan)
    seen: dict[int, float] = {}
    for r in range(plan.world_size):
        stage = r // strides["pp"] % sizes["pp"]
        if seen.setdefault(stage, compute_scale[dev(r)]) != compute_scale[dev(r)]:
            return False
    return True


def symmetry_classes(plan: Plan, topo: Topology, perturbation: Perturbation) -> Classes:
    """The replicas' symmetry classes under ``perturbation``: given each replica its units'
    compute scales and micro-batches, and (as its own class) any replica with a device on a
    node at a slowed (``topo.slowed``) or failing link's end; refined by
    :func:`sim.des.symmetry.refine`."""
    sizes, strides = rank_coords(plan)
    scale = perturbation.compute_scale
    pl = plan.placement
    dev = (lambda r: r) if isinstance(pl, str) else pl.__getitem__
    touched = _touched_devices(topo, perturbation)

    def given(q: Replica) -> tuple:
        e = sizes["ep"]
        units = [s * strides["pp"] + q[1] * strides["cp"] + (q[0] % e) * strides["ep"]
                 + (q[0] // e) * strides["dp"] for s in range(plan.pp)]
        devices = [[dev(r0 + t * strides["tp"]) for t in range(sizes["tp"])] for r0 in units]
        own = q if any(d in touched for ds in devices for d in ds) else None
        speed = tuple(max(scale[d] for d in ds) for ds in devices) if scale else ()
        return speed, plan.replica_microbatches[q[0]], own
    return refine(plan, given)


def _touched_devices(topo: Topology, perturbation: Perturbation) -> set[int]:
    """Devices of every node at a slowed or failing link's ends (its GPUs, switch, NICs or
    router): re-routed traffic crosses the node's other links too."""
    lids = {i for f in perturbation.link_failures for i in f.link_ids} | set(topo.slowed)
    g = topo.cluster.gpus_per_node
    return {n * g + k for n in _nodes_at(topo, lids) for k in range(g)}


def failure_nodes(topo: Topology, failures: Sequence[LinkFailure]) -> set[int]:
    """Nodes at the ends of failing links."""
    return _nodes_at(topo, {i for f in failures for i in f.link_ids})


def _nodes_at(topo: Topology, lids: set[int]) -> set[int]:
    out = set()
    for v in (v for i in lids for v in topo.links[i]):
        if isinstance(v, int):
            out.add(topo.node_of(v))
        elif v[0] in ("nic", "sw", "rt"):  # type: ignore[index]
            out.add(v[1])  # type: ignore[index]
    return out


def _until_done(x: Context, procs: list[simpy.Process]) -> None:
    """Run until every unit has finished (a link failing after the step changes nothing)."""
    try:
        x.env.run(until=simpy.AllOf(x.env, procs))
    except RuntimeError as exc:  # the queue ran dry first: a deadlock, reported by _run
        if "No scheduled events left" not in str(exc):
            raise


def _run_with_failures(step: Step, failures: Sequence[LinkFailure],
                       procs: list[simpy.Process]) -> Timing | None:
    """Run the step with links failing; the Timing of a step that cannot complete."""
    x = step.x
    # Re-routed flows cross the links of the nodes at a failed link's ends (a failed NIC's
    # traffic goes over its node's switch to another NIC): nothing there is memoised, and a
    # step asked to reduce falls back if a detour crosses any other node. The step it falls
    # back to (or one asked for unreduced) memoises nothing.
    nodes = failure_nodes(x.topo, failures)
    if x.requested:
        step.comm.detour_nodes = nodes
    else:
        step.comm.exclusive = set()
    install_failures(x.env, x.net, x.topo, failures, nodes if x.requested else None)
    try:
        _until_done(x, procs)
    except CannotComplete as exc:
        info = {"reduced": x.reduce, "units": len(x.units), "events": x.env.processed,
                "completed": False,
                "cannot_complete": f"{exc}; the step stalls at {x.env.now:.6g} s"}
        zero = dict.fromkeys(CATEGORIES, 0.0)
        return Timing(math.inf, math.inf, zero, _communication(Acct()), [], info, [])
    return None


def _check_scale(compute_scale: Sequence[float] | None, cluster: ClusterSpec) -> None:
    if compute_scale is None:
        return
    if len(compute_scale) != cluster.world_size:
        raise ValueError(f"compute_scale has {len(compute_scale)} entries for "
                         f"{cluster.world_size} devices")
    if any(not (x > 0) for x in compute_scale):
        raise ValueError("compute_scale entries must be > 0")


def _run(step: Step, procs: list[simpy.Process], failures: Sequence[LinkFailure]
         ) -> Timing | None:
    """Run the step to its end; the Timing of a step that cannot complete, else None."""
    x = step.x
    if failures:
        stalled = _run_with_failures(step, failures, procs)
        if stalled is not None:
            return stalled
    else:
        _until_done(x, procs)
    stuck = [u for u, proc in zip(x.units, procs, strict=True) if proc.is_alive]
    if stuck:  # an internal error, never a time: every unit must finish its step
        raise RuntimeError(f"discrete-event step deadlocked at {x.env.now:.6g} s with "
                           f"{len(stuck)} of {len(x.units)} units unfinished "
                           f"(first: stage {stuck[0].stage}, dp {stuck[0].dp})")
    return None


def simulate_des(model: ModelSpec, cluster: ClusterSpec, plan: Plan, cost: CostModel,
                 reduce: bool = True, record: bool = False,
                 perturbation: Perturbation = NO_PERTURBATION,
                 top_links: int | None = 10, watch: Watch | None = None) -> Timing:
    """Simulate one iteration; ``record`` keeps the per-unit timeline (for traces);
    ``top_links`` busiest links are reported (``None``: every used link).
    ``perturbation`` (:class:`~sim.network.perturbation.Perturbation`): its compute scale
    multiplies every compute duration of each device (index = device; 1.2 is 20% slower):
    stragglers, or other GPU types relative to the cost model's. Its topology replaces the
    cluster's (slowed links), and its link failures fail links mid-step: when a flow has no
    path left the step cannot complete, and the Timing says so with an infinite iteration
    time. With ``reduce`` one representative per symmetry class is simulated (see the
    module), else every unit. ``watch`` (:class:`~sim.des.watch.Watch`) sees the run's
    progress and may stop it (:class:`~sim.des.watch.WallLimit`)."""
    _check_scale(perturbation.compute_scale, cluster)
    topo = perturbation.topology or build_topology(cluster)
    if reduce:
        classes = symmetry_classes(plan, topo, perturbation)
        why = None if not classes.singletons or len(classes.members) == 1 else \
            "no two data-parallel replicas are alike (compute speed, micro-batches, links " \
            "or collective partners)"
        try:
            return _simulate(model, cluster, plan, cost, classes, record, perturbation, topo,
                             top_links, why, watch)
        except AsymmetricFlows as exc:
            why = f"the reduction is not exact here: {exc}"
            if watch is not None:
                watch.rerun(exc.events)
            return _simulate(model, cluster, plan, cost, False, record, perturbation, topo,
                             top_links, why, watch)
    return _simulate(model, cluster, plan, cost, False, record, perturbation, topo, top_links,
                     None, watch)


def _simulate(model: ModelSpec, cluster: ClusterSpec, plan: Plan, cost: CostModel,
              classes: Classes | bool, record: bool, perturbation: Perturbation,
              topo: Topology, top_links: int | None, why_full: str | None,
              watch: Watch | None) -> Timing:
    step = Step(model, cluster, plan, cost, topo, classes, record,
                perturbation.compute_scale)
    x = step.x
    x.env.watch = watch
    try:
        return _simulated(step, model, plan, perturbation, top_links, why_full)
    except AsymmetricFlows as exc:
        exc.events = x.env.processed
        raise


def _simulated(step: Step, model: ModelSpec, plan: Plan, perturbation: Perturbation,
               top_links: int | None, why_full: str | None) -> Timing:
    x = step.x
    stages = pipeline_rank_layers(plan, model)
    procs = [x.env.process(step.unit(u, stages[u.stage])) for u in x.units]
    stalled = _run(step, procs, perturbation.link_failures)
    if stalled is not None:
        return stalled
    critical = max(x.units, key=lambda u: (x.acct[u].end, -u.stage))
    a = x.acct[critical]
    info: dict[str, Any] = {"reduced": x.reduce, "units": len(x.units),
                            "classes": len(x.classes.members), "events": x.env.processed}
    if why_full is not None:
        info["not_reduced_because"] = why_full
    return Timing(a.end, a.pipeline_end, dict(a.spent), _communication(a),
                  _links(x, a.end, top_links), info, x.timeline)


def issued_collectives(model: ModelSpec, cluster: ClusterSpec, plan: Plan, cost: CostModel,
                       replica: int = 0) -> list[list[dict[str, Any]]]:
    """Per pipeline stage, the collectives one rank of data-parallel ``replica`` issues in
    the simulated step: rows of (group, kind, count, bytes) as
    :func:`sim.layout.inventory.expected_collectives` gives them (with its ``SIMULATED``
    conventions they must agree)."""
    step = Step(model, cluster, plan, cost, build_topology(cluster), reducible(plan, None),
                False)
    step.x.net.check = False  # an account of what is issued, not a time
    stages = pipeline_rank_layers(plan, model)
    procs = [step.x.env.process(step.unit(u, stages[u.stage])) for u in step.units]
    _run(step, procs, ())
    rows: list[list[dict[str, Any]]] = [[] for _ in range(plan.pp)]
    reduced = step.x.reduce
    for (dp, stage, group, kind), (count, size) in sorted(step.comm.issued.items()):
        if dp != (0 if reduced else replica):
            continue
        rows[stage].append({"group": group, "kind": kind, "count": int(count),
                            "bytes": int(round(size))})
    return rows
