"""ClusterSpec: nodes of accelerators, the fabric inside a node and the network between.

Built from a preset name (``dgx-a100:16``, ``dgx-h100:4``, ``hgx-h200:2``, ``cpu:2``, or
presets joined by ``+`` for a mixed cluster: ``dgx-a100:8+dgx-h100:8``) or a TOML file (see
docs/reference/cluster.md). Every field is validated here, with the field named in the error.

A heterogeneous cluster lists ``node_groups``: consecutive runs of nodes, each with its own
GPU type and optionally its own NIC rate and count and node-fabric bandwidth (the cluster's
values otherwise; the node fabric then follows the group's GPU). All groups share
``gpus_per_node``, the fabric kind and the network topology. ``cluster.gpu`` is the first
group's GPU (what a homogeneous code path sees); :meth:`ClusterSpec.gpu_of` gives a device's.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import math
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from sim.errors import SpecError, field_name
from sim.io import read_toml, table_fields
from sim.spec.groups import (
    REGION_PRESETS,
    NodeGroup,
    Site,
    WanLink,
    check_sites,
    groups_from_dict,
    region_sites,
    resolve_groups,
    sites_from_dict,
)
from sim.spec.hardware import HardwareSpec, cpu_device_name, get_hardware
from sim.spec.limits import check_cluster_size, preset_count
from sim.spec.stack import stack_devices

__all__ = ["IntraNode", "InterNode", "NodeGroup", "Site", "WanLink", "ClusterSpec",
           "load_cluster", "preset_names", "INTRA_KINDS", "TOPOLOGIES", "COMPUTE_STATS"]

COMPUTE_STATS = ("median", "p10")  # which recorded statistic of a profile the cost model reads

INTRA_KINDS = ("nvswitch", "pcie", "nvlink-mesh", "loopback")
PCIE_GBPS = 32.0  # PCIe Gen4 x16, per direction
TOPOLOGIES = ("fat-tree", "rail-optimized", "torus2d", "torus3d", "dragonfly")


@dataclass(frozen=True)
class IntraNode:
    """The fabric between devices of one node; bandwidth per device, per direction.
    Without a bandwidth, NVSwitch and NVLink mesh take the device's NVLink rate and PCIe
    takes 32 GB/s (Gen4 x16)."""

    kind: str = "nvswitch"  # `nvswitch`, `pcie`, `nvlink-mesh` or `loopback`
    # per device, per direction, GB/s; unset: the GPU's NVLink rate (PCIe: 32)
    bandwidth_GBps: float | None = None
    latency_us: float = 2.0  # latency of one hop inside the node, µs


@dataclass(frozen=True)
class InterNode:
    """The network between nodes; NIC bandwidth per NIC, per direction."""

    topology: str = "fat-tree"  # `fat-tree`, `rail-optimized`, `torus2d`, `torus3d` or `dragonfly`
    nic_Gbps: float = 400.0  # per NIC, per direction, Gb/s
    nics_per_node: int = 8  # NICs per node (each serves gpus_per_node / nics_per_node devices)
    oversubscription: float = 1.0  # above the pod: 7.0 means 1:7
    pod_gpus: int = 0  # devices under full bisection; 0 means the whole cluster
    latency_us: float = 2.0  # network latency between nodes, µs


@dataclass(frozen=True)
class ClusterSpec:
    name: str  # label of the cluster (the preset, or the file's stem)
    nodes: int  # number of nodes (with node groups: their sum)
    gpus_per_node: int  # devices per node
    # catalog device (in a file: its name, e.g. `h100-sxm5-80gb`); with node groups, the first
    # group's
    gpu: HardwareSpec
    # the fabric inside a node (`[intra_node]` table)
    intra_node: IntraNode = field(default_factory=IntraNode)
    # the network between nodes (`[inter_node]` table)
    inter_node: InterNode = field(default_factory=InterNode)
    profile: str | None = None  # profile DB directory (issue: profiler)
    node_groups: tuple[NodeGroup, ...] = ()  # empty: one group of every node
    compute_stat: str = "median"  # which statistic of the profile's compute rows to read
    sites: tuple[Site, ...] = ()  # data centres (`[[sites]]`); empty: one site
    wan: tuple[WanLink, ...] = ()  # links between the sites (`[[wan]]`)
    stack: str = ""  # software stack (sim/data/stacks.toml) on every device; "": none

    def __post_init__(self) -> None:
        _check_int("nodes", self.nodes)
        if self.sites:
            self._apply_sites()
        _check_choice("compute_stat", self.compute_stat, COMPUTE_STATS)
        if self.compute_stat != "median" and not self.profile:
            raise SpecError("compute_stat", f"{self.compute_stat} is a statistic of profiled "
                            "times: name a profile DB too (profile = \"DIR\" or --profile)")
        _check_int("gpus_per_node", self.gpus_per_node)
        _check_choice("intra_node.kind", self.intra_node.kind, INTRA_KINDS)
        object.__setattr__(self, "node_groups", resolve_groups(self, PCIE_GBPS))
        stack_devices(self)
        if self.intra_node.bandwidth_GBps is None:
            default = PCIE_GBPS if self.intra_node.kind == "pcie" else self.gpu.nvlink_GBps
            object.__setattr__(self, "intra_node",
                               dataclasses.replace(self.intra_node, bandwidth_GBps=default))
        _check_positive("intra_node.bandwidth_GBps", self.intra_node.bandwidth_GBps)
        _check_nonneg("intra_node.latency_us", self.intra_node.latency_us)
        inter = self.inter_node
        _check_choice("inter_node.topology", inter.topology, TOPOLOGIES)
        _check_positive("inter_node.nic_Gbps", inter.nic_Gbps)
        _check_int("inter_node.nics_per_node", inter.nics_per_node)
        _check_nonneg("inter_node.latency_us", inter.latency_us)
        _check_positive("inter_node.oversubscription", inter.oversubscription)
        if inter.oversubscription < 1:
            raise SpecError("inter_node.oversubscription", "must be a number >= 1 (7.0 means "
                            f"1:7), got {inter.oversubscription!r}")
        if isinstance(inter.pod_gpus, bool) or not isinstance(inter.pod_gpus, int) \
                or inter.pod_gpus < 0 or (inter.pod_gpus and inter.pod_gpus % self.gpus_per_node):
            raise SpecError("inter_node.pod_gpus", "must be 0 (whole cluster) or a positive "
                            f"multiple of gpus_per_node={self.gpus_per_node}, "
                            f"got {inter.pod_gpus!r}")
        check_cluster_size(self.nodes, self.gpus_per_node, [
            (g.nodes, g.nics_per_node or 0) for g in self.node_groups] or [
            (self.nodes, inter.nics_per_node)])

    def _apply_sites(self) -> None:
        """Sites are the pods (full bisection inside; ``pod_gpus`` the largest site's); a
        site naming its own GPU or rates makes the sites node groups."""
        inter = self.inter_node
        check_sites(self.sites, self.wan, self.nodes, inter.pod_gpus, inter.topology,
                    inter.oversubscription, self.gpus_per_node)
        first = self.sites[0].gpu
        if first is not None and first.name != self.gpu.name:
            raise SpecError("sites[0].gpu", f"the first site's device is the cluster's: set "
                            f"gpu = {first.name!r} at the top, or leave sites[0].gpu unset")
        if any(s.own_nodes for s in self.sites) and not self.node_groups:
            object.__setattr__(self, "node_groups", tuple(
                NodeGroup(s.nodes, s.gpu or self.gpu, s.nic_Gbps, s.nics_per_node,
                          s.intra_GBps) for s in self.sites))
        if self.node_groups and [g.nodes for g in self.node_groups] != \
                [s.nodes for s in self.sites]:  # (groups kept from other sites: a replace)
            raise SpecError("node_groups", "with sites, one node group a site, as many nodes")
        pod = max(s.nodes for s in self.sites) * self.gpus_per_node
        object.__setattr__(self, "inter_node", dataclasses.replace(inter, pod_gpus=pod))

    def site_of_node(self, node: int) -> int:
        """Index of the site holding ``node`` (0 without sites)."""
        return bisect.bisect_right(self.site_starts, node) if self.sites else 0

    @property
    def site_starts(self) -> tuple[int, ...]:
        """The first node of every site after the first (empty without sites)."""
        return tuple(itertools.accumulate(s.nodes for s in self.sites[:-1]))

    def pod_of_node(self, node: int) -> int:
        """Index of the full-bisection pod holding ``node``: its site, with sites."""
        if self.sites:
            return self.site_of_node(node)
        return node // (self.pod_size // self.gpus_per_node)

    @property
    def pods(self) -> int | tuple[int, ...]:
        """The pods as placement sees them: their size in devices when every pod has it,
        else the first device of every pod after the first (sites of different sizes)."""
        if len({s.nodes for s in self.sites}) > 1:
            return tuple(n * self.gpus_per_node for n in self.site_starts)
        return self.pod_size

    @property
    def intra_GBps(self) -> float:
        """Node-fabric bandwidth per device, per direction (always set after init); of a
        heterogeneous cluster the slowest group's (the closed-form tier's bottleneck)."""
        if self.node_groups:
            return min(float(g.intra_GBps or 0.0) for g in self.node_groups)
        return float(self.intra_node.bandwidth_GBps or 0.0)

    @property
    def comm_overlap(self) -> float:
        """0 when any device's collectives use the cores that compute (CPU ranks): then
        no communication hides behind compute (:attr:`HardwareSpec.comm_overlap`)."""
        return min([self.gpu.comm_overlap] + [g.gpu.comm_overlap for g in self.node_groups])

    @property
    def heterogeneous(self) -> bool:
        """True when node groups differ in GPU type or rates."""
        return len({(g.gpu, g.nic_Gbps, g.nics_per_node, g.intra_GBps)
                    for g in self.node_groups}) > 1

    def group_of_node(self, node: int) -> NodeGroup | None:
        """The node group holding ``node`` (``None`` for a cluster without groups)."""
        for g in self.node_groups:
            if node < g.nodes:
                return g
            node -= g.nodes
        return None

    def gpu_of(self, device: int) -> HardwareSpec:
        g = self.group_of_node(device // self.gpus_per_node)
        return g.gpu if g else self.gpu

    def node_intra_GBps(self, node: int) -> float:
        """Node-fabric bandwidth per device of ``node``, per direction."""
        g = self.group_of_node(node)
        return float(g.intra_GBps) if g and g.intra_GBps else self.intra_GBps

    def nic_Bps(self, node: int) -> float:
        """Achievable bytes/s of one NIC of ``node`` (its rate times its device's
        ``nic_eff``)."""
        return self.node_nics(node)[0] / 8 * 1e9 * self.gpu_of(node * self.gpus_per_node).nic_eff

    def node_nics(self, node: int) -> tuple[float, int]:
        """(NIC Gb/s, NICs) of ``node``."""
        g = self.group_of_node(node)
        if g is None or g.nic_Gbps is None or g.nics_per_node is None:
            return self.inter_node.nic_Gbps, self.inter_node.nics_per_node
        return g.nic_Gbps, g.nics_per_node

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def pod_size(self) -> int:
        """Devices under full bisection bandwidth."""
        return min(self.inter_node.pod_gpus or self.world_size, self.world_size)

    @property
    def nic_GBps_per_gpu(self) -> float:
        """Inter-node bandwidth share of one device, per direction, in GB/s (of a
        heterogeneous cluster the slowest group's)."""
        nics = [self.node_nics(0)] if not self.node_groups else \
            [(g.nic_Gbps or 0.0, g.nics_per_node or 0) for g in self.node_groups]
        return min(rate / 8.0 * n / self.gpus_per_node for rate, n in nics)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
               "name": self.name, "nodes": self.nodes, "gpus_per_node": self.gpus_per_node,
               "gpu": self.gpu.name, "intra_node": dataclasses.asdict(self.intra_node),
               "inter_node": dataclasses.asdict(self.inter_node), "profile": self.profile,
               "compute_stat": self.compute_stat}
        if self.node_groups and not self.sites:  # (sites make their own groups)
            out["node_groups"] = [g.to_dict() for g in self.node_groups]
        if self.sites:
            out["sites"] = [s.to_dict() for s in self.sites]
            out["wan"] = [w.to_dict() for w in self.wan]
            out["inter_node"]["pod_gpus"] = 0  # the sites' own, set again on load
        if self.stack:
            out["stack"] = self.stack
        return out


