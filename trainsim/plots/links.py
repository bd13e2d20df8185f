"""Per-link utilisation heat map of a topology (matplotlib, imported lazily).

Vertices are drawn in rows by tier (:mod:`trainsim.plots.layers`) — devices; node switches
and NICs; leaf, rail or router switches; core and spine switches — each row ordered by
node, so a node's devices, its switch and its NICs line up. Every link is one edge coloured
by its utilisation in percent (the busier of its two directions; grey: no traffic
recorded) on a fixed 0-100% scale, so 10% looks like 10%, with a labelled colourbar.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from sim.errors import SpecError
from sim.network.links import link_name
from sim.network.topology import Topology
from trainsim.plots.layers import KIND_NAMES, KINDS, TIERS, kind_of, layered_positions, tier_of
from trainsim.plots.output import save_figure

__all__ = ["plot_links", "links_figure", "edge_utilization", "UTIL_RANGE_PCT"]

UTIL_RANGE_PCT = (0.0, 100.0)  # the colour scale: percent of a link's capacity


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


def plot_links(topo: Topology, links: list[dict[str, Any]], path: Path, title: str = ""
               ) -> Path:
    """Write the heat map (PNG or SVG, by ``path``'s suffix)."""
    return save_figure(links_figure(topo, links, title), path)


def links_figure(topo: Topology, links: list[dict[str, Any]], title: str = "") -> Any:
    """The heat map's Figure: edges coloured on a fixed 0-100% scale (the colourbar), vertex
    kinds in the legend, tiers on the y axis."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import networkx as nx
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize

    util = {e: 100 * x for e, x in edge_utilization(topo, links).items()}  # percent
    g = nx.Graph(topo.graph.to_undirected(as_view=True))
    pos = layered_positions(topo)
    norm, cmap = Normalize(*UTIL_RANGE_PCT), plt.get_cmap("plasma")
    fig, ax = plt.subplots(figsize=(12, 6.5))
    for same_tier in (False, True):
        edges = [e for e in g.edges if (tier_of(e[0]) == tier_of(e[1])) == same_tier]
        used = [util.get(frozenset(e)) for e in edges]
        curved = {"arrows": True, "arrowstyle": "-", "connectionstyle": "arc3,rad=0.3"} \
            if same_tier else {}  # links inside a tier (router to router) arc over it
        nx.draw_networkx_edges(
            g, pos, edgelist=edges, ax=ax, **curved,
            edge_color=[cmap(norm(x)) if x else "#d9d9d9" for x in used],
            width=[0.5 + 2.5 * min(x or 0.0, 100.0) / 100 for x in used])
    _draw_kinds(ax, g, pos)
    fig.colorbar(ScalarMappable(norm, cmap), ax=ax, extend="max" if max(
        util.values(), default=0.0) > UTIL_RANGE_PCT[1] else "neither",
        label="link utilisation (%): bytes / (capacity x time), busier direction")
    tiers = sorted({tier_of(v) for v in g.nodes})
    ax.tick_params(left=True, labelleft=True)  # networkx turned them off
    ax.set_yticks(tiers, [TIERS[t] for t in tiers], fontsize=8)
    ax.set_xticks([])
    ax.set_ylabel("network tier (devices at the bottom)")
    ax.set_xlabel("vertices in node order; grey links: no traffic recorded")
    for side in ("top", "right", "bottom"):
        ax.spines[side].set_visible(False)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.08), ncol=8, fontsize=7,
              markerscale=1.5, frameon=False)
    ax.set_xlim(-0.02, 1.02)
    ax.set_title(f"Link utilisation: {title or topo.cluster.name}", fontsize=10)
    fig.tight_layout()
    return fig


def _draw_kinds(ax: Any, g: Any, pos: dict[object, tuple[float, float]]) -> None:
    """Vertices, one colour per kind (the legend)."""
    import matplotlib.pyplot as plt
    import networkx as nx

    for i, kind in enumerate(KINDS):
        members = [v for v in g.nodes if kind_of(v) == kind]
        if members:
            nx.draw_networkx_nodes(g, pos, nodelist=members, ax=ax, node_size=18,
                                   node_color=[plt.get_cmap("tab10")(i)],
                                   label=KIND_NAMES[kind])
