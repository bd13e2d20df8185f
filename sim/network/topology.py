"""The cluster as a graph (networkx): devices, node fabric, NICs and the network between.

Vertices: devices are ints ``0..world-1``; switches and NICs are tuples (``("sw", node)``,
``("nic", node, k)``, ``("pod", p)``, ``("core",)``, ``("rail", p, k)``, ``("spine", j)``,
``("rt", node)``). Every link is a directed edge with ``cap_Bps`` (achievable bytes/s:
link rate times the catalog's efficiency, as the analytic tier uses) and ``lat_s``, and an
integer ``lid``. Latencies are split so a path inside a node costs the node fabric's
latency and a path between nodes the network latency plus that.

Routing is shortest-path (hop count) computed from the topology's structure, with ECMP
where paths tie (spines of a rail-optimized network, directions and dimension orders of a
torus) chosen by a deterministic hash of the endpoints; :func:`check_route` compares a route
with networkx's shortest paths.
"""

from __future__ import annotations

import itertools
import math
import zlib
from dataclasses import dataclass, field
from typing import Any

import networkx as nx

from sim.network.alphabeta import PCIE_EFFICIENCY
from sim.network.wan import site_path
from sim.spec.cluster import ClusterSpec

__all__ = ["Topology", "build_topology", "add_nics", "bisection_Bps", "check_route", "torus_dims",
           "vertex_name"]

Vertex = object


def vertex_name(v: Vertex) -> str:
    """A vertex as users write it: ``gpu7``, ``sw0``, ``nic3.0``, ``pod1``, ``core``."""
    if isinstance(v, int):
        return f"gpu{v}"
    assert isinstance(v, tuple)
    return str(v[0]) + ".".join(str(x) for x in v[1:])


def torus_dims(nodes: int, ndims: int) -> tuple[int, ...]:
    """Near-equal factors of ``nodes``, largest first (8 -> (4, 2); 27 -> (3, 3, 3))."""
    dims = []
    rest = nodes
    for left in range(ndims, 0, -1):
        target = round(rest ** (1 / left))
        d = next(f for f in itertools.chain(range(target, rest + 1), range(target, 0, -1))
                 if rest % f == 0)
        dims.append(d)
        rest //= d
    return tuple(sorted(dims, reverse=True))


@dataclass
class Topology:
    cluster: ClusterSpec
    graph: nx.DiGraph
    links: list[tuple[Vertex, Vertex]] = field(default_factory=list)  # lid -> (u, v)
    cap: list[float] = field(default_factory=list)  # lid -> bytes/s
    lat: list[float] = field(default_factory=list)  # lid -> seconds
    _routes: dict[tuple[int, int], tuple[int, ...]] = field(default_factory=dict)
    _router_paths: dict[tuple[int, int], list[list[int]]] = field(default_factory=dict)
    slowed: dict[int, float] = field(default_factory=dict)  # lid -> capacity divisor applied
    jitter: dict[int, Any] = field(default_factory=dict)  # lid -> a WAN link's jitter (ms)

    def add_link(self, u: Vertex, v: Vertex, cap_Bps: float, lat_s: float) -> None:
        for a, b in ((u, v), (v, u)):
            self.graph.add_edge(a, b, cap_Bps=cap_Bps, lat_s=lat_s, lid=len(self.links))
            self.links.append((a, b))
            self.cap.append(cap_Bps)
            self.lat.append(lat_s)

    def lid(self, u: Vertex, v: Vertex) -> int:
        return int(self.graph.edges[u, v]["lid"])

    def node_of(self, device: int) -> int:
        return device // self.cluster.gpus_per_node

    def route(self, src: int, dst: int) -> tuple[int, ...]:
        """Link ids from device ``src`` to device ``dst`` (cached)."""
        key = (src, dst)
        if key not in self._routes:
            hops = _route_vertices(self, src, dst)
            self._routes[key] = tuple(self.lid(a, b) for a, b in itertools.pairwise(hops))
        return self._routes[key]

    def path_latency(self, path: tuple[int, ...]) -> float:
        return sum(self.lat[i] for i in path)


