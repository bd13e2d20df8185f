"""Running collectives on the flow network, with or without symmetry reduction.

Reduced: each flow of the group stands for the same flow in every concurrent copy of the
group (the same collective on the other groups of its kind on the stage). It becomes one
aggregate flow over the union of the copies' paths, with weight on each link the number of
copies whose flow crosses it: its rate is what each copy's flow gets, limited by the most
loaded link of any copy, and any other traffic on any copy's links competes with it.
Full: every flow of the group itself, weight 1 (the copies are run by their own processes).
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import simpy

from sim.des_collectives import FlowSpec, Phase, expand
from sim.network import Network
from sim.topology import Topology

__all__ = ["CommEngine"]

Path = tuple[int, ...]


class CommEngine:
    def __init__(self, env: simpy.Environment, topo: Topology, net: Network) -> None:
        self.env, self.topo, self.net = env, topo, net
        g = topo.cluster.gpu
        self.nvls_weight = g.comm_eff / g.nvls_eff if g.nvls_eff else 1.0
        self._shapes: dict[tuple, list[tuple[Path, tuple[float, ...]]]] = {}

    def path(self, devices: list[int], f: FlowSpec) -> Path:
        d = devices[f.src]
        if f.to_switch:
            return (self.topo.lid(d, ("sw", self.topo.node_of(d))),)
        if f.from_switch:
            return (self.topo.lid(("sw", self.topo.node_of(d)), d),)
        return self.topo.route(d, devices[f.dst])

    def _aggregate(self, copies: list[list[int]], f: FlowSpec) -> tuple[Path, tuple[float, ...]]:
        """Union of the copies' paths for flow ``f``, weighted by copies per link."""
        count: dict[int, int] = {}
        for devices in copies:
            for link in self.path(devices, f):
                count[link] = count.get(link, 0) + 1
        links = tuple(sorted(count))
        scale = self.nvls_weight if f.to_switch or f.from_switch else 1.0
        return links, tuple(scale * count[link] for link in links)

    def _flows(self, devices: list[int], phase: Phase, copies: list[list[int]] | None,
               key: tuple) -> list[tuple[Path, float, tuple[float, ...]]]:
        """(path, bytes, weights) of the flows to simulate for one phase (cached shapes)."""
        if key not in self._shapes:
            if copies is None:
                shapes = []
                for f in phase.flows:
                    p = self.path(devices, f)
                    w = self.nvls_weight if f.to_switch or f.from_switch else 1.0
                    shapes.append((p, (w,) * len(p)))
            else:
                shapes = [self._aggregate(copies, f) for f in phase.flows]
            self._shapes[key] = shapes
        return [(p, f.size_bytes, w) for (p, w), f in zip(self._shapes[key], phase.flows,
                                                          strict=True)]

    def run(self, kind: str, algorithm: str, devices: list[int], size_bytes: float,
            copies: list[list[int]] | None = None) -> Generator[Any, Any, None]:
        """Process: the collective on ``devices`` (in group order)."""
        nodes: dict[int, list[int]] = {}
        for i, d in enumerate(devices):
            nodes.setdefault(self.topo.node_of(d), []).append(i)
        phases = expand(kind, algorithm, len(devices), size_bytes, list(nodes.values()))
        for i, phase in enumerate(phases):
            key = (kind, algorithm, tuple(devices), len(phases), i, id(copies))
            flows = self._flows(devices, phase, copies, key)
            lats = [self.topo.path_latency(self.path(devices, f)) for f in phase.flows]
            yield simpy.AllOf(self.env, [self.net.transfer(p, b, w, lat)
                                         for (p, b, w), lat in zip(flows, lats, strict=True)])
            hop = max(lats)
            slowest = min(self.topo.cap[link] for f in phase.flows
                          for link in self.path(devices, f))
            extra = (phase.steps - 1) * hop + phase.fill_bytes / slowest
            if extra > 0:
                yield self.env.timeout(extra)
