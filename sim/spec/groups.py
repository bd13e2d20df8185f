"""Node groups and sites of a cluster file, and the WAN links between sites.

A heterogeneous cluster lists ``[[node_groups]]``: consecutive runs of nodes, each with its
own GPU type and optionally its own NIC rate and count and node-fabric bandwidth. A
geo-distributed cluster lists ``[[sites]]`` instead: named runs of nodes, each a data centre
whose nodes sit under one full-bisection fat-tree, joined by ``[[wan]]`` links (a bandwidth
per direction and a one-way latency; optionally 24 bandwidths by hour of the day). Sites
may differ in size, GPU and fabric (a site's own ``gpu``, ``inter_node`` and ``intra_node``
tables, as a node group's: such sites become the cluster's node groups). The sites are the
cluster's pods: a group that leaves its site crosses the WAN, which the closed-form tier
charges as the group's inter-node rate and latency and the flow network as the links
themselves. Placement puts data parallelism across sites and keeps model parallelism inside
(a site must hold whole model replicas).

Measured inter-region round trips (``sim/data/wan.csv``, a 2017 third-party table of AWS
regions; its source named there) give the latencies of the region presets; their bandwidths
are assumptions a user should replace with a measurement.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from sim.errors import SpecError, field_name
from sim.spec.hardware import HardwareSpec, get_hardware
from sim.spec.population import Dist

__all__ = ["NodeGroup", "Site", "WanLink", "groups_from_dict", "sites_from_dict",
           "check_sites", "resolve_groups", "REGION_PRESETS", "region_sites"]

# Region presets: their sites (names in sim/data/wan.csv) and the bandwidth assumed between
# each pair: AWS lets traffic to another region use up to 50% of an instance's bandwidth
# (instances with 32+ vCPUs, EC2 instance network bandwidth documentation); 100 Gb/s for a
# site's aggregate is an assumption to replace with a measurement.
REGION_PRESETS = {"regions2": ("us-east", "us-west"),
                  "regions3": ("us-east", "us-west", "eu-west")}
REGION_WAN_GBPS = 100.0


@dataclass(frozen=True)
class NodeGroup:
    """``nodes`` consecutive nodes of one GPU type; ``None`` rates are the cluster's (the
    node fabric: the group GPU's NVLink rate, or PCIe), filled in by :class:`ClusterSpec`."""

    nodes: int  # consecutive nodes in this group
    gpu: HardwareSpec  # catalog device of this group (in a file: its name)
    nic_Gbps: float | None = None  # TOML `inter_node.nic_Gbps` of the group; unset: the cluster's
    # TOML `inter_node.nics_per_node` of the group; unset: the cluster's
    nics_per_node: int | None = None
    # TOML `intra_node.bandwidth_GBps` of the group; unset: the group GPU's NVLink rate (or PCIe)
    intra_GBps: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"nodes": self.nodes, "gpu": self.gpu.name,
                "inter_node": {"nic_Gbps": self.nic_Gbps, "nics_per_node": self.nics_per_node},
                "intra_node": {"bandwidth_GBps": self.intra_GBps}}


@dataclass(frozen=True)
class Site:
    """A data centre: ``nodes`` consecutive nodes (after the sites before it); unset
    devices and rates are the cluster's."""

    name: str  # the site's name, as WAN links refer to it
    nodes: int  # nodes at this site
    gpu: HardwareSpec | None = None  # the site's device (in a file: its name); unset: the cluster's
    nic_Gbps: float | None = None  # TOML `inter_node.nic_Gbps` of the site
    nics_per_node: int | None = None  # TOML `inter_node.nics_per_node` of the site
    intra_GBps: float | None = None  # TOML `intra_node.bandwidth_GBps` of the site

    @property
    def own_nodes(self) -> bool:
        """True when the site names its own device or rates (it becomes a node group)."""
        return any(v is not None for v in (self.gpu, self.nic_Gbps, self.nics_per_node,
                                           self.intra_GBps))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "nodes": self.nodes}
        if self.gpu:
            out["gpu"] = self.gpu.name
        inter = {k: v for k, v in (("nic_Gbps", self.nic_Gbps),
                                   ("nics_per_node", self.nics_per_node)) if v is not None}
        if inter:
            out["inter_node"] = inter
        if self.intra_GBps is not None:
            out["intra_node"] = {"bandwidth_GBps": self.intra_GBps}
        return out


