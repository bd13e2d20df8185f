"""What every part of one simulated step shares: its inputs, the SimPy environment and the
network, the units with their accounts, where each rank sits, and the accounting helpers
(wait, compute, log) every part times its work with.

A *unit* is one tensor-parallel group at one pipeline stage (its ranks run in lock step).
With reduction (default) there is one unit per stage and symmetry class, standing for every
data-parallel and context-parallel replica of the class (:mod:`sim.des.symmetry`).
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from typing import Any

import simpy

from sim.cost import compute as cm
from sim.cost.costmodel import CostModel
from sim.des.symmetry import Classes, replicas_by_rank
from sim.des.watch import EVERY
from sim.layout.placement import rank_coords
from sim.layout.stages import virtual_stage_moe
from sim.network.engine import CommEngine
from sim.network.flows import Network
from sim.network.topology import Topology
from sim.spec.cluster import ClusterSpec
from sim.spec.model import ModelSpec
from sim.spec.plan import Plan

__all__ = ["CATEGORIES", "CountingEnv", "Unit", "Acct", "Context", "Proc"]

CATEGORIES = ("compute", "tp", "cp", "ep", "pp", "dp", "optimizer", "bubble")
Proc = Generator[Any, Any, Any]


class CountingEnv(simpy.Environment):
    """A SimPy environment that counts the events it processes, and every ``EVERY`` of them
    calls ``watch(events, now)`` (:mod:`sim.des.watch`: progress, a wall-clock limit)."""

    processed = 0
    watch: Callable[[int, float], None] | None = None

    def step(self) -> None:
        self.processed += 1
        if self.watch is not None and not self.processed % EVERY:
            self.watch(self.processed, self.now)
        super().step()


@dataclass(frozen=True)
class Unit:
    stage: int
    dp: int  # data-parallel index (its placement ep coordinate is dp % ep_inner)
    cp: int
    rank0: int  # logical rank of its first tensor-parallel rank


@dataclass
class Acct:
    """A unit's seconds on its critical path per category, and each kind's total
    communication time (exposed or not)."""

    spent: dict[str, float] = field(default_factory=lambda: dict.fromkeys(CATEGORIES, 0.0))
    comm_total: dict[str, float] = field(default_factory=lambda: dict.fromkeys(
        ("tp", "cp", "ep", "pp", "dp"), 0.0))
    end: float = 0.0
    pipeline_end: float = 0.0


class Context:
    """One step's shared state. ``reduce``: the replicas' symmetry classes, or True for one
    class (a symmetric step), False for every replica its own. ``engine`` (its environment
    and network) is shared when several jobs run on one fabric (:mod:`sim.des.multijob`);
    ``devices`` maps the plan's devices to the cluster's (the job's slice of a larger
    cluster)."""

    def __init__(self, model: ModelSpec, cluster: ClusterSpec, plan: Plan, cost: CostModel,
                 topo: Topology, reduce: bool | Classes, record: bool,
                 compute_scale: Sequence[float] | None = None,
                 engine: CommEngine | None = None, devices: Sequence[int] | None = None
                 ) -> None:
        self.m, self.c, self.p, self.cost, self.topo = model, cluster, plan, cost, topo
        self.record, self.devices = record, devices
        self.requested = reduce is not False  # reduction asked for (classes or one class)
        if isinstance(reduce, Classes):
            # one replica in all: reduced as before (its flows aggregated, and checked)
            self.classes = reduce
            self.reduce = len(reduce.members) == 1 or not reduce.singletons
        else:
            self.classes = Classes.one(plan) if reduce else Classes.each(plan)
            self.reduce = reduce
        env = engine.env if engine else CountingEnv()
        assert isinstance(env, CountingEnv)  # a shared one counts events too
        self.env = env
        self.net = engine.net if engine else Network(self.env, topo.cap, topo.lat)
        self.engine = engine or CommEngine(self.env, topo, self.net)
        self.sizes, self.strides = rank_coords(plan)
        self.dense_t = cm.layer_time(cost, model, plan)
        self.moe_t = cm.layer_time(cost, model, plan, moe=True) if model.is_moe else self.dense_t
        self.vs_layers = virtual_stage_moe(plan, model)  # per virtual stage, MoE flags
        self.units = self._units()
        self.scale = {u: self._unit_scale(u, compute_scale) for u in self.units}
        self.acct = {u: Acct() for u in self.units}
        self.timeline: list[dict[str, Any]] = []
        # Devices whose collectives run on the cores that compute (CPU ranks, gloo): a unit's
        # background collectives (gradient reduction, ZeRO-3 gathers) hold its core, and
        # compute waits for them instead of running beside them.
        self.core = {u: simpy.Resource(self.env, 1) for u in self.units} \
            if cluster.comm_overlap == 0 else None
        self.tp_index = {self.dev(r): self.tp_coord(r) for r in range(plan.world_size)}
        self.dev_class = self._device_classes()

    # Layout -------------------------------------------------------------------------------
    def dev(self, rank: int) -> int:
        pl = self.p.placement
        d = rank if isinstance(pl, str) else pl[rank]
        return d if self.devices is None else self.devices[d]

    def rank0(self, stage: int, dp: int, cp: int) -> int:
        s, ep = self.strides, self.sizes["ep"]
        return (stage * s["pp"] + cp * s["cp"] + (dp % ep) * s["ep"] + (dp // ep) * s["dp"])

    def unit_at(self, stage: int, dp: int, cp: int) -> Unit:
        return Unit(stage, dp, cp, self.rank0(stage, dp, cp))

    def _units(self) -> list[Unit]:
        return [self.unit_at(s, d, c) for s in range(self.p.pp) for d, c in self.classes.reps]

    def _device_classes(self) -> dict[int, int]:
        """Each device's symmetry class (that of its replica)."""
        of = self.classes.of
        return {self.dev(r): of[q] for r, q in enumerate(replicas_by_rank(self.p))}

    def klass(self, u: Unit) -> int:
        return self.classes.of[(u.dp, u.cp)]

    def _unit_scale(self, u: Unit, compute_scale: Sequence[float] | None) -> float:
        """A TP group runs in lock step: its compute takes its slowest device's time."""
        if compute_scale is None:
            return 1.0
        return max(compute_scale[d] for d in self.tp_devices(u.rank0))

    def tp_devices(self, rank0: int) -> list[int]:
        return [self.dev(rank0 + t * self.strides["tp"]) for t in range(self.p.tp)]

    def tp_coord(self, rank: int) -> int:
        return rank // self.strides["tp"] % self.p.tp

    # Sizes ----------------------------------------------------------------------------------
    @property
    def act(self) -> float:
        """Bytes per element of activations and gradients on the wire."""
        return float(self.p.activation_bytes)

    def tp_bytes(self) -> float:
        """One micro-batch's activation on a TP rank: what a TP collective moves."""
        return self.p.local_tokens * self.m.hidden_size * self.act

    # Accounting ---------------------------------------------------------------------------
    def add(self, u: Unit, what: str, seconds: float) -> None:
        self.acct[u].spent[what] += seconds

    def log(self, u: Unit, stream: str, name: str, start: float) -> None:
        if self.record and self.env.now > start:
            self.timeline.append({"unit": u, "device": self.dev(u.rank0), "stream": stream,
                                  "name": name, "start": start, "end": self.env.now})

    def wait(self, u: Unit, what: str, event: simpy.Event, name: str = "") -> Proc:
        """Wait for ``event``, the time spent on the unit's critical path as ``what``."""
        t0 = self.env.now
        value = yield event
        self.add(u, what, self.env.now - t0)
        self.log(u, "compute" if what == "compute" else what, name or what, t0)
        return value

    def compute(self, u: Unit, seconds: float, name: str) -> Proc:
        if self.core is None:
            yield from self.wait(u, "compute", self.env.timeout(seconds * self.scale[u]), name)
            return
        with self.core[u].request() as core:
            yield from self.wait(u, "dp", core, "core busy with dp")
            yield from self.wait(u, "compute", self.env.timeout(seconds * self.scale[u]), name)

    def on_core(self, u: Unit, start: Callable[[], simpy.Event]) -> Proc:
        """Run a background collective; on a device without overlap it holds the core.
        Returns when it started (after any wait for the core)."""
        if self.core is None:
            t0 = self.env.now
            yield start()
            return t0
        with self.core[u].request() as core:
            yield core
            t0 = self.env.now
            yield start()
            return t0
