"""Parameter servers as vertices of the topology (BytePS-style CPU servers).

``dedicated``: server ``s`` is a machine of its own with one NIC (``server_nic_Gbps``, by
default one of the cluster's NICs) on the switch of node ``s mod nodes`` (its pod, rail
``s mod nics`` or router); a single-node cluster gets a top-of-rack switch joining the
node's NICs and the servers. ``colocated``: server ``s`` runs on the CPU of node
``s mod nodes``, reached from that node's devices over PCIe (a CPU cluster's loopback) and
from other nodes through the node's NICs, so its traffic shares them with the workers'.

Routes are shortest paths that never pass through another device or server; each server
has a CPU that sums the gradients pushed to it at ``server_cpu_GBps``.
"""

from __future__ import annotations

from dataclasses import dataclass

import networkx as nx

from sim.network.alphabeta import NIC_EFFICIENCY, PCIE_EFFICIENCY
from sim.network.topology import Topology, add_nics
from sim.spec.cluster import PCIE_GBPS
from sim.spec.sync import Communication

__all__ = ["Servers", "add_servers"]

Vertex = object


@dataclass
class Servers:
    """Server vertices on a topology and routes to and from them (link ids)."""

    topo: Topology
    vertices: list[Vertex]
    cpu_Bps: float
    _up: dict[tuple[int, int], tuple[int, ...]]  # (device, server) -> links device->server
    _down: dict[tuple[int, int], tuple[int, ...]]

    def push_route(self, device: int, server: int) -> tuple[int, ...]:
        return self._up[(device, server)]

    def pull_route(self, device: int, server: int) -> tuple[int, ...]:
        return self._down[(device, server)]

    def ingress(self, server: int) -> list[int]:
        """Links into server ``server`` (its NIC, or its PCIe links when colocated)."""
        v = self.vertices[server]
        return [self.topo.lid(u, v) for u in self.topo.graph.predecessors(v)]


def add_servers(topo: Topology, comm: Communication, devices: list[int]) -> Servers:
    """Add ``comm.servers`` servers to ``topo`` (in place) and route ``devices`` to them."""
    c = topo.cluster
    vertices: list[Vertex] = [("ps", s) for s in range(comm.servers)]
    if comm.placement == "colocated":
        _colocate(topo, vertices)
    else:
        nic_Gbps = comm.server_nic_Gbps or c.inter_node.nic_Gbps
        switches = _server_switches(topo)
        for s, v in enumerate(vertices):
            topo.add_link(v, switches[s % len(switches)], nic_Gbps / 8 * 1e9 * NIC_EFFICIENCY,
                          c.inter_node.latency_us * 5e-7)
    up: dict[tuple[int, int], tuple[int, ...]] = {}
    down: dict[tuple[int, int], tuple[int, ...]] = {}
    wanted = set(devices)
    for s, v in enumerate(vertices):
        for d, path in _paths_to(topo, v, wanted).items():
            up[(d, s)] = tuple(topo.lid(a, b) for a, b in zip(path, path[1:], strict=False))
            back = path[::-1]
            down[(d, s)] = tuple(topo.lid(a, b) for a, b in zip(back, back[1:], strict=False))
    return Servers(topo, vertices, comm.server_cpu_GBps * 1e9, up, down)


def _colocate(topo: Topology, vertices: list[Vertex]) -> None:
    c = topo.cluster
    g = c.gpus_per_node
    local_Bps = (c.node_intra_GBps(0) * 1e9 if c.intra_node.kind == "loopback"
                 else PCIE_GBPS * 1e9 * PCIE_EFFICIENCY)
    if c.nodes > 1:  # other nodes reach a colocated server through its node's NICs
        for s, v in enumerate(vertices):
            node = s % c.nodes
            for k in range(c.node_nics(node)[1]):
                topo.add_link(("nic", node, k), v, local_Bps, 0.0)
    for s, v in enumerate(vertices):
        node = s % c.nodes
        for d in range(node * g, (node + 1) * g):
            topo.add_link(d, v, local_Bps, c.intra_node.latency_us * 1e-6)  # one full hop


def _server_switches(topo: Topology) -> list[Vertex]:
    """Where dedicated servers plug in, in turn: node 0's switch, node 1's, ..."""
    c = topo.cluster
    if c.nodes == 1:
        add_nics(topo, 0)
        for k in range(c.node_nics(0)[1]):
            topo.add_link(("nic", 0, k), ("tor",), topo.cap[topo.lid(0, ("nic", 0, 0))],
                          c.inter_node.latency_us * 5e-7)
        return [("tor",)]
    out: list[Vertex] = []
    for node in range(c.nodes):
        nic = ("nic", node, node % c.node_nics(node)[1])
        switch = next(v for v in topo.graph.successors(nic) if not isinstance(v, int))
        if switch not in out:
            out.append(switch)
    return out


def _paths_to(topo: Topology, server: Vertex, devices: set[int]) -> dict[int, list[Vertex]]:
    """Shortest vertex paths device -> ``server`` through no other device or server (one
    breadth-first search from the server over the switches and NICs)."""
    g = topo.graph
    fabric = nx.subgraph_view(g, filter_node=lambda v: v == server or not (
        isinstance(v, int) or (isinstance(v, tuple) and v[0] == "ps")))
    tails = nx.single_source_shortest_path(fabric.reverse(copy=False), server)
    out: dict[int, list[Vertex]] = {}
    for d in devices:
        best: list[Vertex] | None = None
        for nxt in g.successors(d):
            if nxt in tails and (best is None or len(tails[nxt]) < len(best)):
                best = tails[nxt]
        if best is None:
            raise RuntimeError(f"device {d} cannot reach parameter server {server}")
        out[d] = [d, *best[::-1]]
    return out