@dataclass(frozen=True)
class WanLink:
    """A link between two sites, the same both ways (each direction its own bandwidth)."""

    a: str  # one site's name
    b: str  # the other's
    Gbps: float  # per direction, Gb/s
    latency_ms: float  # one way, ms
    bandwidth_by_hour: tuple[float, ...] = ()  # 24 rates (Gb/s) by hour of the day; empty: Gbps
    # extra one-way delay of a message, ms, drawn per message (`{dist = "lognormal", ...}`)
    jitter: Dist | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"a": self.a, "b": self.b, "Gbps": self.Gbps,
                               "latency_ms": self.latency_ms}
        if self.jitter is not None:
            out["jitter"] = self.jitter.to_dict()
        return out | ({"bandwidth_by_hour": list(self.bandwidth_by_hour)}
                      if self.bandwidth_by_hour else {})

    def Gbps_at(self, hour: float) -> float:
        """The bandwidth during ``hour`` of the day (the constant one without a table)."""
        if not self.bandwidth_by_hour:
            return self.Gbps
        return self.bandwidth_by_hour[int(math.floor(hour)) % 24]


def _positive(name: str, v: Any) -> None:
    if isinstance(v, bool) or not isinstance(v, int | float) or not 0 < v < math.inf:
        raise SpecError(name, f"must be a positive number, got {v!r}")


def _positive_int(name: str, v: Any) -> None:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise SpecError(name, f"must be a positive integer, got {v!r}")


def _check_rates(name: str, g: NodeGroup | Site) -> None:
    """A group's or site's own NIC rate, NIC count and node-fabric rate, where set."""
    for attr, key in (("nic_Gbps", "inter_node.nic_Gbps"),
                      ("intra_GBps", "intra_node.bandwidth_GBps")):
        if getattr(g, attr) is not None:
            _positive(f"{name}.{key}", getattr(g, attr))
    if g.nics_per_node is not None:
        _positive_int(f"{name}.inter_node.nics_per_node", g.nics_per_node)


def resolve_groups(c: Any, pcie_GBps: float) -> tuple[NodeGroup, ...]:
    """A cluster's groups, validated, with the cluster's rates filled in where a group has
    none (the node fabric: the group GPU's NVLink rate, or ``pcie_GBps``)."""
    groups = c.node_groups
    if not isinstance(groups, tuple) or any(not isinstance(g, NodeGroup) for g in groups):
        raise SpecError("node_groups", "must be a list of node groups")
    for i, g in enumerate(groups):
        name = f"node_groups[{i}]"
        _positive_int(f"{name}.nodes", g.nodes)
        _check_rates(name, g)
    if groups and sum(g.nodes for g in groups) != c.nodes:
        raise SpecError("node_groups", f"nodes {'+'.join(str(g.nodes) for g in groups)} = "
                        f"{sum(g.nodes for g in groups)} != nodes = {c.nodes}")
    if groups and groups[0].gpu != c.gpu:
        raise SpecError("gpu", f"must be the first node group's GPU {groups[0].gpu.name!r} "
                        f"(set GPUs per group in node_groups), got {c.gpu.name!r}")
    kind, explicit = c.intra_node.kind, c.intra_node.bandwidth_GBps
    first = pcie_GBps if kind == "pcie" else c.gpu.nvlink_GBps
    out = []
    for g in groups:
        own = pcie_GBps if kind == "pcie" else g.gpu.nvlink_GBps
        intra = g.intra_GBps or (own if explicit in (None, first) else explicit)
        out.append(dataclasses.replace(
            g, nic_Gbps=g.nic_Gbps if g.nic_Gbps is not None else c.inter_node.nic_Gbps,
            nics_per_node=g.nics_per_node or c.inter_node.nics_per_node, intra_GBps=intra))
    return tuple(out)


_GROUP_KEYS = {"nodes": None, "gpu": None, "inter_node": ("nic_Gbps", "nics_per_node"),
               "intra_node": ("bandwidth_GBps",)}


def _device(name: str, gpu: str) -> HardwareSpec:
    """A catalog device, its error naming the group's or site's field."""
    try:
        return get_hardware(gpu)
    except SpecError as e:
        raise SpecError(f"{name}.gpu", e.rule) from None


def _rates(name: str, data: dict[str, Any]) -> dict[str, Any]:
    """A group's or site's ``inter_node`` and ``intra_node`` tables, merged."""
    sub: dict[str, Any] = {}
    for key in ("inter_node", "intra_node"):
        table = data.get(key, {})
        if not isinstance(table, dict):
            raise SpecError(f"{name}.{key}", "must be a TOML table")
        bad = sorted(set(table) - set(_GROUP_KEYS[key] or ()))
        if bad:
            raise SpecError(f"{name}.{key}.{field_name(bad[0])}", "unknown field (known: "
                            f"{', '.join(_GROUP_KEYS[key] or ())})")
        sub.update(table)
    return sub


