"""The WAN between sites as the two tiers see it.

Sites are joined by WAN links (:class:`sim.spec.groups.WanLink`). Traffic between two sites
takes the lowest-latency route over those links (:func:`site_path`). A collective whose
group spans the sites runs, in the closed-form tier, as a ring over the sites in order
(site 0, 1, .., S-1, back to 0): its step time pays the slowest hop's latency, and every
rank's flow that crosses shares the WAN links on the ring's routes (:func:`wan_fabric`).
The flow network instead carries the WAN links as edges between the sites' fabrics
(:mod:`sim.network.topology`), so it shares them flow by flow.

A WAN link's ``Gbps`` is taken as achievable (no efficiency factor: measure it). A link's
``jitter`` (an extra one-way delay drawn per message) makes a ring step wait for the slowest
of the group's flows crossing the WAN: the closed form adds the expected largest of that
many draws (over the empirical distribution of 20,000 seeded draws) to every step's latency;
the flow network draws them, step by step (:class:`sim.network.engine.CommEngine`).
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from sim.errors import SpecError
from sim.spec.cluster import ClusterSpec

__all__ = ["site_path", "ring_wan", "wan_fabric", "jitter_s"]


def _graph(cluster: ClusterSpec) -> Any:
    import networkx as nx  # only for clusters with sites (an analytic run loads none)

    g = nx.Graph()
    index = {s.name: i for i, s in enumerate(cluster.sites)}
    g.add_nodes_from(range(len(cluster.sites)))
    for w in cluster.wan:
        g.add_edge(index[w.a], index[w.b], latency_s=w.latency_ms * 1e-3,
                   Bps=w.Gbps * 1e9 / 8)
    return g


@functools.lru_cache(maxsize=256)
def _paths(cluster: ClusterSpec) -> dict[tuple[int, int], list[int]]:
    import networkx as nx

    g = _graph(cluster)
    return {(a, b): nx.shortest_path(g, a, b, weight="latency_s")
            for a in g.nodes for b in g.nodes}


def site_path(cluster: ClusterSpec, a: int, b: int) -> list[int]:
    """Sites from ``a`` to ``b`` (both included) along the lowest-latency WAN route."""
    return _paths(cluster)[(a, b)]


@functools.lru_cache(maxsize=256)
def ring_wan(cluster: ClusterSpec) -> tuple[float, float]:
    """(bytes/s, seconds) of a ring over every site: the tightest WAN link's rate per
    direction divided by the ring hops routed over it, and the slowest hop's one-way
    latency."""
    g = _graph(cluster)
    n = len(cluster.sites)
    uses: dict[tuple[int, int], int] = {}
    latency = 0.0
    for i in range(n):
        path = site_path(cluster, i, (i + 1) % n)
        latency = max(latency, sum(g.edges[u, v]["latency_s"]
                                   for u, v in zip(path, path[1:], strict=False)))
        for u, v in zip(path, path[1:], strict=False):
            uses[(u, v)] = uses.get((u, v), 0) + 1
    rate = min((g.edges[u, v]["Bps"] / k for (u, v), k in uses.items()), default=float("inf"))
    return rate, latency


@functools.lru_cache(maxsize=1024)
def jitter_s(cluster: ClusterSpec, flows: int) -> float:
    """Expected largest jitter among ``flows`` messages crossing at once, on the WAN link
    with the largest (seconds; 0 without jitter)."""
    worst = 0.0
    for w in cluster.wan:
        if w.jitter is None:
            continue
        draws = np.sort(w.jitter.draw(np.random.default_rng(0), 20_000))
        share = np.arange(len(draws) + 1) / len(draws)
        q = float(draws @ np.diff(share ** flows)) * 1e-3  # E[max] over the sample
        if not np.isfinite(q):
            raise SpecError("wan.jitter", f"draws of the {w.a}-{w.b} link's jitter overflow: "
                            "narrow its distribution")
        worst = max(worst, q)
    return worst


def wan_fabric(cluster: ClusterSpec, size: int, per_node: int, inter_Bps: float,
               inter_alpha_s: float) -> tuple[float, float]:
    """One rank's inter-node (bytes/s, latency) in a group of ``size`` ranks that spans the
    sites: every sibling group's every rank on a node (``per_node``) sends a flow across at
    once, all sharing the ring's WAN links; a step of the group waits for the slowest
    jitter of its own crossing flows (a ring per rank on a node, each crossing every hop
    between sites)."""
    if len(cluster.sites) < 2:
        return inter_Bps, inter_alpha_s
    rate, latency = ring_wan(cluster)
    per_node = max(1, per_node)
    flows = max(1, cluster.world_size // size) * per_node
    crossing = per_node * len(cluster.sites)
    return min(inter_Bps, rate / flows), inter_alpha_s + latency + jitter_s(cluster, crossing)
