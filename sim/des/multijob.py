"""Several training jobs on one cluster, simulated together on one shared network.

Each job has its own model and plan and runs on a disjoint set of whole nodes; all of them
run in one SimPy environment on one flow-level :class:`~sim.network.flows.Network`, so their
flows share links (pod uplinks, spines, router links) max-min fairly with each other's.
A job's devices are its nodes' devices in order: the plan's device ``d`` (after its
placement) is the ``d``-th of them.

Method: every job starts at time 0 and runs iterations back to back (an iteration begins
when every rank of the previous one has finished its optimizer step, as after Megatron's
global gradient-norm all-reduce). The window ends when every job has finished at least
``iterations`` iterations; jobs that iterate faster keep running until then, so every
iteration counted overlaps with the other jobs' traffic. A job's *together* time is the
mean of the iterations it finished in the window, its *alone* time one iteration of it on
the same nodes of the same cluster with nothing else running (every solo iteration is the
same), and its slowdown ``together / alone - 1``.

Symmetry reduction holds across jobs: a reduced job's aggregate flow carries weight ``w``
on a link for the ``w`` flows it stands for, so on a link it shares with another job's
flows weighted max-min gives it the per-flow share each of those flows would get
(:mod:`sim.network.engine`); memoised collectives stay exact because whole nodes are never
shared, so a node's own links carry one job's traffic only. A job whose ranks of one stage
compute at different speeds (its nodes hold different GPU types of a heterogeneous
cluster) runs unreduced, as in :func:`sim.des.run.simulate_des`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Generator, Sequence
from dataclasses import dataclass, field
from typing import Any

import simpy

from sim.cost.profiled import cost_model_for
from sim.cost.scales import gpu_compute_scales
from sim.des.run import CountingEnv, Step, reducible
from sim.errors import SpecError
from sim.layout.stages import pipeline_rank_layers
from sim.network.engine import CommEngine
from sim.network.flows import Network
from sim.network.links import link_table
from sim.network.topology import Topology, build_topology
from sim.spec.cluster import ClusterSpec
from sim.spec.model import ModelSpec
from sim.spec.plan import Plan, validate

__all__ = ["Job", "JobResult", "CoSimResult", "cosimulate", "run_jobs", "job_devices",
           "job_cluster", "check_jobs"]


@dataclass(frozen=True)
class Job:
    name: str
    model: ModelSpec
    plan: Plan
    nodes: tuple[int, ...]  # cluster node indices, in the job's device order


@dataclass(frozen=True)
class JobResult:
    name: str
    nodes: tuple[int, ...]
    alone_s: float
    together_s: float  # mean iteration time in the shared window
    iterations_s: list[float]  # every iteration finished in the window

    @property
    def slowdown_pct(self) -> float:
        return 100.0 * (self.together_s / self.alone_s - 1.0)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "nodes": list(self.nodes), "alone_s": self.alone_s,
                "together_s": self.together_s, "slowdown_pct": self.slowdown_pct,
                "iterations": len(self.iterations_s), "iterations_s": self.iterations_s}


@dataclass(frozen=True)
class CoSimResult:
    cluster: str
    jobs: list[JobResult]
    window_s: float
    min_iterations: int
    reduced: bool
    links: list[dict[str, Any]] = field(default_factory=list)  # busiest, over the window

    def to_dict(self) -> dict[str, Any]:
        return {"cluster": self.cluster, "window_s": self.window_s,
                "min_iterations": self.min_iterations, "reduced": self.reduced,
                "jobs": [j.to_dict() for j in self.jobs], "links": self.links}


@dataclass
class _Run:
    """What a shared-fabric simulation leaves behind."""

    iterations_s: list[list[float]]  # per job
    window_s: float
    net: Network


def job_devices(cluster: ClusterSpec, nodes: Sequence[int]) -> list[int]:
    g = cluster.gpus_per_node
    return [n * g + i for n in nodes for i in range(g)]


def job_cluster(cluster: ClusterSpec, job: Job) -> ClusterSpec:
    """The job's slice: the same cluster with only the job's nodes (the plan is checked
    against it, its group spans choose the collective algorithms, its GPU the cost model)."""
    inter = dataclasses.replace(cluster.inter_node, pod_gpus=min(
        cluster.inter_node.pod_gpus, len(job.nodes) * cluster.gpus_per_node))
    changes: dict[str, Any] = {"nodes": len(job.nodes), "inter_node": inter,
                               "name": f"{cluster.name}[{job.name}]"}
    if getattr(cluster, "node_groups", ()):  # a heterogeneous cluster: the job's groups
        changes["node_groups"] = _groups_of(cluster, job.nodes)
        changes["gpu"] = changes["node_groups"][0].gpu
    return dataclasses.replace(cluster, **changes)


def _groups_of(cluster: Any, nodes: Sequence[int]) -> tuple[Any, ...]:
    """The node groups of a slice: one per run of its nodes in the same group."""
    runs: list[list[Any]] = []
    for n in nodes:
        group = cluster.group_of_node(n)
        if runs and runs[-1][0] is group:
            runs[-1][1] += 1
        else:
            runs.append([group, 1])
    return tuple(dataclasses.replace(g, nodes=k) for g, k in runs)


def check_jobs(cluster: ClusterSpec, jobs: Sequence[Job]) -> None:
    """Names unique, nodes on the cluster and disjoint, each plan valid on its slice."""
    if not jobs:
        raise SpecError("jobs", "give at least one job")
    owner: dict[int, str] = {}
    for i, job in enumerate(jobs):
        where = f"job[{i}]"
        if job.name in {j.name for j in jobs[:i]}:
            raise SpecError(f"{where}.name", f"{job.name!r} names two jobs")
        if not job.nodes:
            raise SpecError(f"{where}.nodes", "give at least one node")
        for n in job.nodes:
            if not 0 <= n < cluster.nodes:
                raise SpecError(f"{where}.nodes", f"node {n} is not on cluster "
                                f"{cluster.name!r} (nodes 0-{cluster.nodes - 1})")
            if n in owner:
                raise SpecError(f"{where}.nodes", f"node {n} is already used by job "
                                f"{owner[n]!r} (jobs share the network, not nodes)")
            owner[n] = job.name
        try:
            validate(job.plan, job.model, job_cluster(cluster, job))
        except SpecError as exc:
            raise SpecError(f"{where}.{exc.field}", exc.rule) from None


def _iterate(env: simpy.Environment, engine: CommEngine, cluster: ClusterSpec, job: Job,
             reduce: bool, out: list[float], finished: simpy.Event, counts: list[list[float]],
             goal: int) -> Generator[Any, Any, None]:
    """Process: the job's iterations back to back, each appended to ``out``."""
    sub, devices = job_cluster(cluster, job), job_devices(cluster, job.nodes)
    cost, stages = cost_model_for(sub), pipeline_rank_layers(job.plan, job.model)
    scales = gpu_compute_scales(job.model, sub, job.plan)  # by the job's own device index
    pl = job.plan.placement
    reduce = reduce and reducible(job.plan, scales, None if isinstance(pl, str) else
                                  (lambda r: pl[r]))
    by_device = None if scales is None else _on_cluster(cluster, devices, scales)
    while True:
        t0 = env.now
        step = Step(job.model, sub, job.plan, cost, engine.topo, reduce, False,
                    by_device, engine=engine, devices=devices)
        yield simpy.AllOf(env, [env.process(step.unit(u, stages[u.stage]))
                                for u in step.units])
        out.append(env.now - t0)
        if not finished.triggered and all(len(c) >= goal for c in counts):
            finished.succeed()


