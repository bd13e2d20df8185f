"""Running collectives on the flow network, with or without symmetry reduction.

Reduced: a group's flows stand for those of every concurrent copy of the group (the same
collective on the other groups of its kind on the same pipeline stage). Each phase's links
are loaded by all copies' flows; flows whose paths look alike (same links' capacities and
loads) form a class and one flow per class is simulated, its weight on each link the
number of flows there that it stands for. Full: every flow of the group itself, weight 1
(the copies are run by their own processes).
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
        self._loads: dict[tuple, dict[int, int]] = {}

    def path(self, devices: list[int], f: FlowSpec) -> Path:
        d = devices[f.src]
        if f.to_switch:
            return (self.topo.lid(d, ("sw", self.topo.node_of(d))),)
        if f.from_switch:
            return (self.topo.lid(("sw", self.topo.node_of(d)), d),)
        return self.topo.route(d, devices[f.dst])

    def _load(self, key: tuple, phase: Phase, copies: list[list[int]]) -> dict[int, int]:
        """Flows per link of ``phase`` over every copy of the group (cached)."""
        if key not in self._loads:
            load: dict[int, int] = {}
            for devices in copies:
                for f in phase.flows:
                    for link in self.path(devices, f):
                        load[link] = load.get(link, 0) + 1
            self._loads[key] = load
        return self._loads[key]

    def _flows(self, devices: list[int], phase: Phase, copies: list[list[int]] | None,
               key: tuple) -> list[tuple[Path, float, tuple[float, ...]]]:
        """(path, bytes, weights) of the flows to simulate for one phase."""
        extra = self.nvls_weight
        paths = [(self.path(devices, f), f) for f in phase.flows]
        if copies is None:
            return [(p, f.size_bytes, tuple(extra if f.to_switch or f.from_switch else 1.0
                                             for _ in p)) for p, f in paths]
        load = self._load(key, phase, copies)
        classes: dict[tuple, tuple[Path, FlowSpec]] = {}
        for p, f in paths:
            sig = (f.size_bytes, f.to_switch or f.from_switch,
                   tuple((self.topo.cap[link], load[link]) for link in p))
            classes.setdefault(sig, (p, f))
        chosen = list(classes.values())
        on_link: dict[int, int] = {}
        for p, _ in chosen:
            for link in p:
                on_link[link] = on_link.get(link, 0) + 1
        out = []
        for p, f in chosen:
            scale = extra if f.to_switch or f.from_switch else 1.0
            out.append((p, f.size_bytes, tuple(scale * load[link] / on_link[link]
                                               for link in p)))
        return out

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
            yield simpy.AllOf(self.env, [self.net.transfer(p, b, w) for p, b, w in flows])
            hop = max(self.topo.path_latency(p) for p, _, _ in flows)
            slowest = min(self.topo.cap[link] for p, _, _ in flows for link in p)
            extra = (phase.steps - 1) * hop + phase.fill_bytes / slowest
            if extra > 0:
                yield self.env.timeout(extra)
