"""The discrete-event tier for workload graphs: one training iteration in SimPy, with every
collective and pipeline transfer run as flows on the cluster's topology.

One process per pipeline stage (data-parallel replica 0 stands for every replica: each
collective's flows carry the copies of all the stage's data-parallel groups, as in
:mod:`sim.network.engine`) runs its schedule (:func:`sim.layout.schedule.stage_ops`: GPipe or
1F1B) layer by layer. A forward waits for its input activation, a backward for its output
gradient; they are sent as soon as produced (``torch.distributed.pipelining``'s
asynchronous sends), ``boundary_bytes`` per sample. The data-parallel stream runs one
collective at a time, in issue order: DDP buckets (a bucket's all-reduce, or reduce-scatter
under ZeRO-1/2, is issued when the backward pass has produced all its gradients: in the last
micro-batch, or in every one under ZeRO-2), ZeRO-3's per-layer gathers (each layer's
parameters, issued for the whole pass ahead of compute, which waits for its layer's) and
reduce-scatters. After the last backward: the remaining collectives, ZeRO-1/2's parameter
all-gather and the optimizer step. Times per layer are the analytic tier's
(:func:`sim.cost.graph.layer_times`).
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import simpy

from sim.cost.costmodel import CostModel
from sim.cost.graph import layer_times, optimizer_time
from sim.layout.graph import (
    check_graph_plan,
    comm_bytes,
    ddp_buckets,
    fsdp_units,
    graph_stages,
)
from sim.layout.placement import groups_of, stage_devices
from sim.layout.schedule import stage_ops
from sim.network.alphabeta import default_algorithm, fabric_for
from sim.network.engine import CommEngine
from sim.network.flows import Network
from sim.network.topology import build_topology
from sim.result import Timing
from sim.spec.cluster import ClusterSpec
from sim.spec.hardware import DTYPE_BYTES
from sim.spec.plan import Plan
from sim.spec.workload import Workload

__all__ = ["graph_des"]

Proc = Generator[Any, Any, None]


class _Stream:
    """One data-parallel stream of a stage: collectives one at a time, in issue order."""

    def __init__(self, step: _GraphStep, stage: int) -> None:
        self.step, self.stage = step, stage
        self.lock = simpy.Resource(step.env, 1)
        self.busy_s = 0.0

    def issue(self, kind: str, size: float) -> simpy.Process:
        return self.step.env.process(self._run(kind, size))

    def _run(self, kind: str, size: float) -> Proc:
        s = self.step
        with self.lock.request() as turn:
            yield turn
            t0 = s.env.now
            yield s.env.process(s.collective(self.stage, kind, size))
            self.busy_s += s.env.now - t0


class _GraphStep:
    def __init__(self, w: Workload, cluster: ClusterSpec, plan: Plan, cost: CostModel) -> None:
        self.w, self.c, self.p, self.cost = w, cluster, plan, cost
        self.env = simpy.Environment()
        self.topo = build_topology(cluster)
        self.engine = CommEngine(self.env, self.topo, Network(self.env, self.topo.cap,
                                                              self.topo.lat))
        self.times = layer_times(w, cluster, plan)
        self.ranges = graph_stages(w, plan, self.times)
        self.e = comm_bytes(plan)
        self.msgs: dict[tuple[str, int, int], simpy.Event] = {}
        self.streams = [_Stream(self, r) for r in range(plan.pp)]
        self.compute_s = [0.0] * plan.pp
        self.p2p_s = [0.0] * plan.pp
        self.end_s = [0.0] * plan.pp
        self.sent_at: dict[tuple[str, int, int], float] = {}
        self.e_act = DTYPE_BYTES[plan.dtype] / DTYPE_BYTES[w.dtype]  # traced -> plan bytes
        self.acct = [dict.fromkeys(("compute", "pp", "bubble", "dp", "optimizer"), 0.0)
                     for _ in range(plan.pp)]

    # devices --------------------------------------------------------------------------
    def dev(self, rank: int) -> int:
        pl = self.p.placement
        return rank if isinstance(pl, str) else pl[rank]

    def dp_groups(self, stage: int) -> list[list[int]]:
        return [[self.dev(r) for r in g] for g in groups_of(self.p, "dp", {"pp": stage})]

    def collective(self, stage: int, kind: str, size: float) -> Proc:
        groups = self.dp_groups(stage)
        algo = self.p.algorithm("dp")
        if algo == "auto":
            algo = default_algorithm(kind, fabric_for(self.c, self._span()), size)
        yield self.env.process(self.engine.run(kind, algo, groups[0], size, groups))

    def _span(self) -> Any:
        from sim.layout.placement import group_span

        return group_span(self.p, self.c, "dp")

    # pipeline -------------------------------------------------------------------------
    def msg(self, key: tuple[str, int, int]) -> simpy.Event:
        if key not in self.msgs:
            self.msgs[key] = self.env.event()
        return self.msgs[key]

    def send(self, stage: int, to: int, key: tuple[str, int, int], size: float) -> Proc:
        pairs = [[self.dev(stage_devices(self.p, d, stage)[0]),
                  self.dev(stage_devices(self.p, d, to)[0])] for d in range(self.p.dp)]
        t0 = self.env.now
        yield self.env.process(self.engine.run("send_recv", "ring", pairs[0], size, pairs))
        self.p2p_s[stage] += self.env.now - t0
        self.msg(key).succeed()

    def wait_msg(self, stage: int, key: tuple[str, int, int], acct: dict[str, float]) -> Proc:
        """Wait for a message: bubble until its transfer starts, pipeline time after."""
        t0, event = self.env.now, self.msg(key)
        yield event
        started = self.sent_at.get(key, t0)
        acct["bubble"] += max(0.0, min(started, self.env.now) - t0)
        acct["pp"] += self.env.now - max(started, t0)

    # the stage's program ------------------------------------------------------------------
    def units(self, stage: int) -> list[tuple[float, range]]:
        return fsdp_units(self.w, self.ranges[stage], self.e)

    def gathers(self, stage: int, backward: bool) -> dict[int, simpy.Process]:
        """ZeRO-3: every unit's parameter all-gather for one pass, issued ahead; the
        layer -> the gather it waits for."""
        if self.p.zero_stage != 3 or self.p.dp == 1:
            return {}
        out = {}
        units = self.units(stage)
        for size, layers in reversed(units) if backward else units:
            proc = self.streams[stage].issue("all_gather", size)
            out.update(dict.fromkeys(layers, proc))
        return out

    def layer(self, stage: int, i: int, seconds: float, gathered: dict[int, simpy.Process],
              acct: dict[str, float]) -> Proc:
        if i in gathered and not gathered[i].triggered:
            t0 = self.env.now
            yield gathered[i]
            acct["dp"] += self.env.now - t0
        yield self.env.timeout(seconds)
        acct["compute"] += seconds

    def forward(self, stage: int, mb: int, acct: dict[str, float]) -> Proc:
        layers = self.ranges[stage]
        if stage > 0:
            yield from self.wait_msg(stage, ("F", mb, stage), acct)
        gathered = self.gathers(stage, backward=False)
        for i in layers:
            yield from self.layer(stage, i, self.times[i][0], gathered, acct)
        if stage < self.p.pp - 1:
            self.post(stage, stage + 1, ("F", mb, stage + 1), layers.stop - 1)

    def post(self, stage: int, to: int, key: tuple[str, int, int], boundary_layer: int) -> None:
        size = self.w.layers[boundary_layer].boundary_bytes * self.p.micro_batch_size \
            * self.e_act
        self.sent_at[key] = self.env.now
        self.env.process(self.send(stage, to, key, size))

    def backward(self, stage: int, mb: int, issued: list[simpy.Process],
                 acct: dict[str, float]) -> Proc:
        layers, p = self.ranges[stage], self.p
        if stage < p.pp - 1:
            yield from self.wait_msg(stage, ("B", mb, stage), acct)
        gathered = self.gathers(stage, backward=True)
        reduce_now = p.dp > 1 and (mb == p.num_microbatches - 1 or p.zero_stage >= 2)
        kind = "all_reduce" if p.zero_stage == 0 else "reduce_scatter"
        buckets = ddp_buckets(self.w, layers, self.e) if reduce_now and p.zero_stage < 3 else \
            [(size, u.start) for size, u in self.units(stage)] if reduce_now else []
        overlap = p.overlap_grad_reduce
        for i in reversed(layers):
            yield from self.layer(stage, i, self.times[i][1], gathered, acct)
            issued += [self.streams[stage].issue(kind, size) for size, first in buckets
                       if first == i and overlap]
        if not overlap:  # every bucket after the backward pass
            issued += [self.streams[stage].issue(kind, size) for size, _ in buckets]
        if stage > 0:
            self.post(stage, stage - 1, ("B", mb, stage - 1), layers.start - 1)

    def run_stage(self, stage: int) -> Proc:
        acct = self.acct[stage]
        issued: list[simpy.Process] = []
        for op, mb, _ in stage_ops(self.p, stage):
            if op == "F":
                yield from self.forward(stage, mb, acct)
            else:
                yield from self.backward(stage, mb, issued, acct)
        t0 = self.env.now
        yield simpy.AllOf(self.env, issued)
        params = sum(self.w.layers[i].params for i in self.ranges[stage])
        if self.p.zero_stage in (1, 2) and self.p.dp > 1:
            yield self.streams[stage].issue("all_gather", params * self.e)
        acct["dp"] += self.env.now - t0
        shards = self.p.dp if self.p.zero_stage >= 1 else 1
        step = optimizer_time(self.w, self.c, params / shards, self.cost)
        yield self.env.timeout(step)
        acct["optimizer"] += step
        self.end_s[stage] = self.env.now


def graph_des(w: Workload, cluster: ClusterSpec, plan: Plan, cost: CostModel) -> Timing:
    """One iteration of a workload graph in the DES (see the module docstring)."""
    check_graph_plan(w, plan, cluster)
    step = _GraphStep(w, cluster, plan, cost)
    for r in range(plan.pp):
        step.env.process(step.run_stage(r))
    step.env.run()
    last = max(range(plan.pp), key=step.end_s.__getitem__)
    a = step.acct[last]
    total = step.end_s[last]
    breakdown = {"compute": a["compute"], "tp": 0.0, "cp": 0.0, "ep": 0.0, "pp": a["pp"],
                 "dp": a["dp"], "optimizer": a["optimizer"], "bubble": a["bubble"]}
    breakdown["bubble"] += total - sum(breakdown.values())  # waits no account names
    busy = step.streams[last].busy_s
    comm = {"pp": {"exposed_s": a["pp"], "overlapped_s": max(0.0, step.p2p_s[last] - a["pp"])},
            "dp": {"exposed_s": a["dp"], "overlapped_s": max(0.0, busy - a["dp"])}}
    pipeline = total - a["optimizer"] - a["dp"]
    return Timing(total, pipeline, breakdown, comm,
                  simulation={"stages_simulated": plan.pp, "reduced": True})
