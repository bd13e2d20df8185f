"""Closed-form (alpha-beta) collective costs over the fabric a group actually spans: the
fabric, the default algorithm, and one formula per algorithm (:mod:`sim.network.algorithms`
puts them in one table with their flow expansions).

Each formula is the textbook one: ``steps * alpha + fraction * bytes / bandwidth``. A group
with ``g`` ranks per node over ``k`` nodes runs its intra-node phases on the node fabric
and its inter-node phases on the NICs; every rank of a node uses its own NIC share, because
the other ranks of the node belong to sibling groups that communicate at the same time.
``size_bytes`` is the full buffer: the output of an all-gather, the input of a
reduce-scatter, what one rank sends in an all-to-all.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sim.layout.placement import GroupSpan
from sim.network.collectives import CHUNK_BYTES, tree_load_factor
from sim.network.wan import wan_fabric
from sim.spec.cluster import ClusterSpec

__all__ = ["Fabric", "fabric_for", "NIC_EFFICIENCY", "PCIE_EFFICIENCY", "default_algorithm",
           "ring_s", "ring_latency_s", "flat_rates", "halving_doubling_s", "nvls_s", "tree_s",
           "hierarchical_s", "all_to_all_s", "send_recv_s", "broadcast_s"]
# Achievable fraction of InfiniBand/RoCE line rate for large messages (nccl-tests inter-node
# busbw is typically 90-95% of line rate; the GPUs' NICs take HardwareSpec.nic_eff, which
# defaults to it and calibrations move) and of a PCIe link.
NIC_EFFICIENCY = 0.92
PCIE_EFFICIENCY = 0.80


@dataclass(frozen=True)
class Fabric:
    """Effective rates seen by one rank of a group."""

    span: GroupSpan
    intra_Bps: float
    intra_alpha_s: float
    inter_Bps: float
    inter_alpha_s: float
    nvls_Bps: float = 0.0  # in-switch all-reduce bus bandwidth; 0 where there is none


def _intra_link_Bps(cluster: ClusterSpec, span: GroupSpan) -> float:
    """Node-fabric bandwidth one rank of the group can use: on an NVLink mesh only the links
    to the group's other members on the node (a point-to-point link per peer)."""
    raw = cluster.intra_GBps * 1e9
    if cluster.intra_node.kind == "nvlink-mesh" and cluster.gpus_per_node > 1:
        return raw * max(1, span.per_node - 1) / (cluster.gpus_per_node - 1)
    return raw


def fabric_for(cluster: ClusterSpec, span: GroupSpan) -> Fabric:
    kind = cluster.intra_node.kind
    link = _intra_link_Bps(cluster, span)
    intra = link * (PCIE_EFFICIENCY if kind == "pcie" else cluster.gpu.comm_eff)
    nvls = link * cluster.gpu.nvls_eff if kind == "nvswitch" else 0.0
    inter = cluster.nic_GBps_per_gpu * 1e9 * cluster.gpu.nic_eff
    alpha = (cluster.inter_node.latency_us + cluster.intra_node.latency_us) * 1e-6
    if span.cross_pod:
        inter /= cluster.inter_node.oversubscription
        if cluster.sites:  # the pods are sites: the group crosses the WAN
            inter, alpha = wan_fabric(cluster, span.size, span.channels, inter, alpha)
    return Fabric(span, intra, cluster.intra_node.latency_us * 1e-6, inter, alpha, nvls)


def default_algorithm(collective: str, f: Fabric, size_bytes: float) -> str:
    """NCCL-like choice: NVLS for all-reduces inside an NVSwitch node that has it, tree for
    small all-reduces across nodes, ring otherwise (across nodes one ring a local rank,
    NVLink and NICs busy at once: NCCL runs all-gathers and reduce-scatters as rings when
    a node holds several of the group's ranks and there is no in-network reduction, and
    its large all-reduces reach the ring's bus bandwidth; see
    ``experiments/validate_nccl.py``); direct all-to-all. ``hierarchical`` (node phases,
    then the NICs, one after the other) is the plan's to choose."""
    span = f.span
    if collective == "all_to_all":
        return "direct"
    if collective == "all_reduce" and span.nodes == 1 and f.nvls_Bps > 0:
        return "nvls"
    if span.nodes > 1 and collective == "all_reduce" and size_bytes < 256 * 1024:
        return "tree"
    return "ring"


def ring_s(n: int, alpha: float, bw: float, size: float, passes: int) -> float:
    """``passes`` = 2 for all-reduce (reduce-scatter then all-gather), 1 otherwise."""
    return passes * ((n - 1) * alpha + (n - 1) / n * size / bw)


def flat_rates(f: Fabric) -> tuple[float, float]:
    """Bandwidth and per-step latency of a ring (or chain) over the whole group. Across
    nodes NCCL runs one ring per local rank, each leaving the node through that rank's NIC
    with ``1/g`` of the data, while inside the node each rank forwards ``g-1`` rings' share:
    the busier of the two sets the pace. Where the nodes hold different numbers of the
    group's ranks, the rings are as many as the emptiest node's ranks (each leaves every
    node through a NIC of its own: :attr:`GroupSpan.channels`)."""
    if f.span.nodes == 1:
        return f.intra_Bps, f.intra_alpha_s
    g, c = f.span.per_node, f.span.channels
    # each rank forwards (g - 1)/g of the data when it is one ring's exit; with fewer rings
    # than ranks on the busiest node, some rank there forwards every ring's whole share
    inside = (f.intra_Bps * g / (g - 1) if c == g else f.intra_Bps) if g > 1 else math.inf
    return min(inside, f.inter_Bps * c), f.inter_alpha_s