def _group_from_dict(i: int, data: Any) -> NodeGroup:
    name = f"node_groups[{i}]"
    if not isinstance(data, dict):
        raise SpecError(name, "must be a TOML table ([[node_groups]])")
    unknown = sorted(set(data) - set(_GROUP_KEYS))
    if unknown:
        raise SpecError(f"{name}.{field_name(unknown[0])}",
                        f"unknown field (known: {', '.join(_GROUP_KEYS)})")
    for key in ("nodes", "gpu"):
        if key not in data:
            raise SpecError(f"{name}.{key}", "is required in a node group")
    if not isinstance(data["gpu"], str):
        raise SpecError(f"{name}.gpu", f"must be a catalog name, got {data['gpu']!r}")
    sub = _rates(name, data)
    return NodeGroup(data["nodes"], _device(name, data["gpu"]), sub.get("nic_Gbps"),
                     sub.get("nics_per_node"), sub.get("bandwidth_GBps"))


def groups_from_dict(data: dict[str, Any]) -> tuple[NodeGroup, ...]:
    """The ``[[node_groups]]``; with them ``nodes`` and ``gpu`` follow from the groups."""
    raw = data.get("node_groups")
    if raw is None:
        return ()
    if not isinstance(raw, list) or not raw:
        raise SpecError("node_groups", "must be a non-empty list of tables ([[node_groups]])")
    groups = tuple(_group_from_dict(i, g) for i, g in enumerate(raw))
    data.setdefault("nodes", sum(g.nodes for g in groups
                                 if isinstance(g.nodes, int) and not isinstance(g.nodes, bool)))
    data.setdefault("gpu", groups[0].gpu.name)
    return groups


_SITE_KEYS = ("name", "nodes", "gpu", "inter_node", "intra_node")
_WAN_KEYS = ("a", "b", "Gbps", "latency_ms", "bandwidth_by_hour", "jitter")


def _tables(data: dict[str, Any], key: str, known: tuple[str, ...]) -> list[dict[str, Any]]:
    raw = data.get(key, [])
    if not isinstance(raw, list) or any(not isinstance(t, dict) for t in raw):
        raise SpecError(key, f"must be a list of tables ([[{key}]])")
    for i, t in enumerate(raw):
        bad = sorted(set(t) - set(known))
        if bad:
            raise SpecError(f"{key}[{i}].{field_name(bad[0])}",
                            f"unknown field (known: {', '.join(known)})")
    return raw


def sites_from_dict(data: dict[str, Any]) -> tuple[tuple[Site, ...], tuple[WanLink, ...]]:
    """The ``[[sites]]`` and ``[[wan]]`` of a cluster file (``nodes`` follows the sites)."""
    sites = []
    for i, t in enumerate(_tables(data, "sites", _SITE_KEYS)):
        for key in ("name", "nodes"):
            if key not in t:
                raise SpecError(f"sites[{i}].{key}", "is required in a site")
        gpu = t.get("gpu")
        if gpu is not None and not isinstance(gpu, str):
            raise SpecError(f"sites[{i}].gpu", f"must be a catalog name, got {gpu!r}")
        sub = _rates(f"sites[{i}]", t)
        sites.append(Site(str(t["name"]), t["nodes"],
                          _device(f"sites[{i}]", gpu) if gpu is not None else None,
                          sub.get("nic_Gbps"), sub.get("nics_per_node"),
                          sub.get("bandwidth_GBps")))
    wan = []
    for i, t in enumerate(_tables(data, "wan", _WAN_KEYS)):
        for key in ("a", "b", "Gbps", "latency_ms"):
            if key not in t:
                raise SpecError(f"wan[{i}].{key}", "is required in a WAN link")
        hours = t.get("bandwidth_by_hour", [])
        if not isinstance(hours, list):
            raise SpecError(f"wan[{i}].bandwidth_by_hour", "must be a list of 24 rates (Gb/s)")
        jitter = Dist.parse(f"wan[{i}].jitter", t["jitter"]) if "jitter" in t else None
        wan.append(WanLink(str(t["a"]), str(t["b"]), t["Gbps"], t["latency_ms"],
                           tuple(hours), jitter))
    if wan and not sites:
        raise SpecError("wan", "WAN links join [[sites]]: list the sites too")
    if sites:
        if "node_groups" in data:
            raise SpecError("sites", "give [[sites]] or [[node_groups]], not both (a site "
                            "may name its own gpu)")
        data.setdefault("nodes", sum(s.nodes for s in sites if isinstance(s.nodes, int)
                                     and not isinstance(s.nodes, bool)))
    return tuple(sites), tuple(wan)