def _ecmp(options: int, *key: object) -> int:
    return zlib.crc32(repr(key).encode()) % options if options > 1 else 0


# Building ------------------------------------------------------------------------------
def _node_fabric(t: Topology, node: int) -> None:
    c, g = t.cluster, t.cluster.gpus_per_node
    intra = c.intra_node
    devices = range(node * g, (node + 1) * g)
    lat = intra.latency_us * 1e-6
    rate_Bps, gpu = c.node_intra_GBps(node) * 1e9, c.gpu_of(node * g)  # this node's own
    if intra.kind == "nvlink-mesh":
        per_peer = rate_Bps * gpu.comm_eff / max(1, g - 1)
        for a, b in itertools.combinations(devices, 2):
            t.add_link(a, b, per_peer, lat)
        return
    eff = PCIE_EFFICIENCY if intra.kind == "pcie" else gpu.comm_eff
    for d in devices:
        t.add_link(d, ("sw", node), rate_Bps * eff, lat / 2)


def add_nics(t: Topology, node: int) -> None:
    """Node ``node``'s NICs, each joined to the devices it serves."""
    c = t.cluster
    g, n_nics = c.gpus_per_node, c.node_nics(node)[1]
    nic_Bps = _nic_Bps(c, node)
    for local in range(g):
        k = local * n_nics // g
        t.add_link(node * g + local, ("nic", node, k), nic_Bps, c.intra_node.latency_us * 5e-7)


def _nic_Bps(c: ClusterSpec, node: int) -> float:
    """Achievable bytes/s of one NIC of ``node`` (node groups may differ)."""
    return c.nic_Bps(node)


def _node_Bps(c: ClusterSpec, node: int) -> float:
    """All NICs of ``node`` together."""
    return c.node_nics(node)[1] * _nic_Bps(c, node)


def _fat_tree(t: Topology) -> None:
    c = t.cluster
    lat = c.inter_node.latency_us * 1e-6
    nodes_per_pod = c.pod_size // c.gpus_per_node
    pods = math.ceil(c.nodes / nodes_per_pod)
    for node in range(c.nodes):
        for k in range(c.node_nics(node)[1]):
            t.add_link(("nic", node, k), ("pod", c.pod_of_node(node)), _nic_Bps(c, node),
                       lat / 2)
    if c.sites:  # the pods are sites, joined by their WAN links
        index = {site.name: i for i, site in enumerate(c.sites)}
        for w in c.wan:
            t.add_link(("pod", index[w.a]), ("pod", index[w.b]), w.Gbps * 1e9 / 8,
                       w.latency_ms * 1e-3)
            if w.jitter is not None:  # both directions, just added
                t.jitter |= {len(t.links) - 2: w.jitter, len(t.links) - 1: w.jitter}
        return
    if pods > 1:
        for p in range(pods):
            members = range(p * nodes_per_pod, min(c.nodes, (p + 1) * nodes_per_pod))
            up = nodes_per_pod * max(_node_Bps(c, n) for n in members)  # as a full pod's
            t.add_link(("pod", p), ("core",), up / c.inter_node.oversubscription, lat / 4)


