"""Running collectives on the flow network, with or without symmetry reduction.

Reduced: the flows of a phase that carry the same bytes between the same symmetry classes
(``klass``, :mod:`sim.des.symmetry`) over paths of the same latency — in the group and in
every concurrent copy of it (the same collective on the other groups of its kind and class
mix on the stage) — become one aggregate flow over the union of their paths, with weight on
each link the number of those flows crossing it. Its rate is what each of them gets,
limited by the most loaded link of any, and any other traffic on any of those links
competes with it; a phase ends with its slowest flow. The aggregate keeps its members'
paths, and the network checks at every re-rating that each member would run at that rate
unreduced (:func:`sim.network.flows.check_aggregates`); copies whose phases take other
hop latencies or slowest links than the group's cannot be aggregated at all
(:class:`~sim.network.flows.AsymmetricFlows`). Full: every flow of the group itself,
weight 1 (the copies are run by their own processes).
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any

import numpy as np
import simpy

from sim.errors import SpecError
from sim.network.algorithms import DISPATCH, expand
from sim.network.collectives import CHUNK_BYTES, FlowSpec, Phase
from sim.network.flows import AsymmetricFlows, Members, Network
from sim.network.topology import Topology

__all__ = ["CommEngine"]

Path = tuple[int, ...]
Shape = tuple[np.ndarray, np.ndarray, float, int, Members | None]  # links, weights, latency,
# flow index, members
Klass = Callable[[int], int]  # a device's symmetry class
COUPLED = frozenset({"all_reduce", "all_gather", "reduce_scatter", "broadcast"})


class CommEngine:
    def __init__(self, env: simpy.Environment, topo: Topology, net: Network) -> None:
        self.env, self.topo, self.net = env, topo, net
        self._plans: dict[tuple, list[tuple[Phase, list[Shape], float, float, float]]] = {}
        self._jitter: dict[tuple, list[list[list[Any]]]] = {}  # plan key -> per phase
        self._alive: list[object] = []
        self.rng = np.random.default_rng(0)  # WAN jitter draws (seeded: runs repeat)

    def path(self, devices: list[int], f: FlowSpec) -> Path:
        d = devices[f.src]
        if f.to_switch:
            return (self.topo.lid(d, ("sw", self.topo.node_of(d))),)
        if f.from_switch:
            return (self.topo.lid(("sw", self.topo.node_of(d)), d),)
        return self.topo.route(d, devices[f.dst])

    def nvls_weight(self, device: int) -> float:
        """Weight of an in-switch reduction flow: the switch serves it ``nvls_eff /
        comm_eff`` times faster than a plain transfer (of the device's own GPU type)."""
        g = self.topo.cluster.gpu_of(device)
        return g.comm_eff / g.nvls_eff if g.nvls_eff else 1.0

    def _shapes(self, kind: str, phase: Phase, copies: list[list[int]], klass: Klass,
                reduced: bool) -> tuple[list[Shape], list[tuple[float, float, float]]]:
        """The flows of one phase on ``copies`` (one group unreduced). A reduction's flows
        move in lock step (rings and trees are pipelines: no rank sends faster than it
        receives), so those of one size and kind are one coupled flow per collective; with
        ``reduced`` one aggregate of all the copies' (each copy must take the same hop
        latency). Point-to-point and all-to-all flows are independent: unreduced each is
        its own flow; reduced one aggregate per flow of the group and (classes at both
        ends, path latency) of its copies — for an all-to-all, per (size, classes, path
        latency, link capacities along the path) over the group and its copies, so its
        thousands of flows become a few (the pairs within a node, those across), each copy
        with as many members in each. Every member must get the aggregate's rate, as the
        network checks."""
        coupled = kind in COUPLED
        groups: dict[tuple, tuple[int, list[tuple[int, ...]], list[int], list[float]]] = {}
        each = []
        for c, devices in enumerate(copies):
            hop, nearest, slowest = 0.0, float("inf"), float("inf")
            for i, f in enumerate(phase.flows):
                path = self.path(devices, f)
                lat = self.topo.path_latency(path)
                hop, nearest = max(hop, lat), min(nearest, lat)
                slowest = min(slowest, min(self.topo.cap[link] for link in path))
                switch = f.to_switch or f.from_switch
                scale = self.nvls_weight(devices[f.src]) if switch else 1.0
                key: tuple = (f.size_bytes, switch, scale)
                if not coupled:  # reduced all-to-all: alike flows of the group merge too
                    alike = reduced and kind in ("all_to_all", *DISPATCH)
                    key += (tuple(sorted(self.topo.cap[link] for link in path)) if alike
                            else i, klass(devices[f.src]),
                            -1 if switch else klass(devices[f.dst]), lat)
                entry = groups.setdefault(key, (i, [], [], []))
                entry[1].append(path)
                entry[2].append(c)
                entry[3].append(lat)
            each.append((hop, nearest, slowest))
        out: list[Shape] = []
        for key, (i, paths, copy, lats) in groups.items():
            per_copy = np.bincount(copy, minlength=len(copies))
            if not coupled and per_copy.min() != per_copy.max():  # each copy alike
                raise AsymmetricFlows(f"{kind} flow {i} joins other classes or takes another "
                                      "latency in some copies of the group")
            lat = max(lats)
            if coupled and len(copies) > 1:
                first = [max(x for x, cc in zip(lats, copy, strict=True) if cc == c)
                         for c in range(len(copies))]
                if len(set(first)) > 1:
                    raise AsymmetricFlows(f"{kind} groups {copies[0]} and others start a phase "
                                          "after different latencies")
            members = Members(paths, np.asarray(copy), key[2], coupled=coupled, check=reduced)
            links, weights = members.union()
            out.append((links, weights, lat, i, members))
        return out, each

    def _shape(self, devices: list[int], phase: Phase) -> tuple[float, float, float]:
        """(longest hop latency, shortest, slowest link) of one group's phase."""
        paths = [self.path(devices, f) for f in phase.flows]
        lats = [self.topo.path_latency(p) for p in paths]
        return max(lats), min(lats), min(self.topo.cap[link] for p in paths for link in p)

    def _layout(self, devices: list[int]) -> tuple[tuple[int, ...], ...]:
        """A group's indices per node, nodes in order of first appearance (the expansion
        into flows depends on it: rings' channels, hierarchical and tree phases)."""
        nodes: dict[int, list[int]] = {}
        for i, d in enumerate(devices):
            nodes.setdefault(self.topo.node_of(d), []).append(i)
        return tuple(tuple(n) for n in nodes.values())

    def _plan(self, kind: str, algorithm: str, devices: list[int],
              copies: list[list[int]] | None, klass: Klass | None
              ) -> list[tuple[Phase, list[Shape], float, float, float]]:
        """Per phase of a unit-size collective: the phase, its flow shapes, the longest and
        shortest hop latency and the slowest link; cached per group (sizes scale
        linearly)."""
        key = (kind, algorithm, tuple(devices), id(copies))
        if key not in self._plans:
            self._alive.append(copies)  # keeps id(copies) unique while the plan is cached
            layout = self._layout(devices)
            if any(self._layout(other) != layout for other in copies or ()):
                raise AsymmetricFlows(f"{kind} groups {devices} and others are laid out "
                                      "differently across nodes (their flows differ)")
            plan = []
            for phase in expand(kind, algorithm, len(devices), 1.0, [list(n) for n in layout]):
                hop, near, slowest = self._shape(devices, phase)
                shapes, each = self._shapes(kind, phase, copies or [devices],
                                            klass or (lambda d: 0), copies is not None)
                if phase.near_steps == 0:  # the shortest hop is not charged: need not match
                    each = [(h, near, s) for h, _, s in each]
                if any(x != (hop, near, slowest) for x in each):
                    raise AsymmetricFlows(f"{kind} groups {devices} and others run the same "
                                          "phase over paths of different latency or capacity")
                plan.append((phase, shapes, hop, near, slowest))
            self._plans[key] = plan
            self._jitter[key] = [self._jittered(devices, phase) for phase, *_ in plan]
        return self._plans[key]

    def _jittered(self, devices: list[int], phase: Phase) -> list[list[Any]]:
        """The jitter distributions on each of the group's flows that cross a WAN link with
        jitter (one list a crossing flow)."""
        if not self.topo.jitter:
            return []
        out = []
        for f in phase.flows:
            if f.to_switch or f.from_switch:
                continue
            dists = [self.topo.jitter[i] for i in self.path(devices, f) if i in self.topo.jitter]
            if dists:
                out.append(dists)
        return out

    def jitter_s(self, flows: list[list[Any]], steps: int) -> float:
        """Seconds a phase of ``steps`` steps waits on WAN jitter: each step, each crossing
        flow draws its links' extra delays and the step waits for the slowest flow."""
        if not flows:
            return 0.0
        per_flow = [sum(d.draw(self.rng, steps) for d in dists) for dists in flows]
        out = float(np.max(per_flow, axis=0).sum()) * 1e-3
        if not np.isfinite(out):
            raise SpecError("wan.jitter", "a WAN link's jitter draws overflow: narrow its "
                            "distribution")
        return out

    def run(self, kind: str, algorithm: str, devices: list[int], size_bytes: float,
            copies: list[list[int]] | None = None, klass: Klass | None = None
            ) -> Generator[Any, Any, None]:
        """Process: the collective on ``devices`` (in group order); with ``copies`` (the
        concurrent groups it stands for, ``devices``' own among them) reduced, its flows
        classed by ``klass`` (each device's symmetry class; default: one class)."""
        if len(devices) == 1 or size_bytes <= 0:
            return
        plan = self._plan(kind, algorithm, devices, copies, klass)
        jitter = self._jitter[(kind, algorithm, tuple(devices), id(copies))]
        for (phase, shapes, hop, near, slowest), crossing in zip(plan, jitter, strict=True):
            yield simpy.AllOf(self.env, [
                self.net.transfer(p, phase.flows[i].size_bytes * size_bytes, w, lat, members)
                for p, w, lat, i, members in shapes])
            fill = phase.fill_steps * min(phase.largest * size_bytes, CHUNK_BYTES) \
                if phase.fill_steps else 0.0
            extra = (phase.steps - 1 - phase.near_steps) * hop + phase.near_steps * near \
                + fill / slowest \
                + self.jitter_s(crossing, phase.steps - phase.near_steps)
            if extra > 0:
                yield self.env.timeout(extra)