def _check_int(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise SpecError(name, f"must be a positive integer, got {value!r}")


def _check_positive(name: str, value: Any) -> None:
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    if not ok or not math.isfinite(value) or value <= 0:
        raise SpecError(name, f"must be a positive number, got {value!r}")


def _check_nonneg(name: str, value: Any) -> None:
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    if not ok or not math.isfinite(value) or value < 0:
        raise SpecError(name, f"must be a number >= 0, got {value!r}")


def _check_choice(name: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise SpecError(name, f"must be one of {', '.join(choices)}, got {value!r}")


# Presets ------------------------------------------------------------------------------
# (gpu, NVSwitch latency us, NIC Gb/s, NICs per node); NVLink rate from the catalog.
_DGX = {
    "dgx-a100": ("a100-sxm4-80gb", 3.0, 200.0, 8),  # 8x HDR InfiniBand
    "dgx-h100": ("h100-sxm5-80gb", 2.0, 400.0, 8),  # 8x NDR ConnectX-7
    "hgx-h200": ("h200-sxm-141gb", 2.0, 400.0, 8),  # 8x NDR ConnectX-7
    # NICs as DGX H100 (DeepEP's H800 testbed: ConnectX-7 400 Gb/s; MegaScale-MoE names none)
    "hgx-h800": ("h800-sxm5-80gb", 2.0, 400.0, 8),
    # Meta's Grand Teton: 8 H100 96 GB, NVLink, 400 Gb/s RDMA a GPU (torchtitan benchmarks)
    "grand-teton": ("h100-gt-96gb", 2.0, 400.0, 8),
}


def preset_names() -> list[str]:
    return [f"{k}:NODES" for k in _DGX] + ["cpu:RANKS", "PRESET+PRESET (mixed)",
                                          "regions2-dgx-h100:NODES_PER_SITE", "regions3-..."]


def _region_preset(name: str) -> ClusterSpec:
    """``regions2-PRESET:N``: N nodes of PRESET at each of the region preset's sites."""
    kind, _, rest = name.partition("-")
    base = _preset(rest)
    data = {**base.to_dict(), "name": name, **region_sites(kind, base.nodes)}
    data.pop("nodes")
    data.pop("profile")
    return cluster_from_dict(data, name)


def _mixed_preset(name: str) -> ClusterSpec:
    """Presets joined by ``+``: one node group each, the network of the first."""
    parts = [_preset(part) for part in name.split("+")]
    if any(p.gpu.name == "cpu" for p in parts):
        raise SpecError("cluster", f"{name!r}: cpu presets cannot be mixed")
    groups = tuple(NodeGroup(p.nodes, p.gpu, p.inter_node.nic_Gbps, p.inter_node.nics_per_node,
                             p.intra_GBps) for p in parts)
    return dataclasses.replace(parts[0], name=name, nodes=sum(p.nodes for p in parts),
                               node_groups=groups)


def _preset(name: str) -> ClusterSpec:
    if "+" in name:
        return _mixed_preset(name)
    if name.partition("-")[0] in REGION_PRESETS:
        return _region_preset(name)
    kind, _, count = name.partition(":")
    if kind not in _DGX and kind != "cpu":
        raise SpecError("cluster", f"unknown preset or missing file {name!r} "
                        f"(presets: {', '.join(preset_names())})")
    n = preset_count(count)
    if not n:
        raise SpecError("cluster", f"preset {name!r} needs a positive count after ':', "
                        f"e.g. {kind}:{'2' if kind == 'cpu' else '16'}")
    if kind == "cpu":
        return ClusterSpec(name, nodes=1, gpus_per_node=n, gpu=get_hardware("cpu"),
                           intra_node=IntraNode("loopback", None, 30.0),
                           inter_node=InterNode(nic_Gbps=10.0, nics_per_node=1, latency_us=50.0),
                           profile=shipped_cpu_profile())
    gpu, intra_lat, nic, nics = _DGX[kind]
    return ClusterSpec(name, nodes=n, gpus_per_node=8, gpu=get_hardware(gpu),
                       intra_node=IntraNode("nvswitch", None, intra_lat),
                       inter_node=InterNode("fat-tree", nic, nics, 1.0, 0, 2.0))


def shipped_cpu_profile() -> str | None:
    """The profile DB trainsim ships for this host's CPU model, if there is one
    (``sim/data/profiles/cpu-<model>``); measured one thread per rank with gloo."""
    folder = Path(str(resources.files("sim").joinpath("data", "profiles"))) / cpu_device_name()
    return str(folder) if (folder / "meta.json").is_file() else None


def _table(data: dict[str, Any], key: str, cls: type) -> Any:
    return cls(**table_fields(data, key, cls))


_TOP_KEYS = {"name", "nodes", "gpus_per_node", "gpu", "intra_node", "inter_node", "profile",
             "node_groups", "compute_stat", "sites", "wan", "stack"}


def cluster_from_dict(data: dict[str, Any], name: str, base: Path | None = None) -> ClusterSpec:
    """A cluster from a TOML table; a relative ``profile`` path is taken from ``base``."""
    unknown = sorted(set(data) - _TOP_KEYS)
    if unknown:
        raise SpecError(field_name(unknown[0]),
                        f"unknown field (known: {', '.join(sorted(_TOP_KEYS))})")
    data = dict(data)
    groups = groups_from_dict(data)
    sites, wan = sites_from_dict(data)
    for key in ("nodes", "gpus_per_node", "gpu"):
        if key not in data:
            raise SpecError(key, "is required in a cluster file")
    if not isinstance(data["gpu"], str):
        raise SpecError("gpu", f"must be a catalog name, got {data['gpu']!r}")
    profile = data.get("profile")
    if profile is not None and not isinstance(profile, str):
        raise SpecError("profile", f"must be a path string, got {profile!r}")
    if profile is not None and base is not None and not Path(profile).is_absolute():
        profile = str(base / profile)
    return ClusterSpec(str(data.get("name", name)), data["nodes"], data["gpus_per_node"],
                       get_hardware(data["gpu"]), _table(data, "intra_node", IntraNode),
                       _table(data, "inter_node", InterNode), profile, groups,
                       data.get("compute_stat", "median"), sites, wan, _stack_name(data))


def _stack_name(data: dict[str, Any]) -> str:
    stack = data.get("stack", "")
    if not isinstance(stack, str):
        raise SpecError("stack", f"must be a stack name, got {stack!r}")
    return stack


def load_cluster(ref: str) -> ClusterSpec:
    """A preset (``dgx-h100:16``) or a TOML file path."""
    path = Path(ref)  # a name too long for a file system (NAME_MAX) is no file: a preset?
    if path.suffix == ".toml" or (len(path.name.encode()) <= 255 and path.is_file()):
        data = read_toml(path, "cluster", f"cluster[{path.name}]")
        return cluster_from_dict(data, path.stem, path.parent)
    return _preset(ref)