def _on_cluster(cluster: ClusterSpec, devices: Sequence[int], scales: Sequence[float]
                ) -> list[float]:
    """Per-device compute scales of a job, indexed by cluster device (1 elsewhere)."""
    out = [1.0] * cluster.world_size
    for d, x in zip(devices, scales, strict=True):
        out[d] = x
    return out


def run_jobs(cluster: ClusterSpec, jobs: Sequence[Job], iterations: int = 1,
             reduce: bool = True, topology: Topology | None = None) -> _Run:
    """Run the jobs together until each has finished ``iterations`` iterations."""
    topo = topology or build_topology(cluster)
    env = CountingEnv()
    net = Network(env, topo.cap, topo.lat)
    # Jobs share links, so a reduced job's aggregate flows meet other jobs' traffic: they
    # are not checked member by member (co-simulation keeps its one-class reduction).
    net.check = False
    engine = CommEngine(env, topo, net)
    finished = env.event()
    times: list[list[float]] = [[] for _ in jobs]
    for job, out in zip(jobs, times, strict=True):
        env.process(_iterate(env, engine, cluster, job, reduce, out, finished, times,
                             iterations))
    env.run(until=finished)
    return _Run(times, env.now, net)


def cosimulate(cluster: ClusterSpec, jobs: Sequence[Job], iterations: int = 3,
               reduce: bool = True, top_links: int | None = 10) -> CoSimResult:
    """Each job's iteration time together with the others and alone, and the
    ``top_links`` busiest links of the shared window (``None``: every used link)."""
    if isinstance(iterations, bool) or not isinstance(iterations, int) or iterations < 1:
        raise SpecError("iterations", f"must be an integer >= 1, got {iterations!r}")
    check_jobs(cluster, jobs)
    topo = build_topology(cluster)
    shared = run_jobs(cluster, jobs, iterations, reduce, topo)
    results = []
    for job, times in zip(jobs, shared.iterations_s, strict=True):
        alone = run_jobs(cluster, [job], 1, reduce, topo).iterations_s[0][0]
        results.append(JobResult(job.name, job.nodes, alone, sum(times) / len(times), times))
    stats = shared.net.stats
    return CoSimResult(cluster.name, results, shared.window_s, iterations, reduce,
                       link_table(topo, stats.bytes, stats.busy_s, shared.window_s, top_links))