def _rail(t: Topology) -> None:
    c = t.cluster
    lat, nics = c.inter_node.latency_us * 1e-6, c.inter_node.nics_per_node
    nodes_per_pod = c.pod_size // c.gpus_per_node
    pods = math.ceil(c.nodes / nodes_per_pod)
    rails: set[tuple[int, int]] = set()  # (pod, k): node groups may have more NICs
    for node in range(c.nodes):
        for k in range(c.node_nics(node)[1]):
            t.add_link(("nic", node, k), ("rail", node // nodes_per_pod, k), _nic_Bps(c, node),
                       lat / 2)
            rails.add((node // nodes_per_pod, k))
    rails |= set(itertools.product(range(pods), range(nics)))
    up = nodes_per_pod * _nic_Bps(c, 0) / nics / c.inter_node.oversubscription
    for (p, k), j in itertools.product(sorted(rails), range(nics)):
        t.add_link(("rail", p, k), ("spine", j), up, lat / 4)


def _router_links(t: Topology) -> None:
    c = t.cluster
    for node in range(c.nodes):
        for k in range(c.node_nics(node)[1]):
            t.add_link(("nic", node, k), ("rt", node), _node_Bps(c, node), 0.0)


def _torus(t: Topology, ndims: int) -> None:
    c = t.cluster
    dims = torus_dims(c.nodes, ndims)
    _router_links(t)
    lat = c.inter_node.latency_us * 1e-6 / 2
    for node in range(c.nodes):
        coord = _coord(node, dims)
        for d, size in enumerate(dims):
            if size > 1:
                nxt = list(coord)
                nxt[d] = (coord[d] + 1) % size
                other = _index(tuple(nxt), dims)
                if not t.graph.has_edge(("rt", node), ("rt", other)):
                    # the NICs spread over 2*ndims neighbours; the slower end sets the rate
                    hop_Bps = min(_node_Bps(c, node), _node_Bps(c, other)) / (2 * ndims)
                    t.add_link(("rt", node), ("rt", other), hop_Bps, lat)


def _dragonfly(t: Topology) -> None:
    c = t.cluster
    size = max(1, math.isqrt(c.nodes))
    groups = math.ceil(c.nodes / size)
    node_Bps = min(_node_Bps(c, n) for n in range(c.nodes))  # the slowest node's, for all
    _router_links(t)
    lat = c.inter_node.latency_us * 1e-6 / 2
    for grp in range(groups):
        members = range(grp * size, min(c.nodes, (grp + 1) * size))
        for a, b in itertools.combinations(members, 2):
            t.add_link(("rt", a), ("rt", b), node_Bps, lat)
    global_Bps = node_Bps * size / max(1, groups - 1) / c.inter_node.oversubscription
    for g1, g2 in itertools.combinations(range(groups), 2):
        t.add_link(("rt", _gateway(g1, g2, size, c.nodes)), ("rt", _gateway(g2, g1, size, c.nodes)),
                   global_Bps, lat)


def _gateway(group: int, other: int, size: int, nodes: int) -> int:
    """The router of ``group`` holding its global link to ``other``."""
    first = group * size
    return min(nodes - 1, first + other % size)


def build_topology(cluster: ClusterSpec) -> Topology:
    t = Topology(cluster, nx.DiGraph())
    for node in range(cluster.nodes):
        _node_fabric(t, node)
    if cluster.nodes > 1:
        for node in range(cluster.nodes):
            add_nics(t, node)
        {"fat-tree": _fat_tree, "rail-optimized": _rail, "torus2d": lambda x: _torus(x, 2),
         "torus3d": lambda x: _torus(x, 3), "dragonfly": _dragonfly}[
            cluster.inter_node.topology](t)
    return t


# Routing --------------------------------------------------------------------------------
def _coord(node: int, dims: tuple[int, ...]) -> tuple[int, ...]:
    out = []
    for size in dims:
        out.append(node % size)
        node //= size
    return tuple(out)


def _index(coord: tuple[int, ...], dims: tuple[int, ...]) -> int:
    out, mult = 0, 1
    for v, size in zip(coord, dims, strict=True):
        out += v * mult
        mult *= size
    return out


def _intra(t: Topology, src: int, dst: int) -> list[Vertex]:
    if t.cluster.intra_node.kind == "nvlink-mesh":
        return [src, dst]
    return [src, ("sw", t.node_of(src)), dst]


def _nic(t: Topology, device: int) -> Vertex:
    c = t.cluster
    local, node = device % c.gpus_per_node, t.node_of(device)
    return ("nic", node, local * c.node_nics(node)[1] // c.gpus_per_node)


def _nic_index(nic: Vertex) -> tuple[int, int]:
    """(node, k) of a ``("nic", node, k)`` vertex."""
    assert isinstance(nic, tuple)
    return int(nic[1]), int(nic[2])


def _fabric_path(t: Topology, a: Vertex, b: Vertex, src: int, dst: int) -> list[Vertex]:
    """Switch-level path between two NICs (both ends included)."""
    c = t.cluster
    kind = c.inter_node.topology
    na, ka = _nic_index(a)
    nb, kb = _nic_index(b)
    per_pod = c.pod_size // c.gpus_per_node
    if kind == "fat-tree":
        pa, pb = ("pod", c.pod_of_node(na)), ("pod", c.pod_of_node(nb))
        if pa == pb:
            return [a, pa, b]
        if c.sites:
            return [a, *(("pod", s) for s in site_path(c, pa[1], pb[1])), b]
        return [a, pa, ("core",), pb, b]
    if kind == "rail-optimized":
        ra, rb = ("rail", na // per_pod, ka), ("rail", nb // per_pod, kb)
        if ra == rb:
            return [a, ra, b]
        return [a, ra, ("spine", _ecmp(c.inter_node.nics_per_node, src, dst)), rb, b]
    routers = _torus_route(t, na, nb, src, dst) if kind.startswith("torus") else \
        _dragonfly_route(t, na, nb, src, dst)
    return [a, *[("rt", r) for r in routers], b]


def _torus_route(t: Topology, na: int, nb: int, src: int, dst: int) -> list[int]:
    dims = torus_dims(t.cluster.nodes, 2 if t.cluster.inter_node.topology == "torus2d" else 3)
    here, goal = list(_coord(na, dims)), _coord(nb, dims)
    order = list(range(len(dims)))
    order = order[_ecmp(len(order), src, dst, "order"):] + order[:_ecmp(len(order), src, dst,
                                                                         "order")]
    out = [na]
    for d in order:
        size = dims[d]
        fwd = (goal[d] - here[d]) % size
        step = 1 if fwd < size - fwd or (fwd == size - fwd and _ecmp(2, src, dst, d) == 0) \
            else -1
        while here[d] != goal[d]:
            here[d] = (here[d] + step) % size
            out.append(_index(tuple(here), dims))
    return out


def _dragonfly_route(t: Topology, na: int, nb: int, src: int, dst: int) -> list[int]:
    """Shortest router paths (a group's gateway or, in small groups, a hop through a third
    group can be as short), one picked by ECMP hash; cached per router pair."""
    key = (na, nb)
    if key not in t._router_paths:
        routers = t.graph.subgraph([("rt", n) for n in range(t.cluster.nodes)])
        t._router_paths[key] = [[v[1] for v in path] for path in itertools.islice(
            nx.all_shortest_paths(routers, ("rt", na), ("rt", nb)), 8)]
    options = t._router_paths[key]
    return options[_ecmp(len(options), src, dst)]


def _route_vertices(t: Topology, src: int, dst: int) -> list[Vertex]:
    if t.node_of(src) == t.node_of(dst):
        return _intra(t, src, dst)
    a, b = _nic(t, src), _nic(t, dst)
    return [src, *_fabric_path(t, a, b, src, dst), dst]


def check_route(t: Topology, src: int, dst: int) -> bool:
    """True when the route is a shortest path of the graph."""
    return len(t.route(src, dst)) == nx.shortest_path_length(t.graph, src, dst)


def bisection_Bps(t: Topology) -> float:
    """Max-flow between the first and second half of the nodes (each half's devices joined
    to a super source / sink): the bandwidth across the cluster's middle."""
    c = t.cluster
    if c.nodes < 2:
        return 0.0
    g = nx.DiGraph()
    for (u, v), cap in zip(t.links, t.cap, strict=True):
        g.add_edge(u, v, capacity=cap)
    half = c.nodes // 2 * c.gpus_per_node
    for d in range(c.world_size):
        if d < half:
            g.add_edge("S", d, capacity=math.inf)
        elif d < 2 * half:
            g.add_edge(d, "T", capacity=math.inf)
    return float(nx.maximum_flow_value(g, "S", "T"))
