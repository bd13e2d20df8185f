"""Running collectives on the flow network, with or without symmetry reduction.

Reduced: the flows of a phase that carry the same bytes — in the group and in every
concurrent copy of it (the same collective on the other groups of its kind on the stage) —
become one aggregate flow over the union of their paths, with weight on each link the
number of those flows crossing it. Its rate is what each of them gets, limited by the most
loaded link of any, and any other traffic on any of those links competes with it; a phase
ends with its slowest flow, so giving all of them the slowest rate changes nothing on a
symmetric network. Full: every flow of the group itself, weight 1 (the copies are run by
their own processes).
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import numpy as np
import simpy

from sim.network.algorithms import expand
from sim.network.collectives import CHUNK_BYTES, FlowSpec, Phase
from sim.network.flows import Network
from sim.network.topology import Topology

__all__ = ["CommEngine"]

Path = tuple[int, ...]
Shape = tuple[np.ndarray, np.ndarray, float, int]  # links, weights, latency, flow index


class CommEngine:
    def __init__(self, env: simpy.Environment, topo: Topology, net: Network) -> None:
        self.env, self.topo, self.net = env, topo, net
        self._plans: dict[tuple, list[tuple[Phase, list[Shape], float, float]]] = {}
        self._alive: list[object] = []

    def path(self, devices: list[int], f: FlowSpec) -> Path:
        d = devices[f.src]
        if f.to_switch:
            return (self.topo.lid(d, ("sw", self.topo.node_of(d))),)
        if f.from_switch:
            return (self.topo.lid(("sw", self.topo.node_of(d)), d),)
        return self.topo.route(d, devices[f.dst])

    def _aggregate(self, copies: list[list[int]], flows: list[FlowSpec]
                   ) -> tuple[np.ndarray, np.ndarray]:
        """Union of the paths of ``flows`` in every copy, weighted by flows per link."""
        count: dict[int, int] = {}
        for devices in copies:
            for f in flows:
                for link in self.path(devices, f):
                    count[link] = count.get(link, 0) + 1
        links = sorted(count)
        f = flows[0]
        scale = self.nvls_weight(copies[0][f.src]) if f.to_switch or f.from_switch else 1.0
        return np.asarray(links), np.asarray([scale * count[link] for link in links])

    def nvls_weight(self, device: int) -> float:
        """Weight of an in-switch reduction flow: the switch serves it ``nvls_eff /
        comm_eff`` times faster than a plain transfer (of the device's own GPU type)."""
        g = self.topo.cluster.gpu_of(device)
        return g.comm_eff / g.nvls_eff if g.nvls_eff else 1.0

    def _flows(self, devices: list[int], phase: Phase, copies: list[list[int]] | None,
               key: tuple) -> list[Shape]:
        """(path, weights, latency, index of the flow whose bytes it carries) of the flows
        to simulate for one phase."""
        return self._full(devices, phase) if copies is None else \
            self._reduced(devices, phase, copies)

    def _full(self, devices: list[int], phase: Phase) -> list[Shape]:
        out = []
        for i, f in enumerate(phase.flows):
            p = self.path(devices, f)
            w = self.nvls_weight(devices[f.src]) if f.to_switch or f.from_switch else 1.0
            out.append((np.asarray(p), np.full(len(p), w), self.topo.path_latency(p), i))
        return out

    def _reduced(self, devices: list[int], phase: Phase, copies: list[list[int]]
                 ) -> list[Shape]:
        """One aggregate per class of flows (same share of the buffer, same kind)."""
        classes: dict[tuple[float, bool], list[int]] = {}
        for i, f in enumerate(phase.flows):
            classes.setdefault((f.size_bytes, f.to_switch or f.from_switch), []).append(i)
        out = []
        for members in classes.values():
            flows = [phase.flows[i] for i in members]
            p, w = self._aggregate(copies, flows)
            lat = max(self.topo.path_latency(self.path(devices, f)) for f in flows)
            out.append((p, w, lat, members[0]))
        return out

    def _plan(self, kind: str, algorithm: str, devices: list[int],
              copies: list[list[int]] | None) -> list[tuple[Phase, list[Shape], float, float]]:
        """Per phase of a unit-size collective: the phase, its flow shapes, the hop latency
        and the slowest link; cached per group (sizes scale linearly)."""
        key = (kind, algorithm, tuple(devices), id(copies))
        if key not in self._plans:
            self._alive.append(copies)  # keeps id(copies) unique while the plan is cached
            nodes: dict[int, list[int]] = {}
            for i, d in enumerate(devices):
                nodes.setdefault(self.topo.node_of(d), []).append(i)
            plan = []
            for i, phase in enumerate(expand(kind, algorithm, len(devices), 1.0,
                                             list(nodes.values()))):
                shapes = self._flows(devices, phase, copies, key + (i,))
                paths = [self.path(devices, f) for f in phase.flows]
                hop = max(self.topo.path_latency(p) for p in paths)
                slowest = min(self.topo.cap[link] for p in paths for link in p)
                plan.append((phase, shapes, hop, slowest))
            self._plans[key] = plan
        return self._plans[key]

    def run(self, kind: str, algorithm: str, devices: list[int], size_bytes: float,
            copies: list[list[int]] | None = None) -> Generator[Any, Any, None]:
        """Process: the collective on ``devices`` (in group order)."""
        if len(devices) == 1 or size_bytes <= 0:
            return
        for phase, shapes, hop, slowest in self._plan(kind, algorithm, devices, copies):
            yield simpy.AllOf(self.env, [
                self.net.transfer(p, phase.flows[i].size_bytes * size_bytes, w, lat)
                for p, w, lat, i in shapes])
            fill = phase.fill_steps * min(phase.largest * size_bytes, CHUNK_BYTES)
            extra = (phase.steps - 1) * hop + fill / slowest
            if extra > 0:
                yield self.env.timeout(extra)