def ring_latency_s(f: Fabric, passes: int) -> float:
    """Latency of a ring over the whole group as NCCL's tuning model charges it: of each
    pass's ``n - 1`` steps, the ``k - 1`` between the ``k`` nodes at the inter-node
    latency and the rest at the intra-node one (``nInterSteps`` in NCCL's
    ``src/graph/tuning.cc``, NCCL 2.30). A pipelined ring's chunk crosses each hop in turn,
    so only the hops between nodes pay the network's latency (across sites, each of them is
    charged the WAN's: :func:`sim.network.wan.wan_fabric`)."""
    n, k = f.span.size, f.span.nodes
    return passes * ((k - 1) * f.inter_alpha_s + (n - k) * f.intra_alpha_s)


def halving_doubling_s(f: Fabric, collective: str, size: float) -> float:
    """Step r exchanges ``size / 2^(r+1)`` with partner ``i xor 2^r``: inside the node while
    ``2^r`` < ranks per node, else across (a ring unless the group is a power of two)."""
    n, g = f.span.size, f.span.per_node
    rounds = int(math.log2(n))
    passes = 2 if collective == "all_reduce" else 1
    if 2**rounds != n:  # NCCL's rings, as the ring algorithm's closed form
        bw, _ = flat_rates(f)
        return ring_latency_s(f, passes) + passes * (n - 1) / n * size / bw
    def step(r: int) -> float:
        inside = 2**r < g
        return ((f.intra_alpha_s if inside else f.inter_alpha_s)
                + size / 2 ** (r + 1) / (f.intra_Bps if inside else f.inter_Bps))
    return passes * sum(step(r) for r in range(rounds))


def nvls_s(g: int, alpha: float, bw: float, size: float) -> float:
    """In-switch all-reduce: each rank sends its buffer up once and receives the sum. Its
    latency is taken as a ring's (nccl-tests: small all-reduces cost the same either way)."""
    return 2 * (g - 1) * alpha + 2 * (g - 1) / g * size / bw


def tree_s(n: int, alpha: float, bw: float, size: float) -> float:
    """Double binary tree all-reduce, pipelined in ``CHUNK_BYTES`` chunks: each tree moves
    half the data up and down its ``ceil(log2 n)`` levels; the busiest rank sends
    ``tree_load_factor(n)`` buffers (2 for large groups)."""
    depth = math.ceil(math.log2(n))
    return (2 * depth * (alpha + min(size / 2, CHUNK_BYTES) / bw)
            + tree_load_factor(n) * size / bw)


def hierarchical_s(f: Fabric, size: float, passes: int, nvls: bool = False, tree: bool = False
                  ) -> float:
    """Intra-node phase (ring, or NVLS for an all-reduce), then across nodes a ring (or a
    double binary tree) over each rank's NIC share on ``size / per_node``."""
    g, k = f.span.per_node, f.span.nodes
    if g == 1:
        intra = 0.0
    elif nvls:
        intra = nvls_s(g, f.intra_alpha_s, f.nvls_Bps, size)
    else:
        intra = ring_s(g, f.intra_alpha_s, f.intra_Bps, size, passes)
    if k == 1:
        return intra
    if tree and passes == 2:
        return intra + tree_s(k, f.inter_alpha_s, f.inter_Bps, size / g)
    return intra + ring_s(k, f.inter_alpha_s, f.inter_Bps, size / g, passes)


def all_to_all_s(f: Fabric, size: float, algorithm: str) -> float:
    """Direct: every pair at once, intra- and inter-node parts in parallel. Pairwise: n-1
    steps, rank i to rank i+k; across nodes every step has a rank whose peer is on
    another node, so each step runs at the NIC's pace. Over nodes of unequal counts the
    busiest node's ranks send the most inside it, the emptiest node's the most across."""
    n, g, least = f.span.size, f.span.per_node, f.span.channels
    multi = f.span.nodes > 1
    alpha = f.inter_alpha_s if multi else f.intra_alpha_s
    if algorithm == "pairwise":
        return (n - 1) * (alpha + size / n / (f.inter_Bps if multi else f.intra_Bps))
    return alpha + max((g - 1) / n * size / f.intra_Bps,
                       (n - least) / n * size / f.inter_Bps)


def dispatch_rdma_s(f: Fabric, size: float) -> float:
    """DeepEP's inter-node part: every rank sends ``size / nodes`` to the rank of its own
    local index on each other node of the group (one NIC each, all at once)."""
    if f.span.nodes == 1:
        return 0.0
    return f.inter_alpha_s + (f.span.nodes - 1) / f.span.nodes * size / f.inter_Bps


def dispatch_nvl_s(f: Fabric, size: float) -> float:
    """DeepEP's intra-node part: every rank sends ``size / g`` to each other rank of the
    group on its node over NVLink (what it received across nodes, and its own tokens)."""
    g = f.span.per_node
    if g == 1:
        return 0.0
    return f.intra_alpha_s + (g - 1) / g * size / f.intra_Bps


def send_recv_s(f: Fabric, size: float) -> float:
    """Between neighbours of the group: one hop, across nodes if the group spans several."""
    if f.span.nodes > 1:
        return f.inter_alpha_s + size / f.inter_Bps
    return f.intra_alpha_s + size / f.intra_Bps


def broadcast_s(f: Fabric, size: float) -> float:
    """Pipelined chains from the root, one per channel."""
    n = f.span.size
    bw, alpha = flat_rates(f)
    channels = f.span.channels if f.span.nodes > 1 else 1
    fill = (n - 2) * min(size / channels, CHUNK_BYTES) * channels / bw
    return (n - 1) * alpha + fill + size / bw