def check_sites(sites: tuple[Site, ...], wan: tuple[WanLink, ...], nodes: int,
                pod_gpus: int, topology: str, oversubscription: float,
                gpus_per_node: int) -> None:
    """Every rule of sites and WAN links, each a one-line error naming the field."""
    names = [s.name for s in sites]
    for i, s in enumerate(sites):
        if isinstance(s.nodes, bool) or not isinstance(s.nodes, int) or s.nodes < 1:
            raise SpecError(f"sites[{i}].nodes", f"must be a positive integer (a site with "
                            f"no nodes is no site), got {s.nodes!r}")
        if s.name in names[:i] or not s.name:
            raise SpecError(f"sites[{i}].name", f"must be a unique non-empty name, got "
                            f"{s.name!r}")
        _check_rates(f"sites[{i}]", s)
    if sum(s.nodes for s in sites) != nodes:
        raise SpecError("sites", f"nodes {'+'.join(str(s.nodes) for s in sites)} != "
                        f"nodes = {nodes}")
    if pod_gpus and pod_gpus != max(s.nodes for s in sites) * gpus_per_node:  # (set on load)
        raise SpecError("inter_node.pod_gpus", "a cluster with sites uses each site as its "
                        "full-bisection pod: leave pod_gpus unset")
    if topology != "fat-tree" or oversubscription != 1:
        raise SpecError("inter_node.topology", "sites are built as full-bisection fat-trees "
                        "joined by WAN links (topology fat-tree, oversubscription 1)")
    _check_wan(sites, wan)


def _check_wan(sites: tuple[Site, ...], wan: tuple[WanLink, ...]) -> None:
    import networkx as nx  # only for clusters with sites (an analytic run loads none)

    names = [s.name for s in sites]
    g = nx.Graph()
    g.add_nodes_from(names)
    for i, w in enumerate(wan):
        for end in ("a", "b"):
            if getattr(w, end) not in names:
                raise SpecError(f"wan[{i}].{end}", f"unknown site {getattr(w, end)!r} (sites: "
                                f"{', '.join(names)})")
        if w.a == w.b or g.has_edge(w.a, w.b):
            raise SpecError(f"wan[{i}]", f"one link between two different sites, got "
                            f"{w.a!r}-{w.b!r} {'again' if w.a != w.b else ''}".rstrip())
        _positive(f"wan[{i}].Gbps", w.Gbps)
        if isinstance(w.latency_ms, bool) or not isinstance(w.latency_ms, int | float) \
                or not 0 <= w.latency_ms < math.inf:
            raise SpecError(f"wan[{i}].latency_ms", f"must be a number >= 0, got "
                            f"{w.latency_ms!r}")
        if w.bandwidth_by_hour and len(w.bandwidth_by_hour) != 24:
            raise SpecError(f"wan[{i}].bandwidth_by_hour", f"must be 24 rates, got "
                            f"{len(w.bandwidth_by_hour)}")
        for v in w.bandwidth_by_hour:
            _positive(f"wan[{i}].bandwidth_by_hour", v)
        g.add_edge(w.a, w.b)
    if not nx.is_connected(g):
        parts = [sorted(c) for c in nx.connected_components(g)]
        raise SpecError("wan", f"every site must reach every other: {parts[0][0]!r} and "
                        f"{parts[1][0]!r} are not joined")


def _rtts() -> dict[frozenset[str], float]:
    import csv
    from importlib import resources

    text = resources.files("sim").joinpath("data/wan.csv").read_text()
    return {frozenset((r["a"], r["b"])): float(r["rtt_ms"]) for r in csv.DictReader(
        text.splitlines())}


def region_sites(kind: str, nodes: int) -> dict[str, Any]:
    """``[[sites]]`` and ``[[wan]]`` tables of a region preset, ``nodes`` at each site; a
    WAN link's one-way latency is half the published round trip."""
    names = REGION_PRESETS[kind]
    rtt = _rtts()
    return {"sites": [{"name": n, "nodes": nodes} for n in names],
            "wan": [{"a": a, "b": b, "Gbps": REGION_WAN_GBPS,
                     "latency_ms": rtt[frozenset((a, b))] / 2}
                    for i, a in enumerate(names) for b in names[i + 1:]]}
