"""Per-link utilisation heat map of a topology (matplotlib, imported lazily).

Vertices are drawn in rows by tier — devices; node switches and NICs; pod, rail or router
switches; core and spine switches — each row ordered by node, so a node's devices, its
switch and its NICs line up. Every link is one edge coloured by its utilisation (the busier
of its two directions; grey: no traffic recorded), with a colorbar.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, cast

from sim.errors import SpecError
from sim.network.links import link_name
from sim.network.topology import Topology
from trainsim.plots.figures import save_figure

__all__ = ["plot_links", "tier_of", "edge_utilization"]

TIERS = ("devices", "node switches, NICs", "pod / rail / router", "core / spine")
_TIER = {"sw": 1, "nic": 1, "pod": 2, "rail": 2, "rt": 2, "core": 3, "spine": 3}


_KINDS = ("device", "sw", "nic", "pod", "rail", "rt", "core", "spine")  # one colour each


def _kind(v: object) -> str:
    return "device" if isinstance(v, int) else str(v[0])  # type: ignore[index]


def tier_of(v: object) -> int:
    return 0 if isinstance(v, int) else _TIER[_kind(v)]


def _order(topo: Topology, v: object) -> tuple[Any, ...]:
    """Position within a tier: by node (or pod), then kind and index."""
    if isinstance(v, int):
        return (v // topo.cluster.gpus_per_node, "", v)
    t = cast(tuple[Any, ...], v)  # a switch or NIC: (kind, node or pod, ...)
    return (t[1] if len(t) > 1 else 0, str(t[0]), t[2:])


def edge_utilization(topo: Topology, links: list[dict[str, Any]]
                     ) -> dict[frozenset[object], float]:
    """Undirected edge -> the larger utilisation of its two directions."""
    lid = {link_name(topo, i): i for i in range(len(topo.links))}
    out: dict[frozenset[object], float] = {}
    for row in links:
        name = row.get("link")
        if name not in lid:
            raise SpecError("links", f"{name!r} is not a link of cluster "
                            f"{topo.cluster.name!r} (a result of another cluster?)")
        util = row.get("utilization", 0.0)
        if isinstance(util, bool) or not isinstance(util, (int, float)) \
                or not math.isfinite(util) or util < 0:
            raise SpecError("links", f"{name!r}: utilization must be a number >= 0, "
                            f"got {util!r}")
        u, v = topo.links[lid[name]]
        key = frozenset((u, v))
        out[key] = max(out.get(key, 0.0), float(util))
    return out


def _positions(topo: Topology) -> dict[object, tuple[float, float]]:
    rows: dict[int, list[object]] = {}
    for v in topo.graph.nodes:
        rows.setdefault(tier_of(v), []).append(v)
    pos = {}
    for tier, members in rows.items():
        members.sort(key=lambda v: _order(topo, v))
        for i, v in enumerate(members):
            pos[v] = ((i + 0.5) / len(members), float(tier))
    return pos


def plot_links(topo: Topology, links: list[dict[str, Any]], path: Path, title: str = ""
               ) -> Path:
    """Write the heat map (PNG or SVG, by ``path``'s suffix)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import networkx as nx
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize

    util = edge_utilization(topo, links)
    g = nx.Graph(topo.graph.to_undirected(as_view=True))
    pos = _positions(topo)
    top = max(util.values(), default=0.0) or 1.0
    norm, cmap = Normalize(0.0, top), plt.get_cmap("plasma")
    fig, ax = plt.subplots(figsize=(12, 6.5))
    for same_tier in (False, True):
        edges = [e for e in g.edges if (tier_of(e[0]) == tier_of(e[1])) == same_tier]
        used = [util.get(frozenset(e)) for e in edges]
        curved = {"arrows": True, "arrowstyle": "-", "connectionstyle": "arc3,rad=0.3"} \
            if same_tier else {}  # links inside a tier (router to router) arc over it
        nx.draw_networkx_edges(
            g, pos, edgelist=edges, ax=ax, **curved,
            edge_color=[cmap(norm(x)) if x else "#d9d9d9" for x in used],
            width=[0.5 + 2.5 * (x or 0.0) / top for x in used])
    for i, kind in enumerate(_KINDS):
        members = [v for v in g.nodes if _kind(v) == kind]
        if members:
            nx.draw_networkx_nodes(g, pos, nodelist=members, ax=ax, node_size=18,
                                   node_color=[plt.get_cmap("tab10")(i)], label=kind)
    for tier in sorted({tier_of(v) for v in g.nodes}):
        ax.text(-0.02, tier, TIERS[tier], ha="right", va="center", fontsize=8)
    fig.colorbar(ScalarMappable(norm, cmap), ax=ax,
                 label="utilisation (bytes / capacity x time), busier direction")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=8, fontsize=7,
              markerscale=1.5, frameon=False)
    ax.set_xlim(-0.25, 1.02)
    ax.set_title(title or topo.cluster.name, fontsize=10)
    ax.axis("off")
    return save_figure(fig, path)
