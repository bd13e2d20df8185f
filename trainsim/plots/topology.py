"""The cluster's network drawn in layers (``trainsim topology --png``): devices at the
bottom, node switches and NICs above them, leaf / rail / router switches, then core and
spine switches on top (:mod:`trainsim.plots.layers`).

A big cluster is summarised: at most ``max_nodes`` nodes are drawn (the first and the last
ones, so two pods or groups show how they meet), with every switch above them; the title
says "showing 4 of 128 nodes". Links are grouped into classes (two vertex kinds and one
rate); the legend gives each class's achievable rate per direction — the capacity the
simulator uses, line rate times efficiency — and how many links it has, and one link of
each class carries its rate as a label.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

from sim.network.topology import Topology
from trainsim.plots import layers
from trainsim.plots.layers import TIERS, kind_of, layered_positions, tier_of, vertex_label
from trainsim.plots.output import save_figure

__all__ = ["draw_topology", "topology_figure", "shown_nodes", "drawn_vertices", "rate_label",
           "MAX_NODES"]

MAX_NODES = 4
Edge = tuple[object, object]


def shown_nodes(nodes: int, max_nodes: int = MAX_NODES) -> list[int]:
    """All nodes, or the first ``ceil(max/2)`` and the last ``floor(max/2)``."""
    if nodes <= max_nodes:
        return list(range(nodes))
    first = (max_nodes + 1) // 2
    return list(range(first)) + list(range(nodes - (max_nodes - first), nodes))


def drawn_vertices(topo: Topology, nodes: list[int]) -> set[object]:
    """The devices, switch, NICs and router of each of ``nodes``, and every vertex reached
    from them going up the tiers."""
    g, shown = topo.cluster.gpus_per_node, set(nodes)
    todo = [v for v in topo.graph.nodes if _node_of(v, g) in shown]
    seen = set(todo)
    while todo:
        u = todo.pop()
        for v in topo.graph.successors(u):
            if v not in seen and tier_of(v) > tier_of(u):
                seen.add(v)
                todo.append(v)
    return seen


def _node_of(v: object, gpus_per_node: int) -> int | None:
    """The node a device, node switch, NIC or router belongs to (None for other switches)."""
    if isinstance(v, int):
        return v // gpus_per_node
    t = cast(tuple[Any, ...], v)
    return int(t[1]) if t[0] in ("sw", "nic", "rt") else None


def rate_label(cap_Bps: float, intra_node: bool) -> str:
    """A link's rate as people quote it: GB/s inside a node, Gb/s on the network."""
    return f"{cap_Bps / 1e9:,.0f} GB/s" if intra_node else f"{cap_Bps * 8 / 1e9:,.0f} Gb/s"


def _link_classes(topo: Topology, vertices: set[object]) -> dict[str, list[Edge]]:
    """Undirected links among ``vertices`` by class: "gpu – nic: 368 Gb/s"."""
    classes: dict[str, list[Edge]] = {}
    for u, v, cap in topo.graph.subgraph(vertices).edges(data="cap_Bps"):
        if (tier_of(u), str(u)) > (tier_of(v), str(v)):
            continue  # one direction of each link (both carry the same rate)
        kinds = [kind_of(u), kind_of(v)]
        intra = set(kinds) <= {"device", "sw"}
        name = " – ".join(layers.KIND_NAMES[k] for k in kinds)
        classes.setdefault(f"{name}: {rate_label(cap, intra)}", []).append((u, v))
    return classes


def _title(topo: Topology, nodes: list[int]) -> str:
    c = topo.cluster
    if c.nodes == 1:
        return f"Network of {c.name}: one node of {c.gpus_per_node} devices"
    head = f"Network of {c.name} ({c.inter_node.topology})"
    if len(nodes) == c.nodes:
        return f"{head}: all {c.nodes} nodes"
    return (f"{head}: showing {len(nodes)} of {c.nodes} nodes "
            f"({', '.join(map(str, nodes))})\nlinks of the other nodes are left out")


def _draw_links(ax: Any, pos: dict[object, tuple[float, float]],
                classes: dict[str, list[Edge]]) -> None:
    import matplotlib.pyplot as plt

    palette = plt.get_cmap("tab10")
    for i, (name, edges) in enumerate(sorted(classes.items())):  # one colour per class
        color = palette(i % 10)
        for j, (u, v) in enumerate(edges):
            (x0, y0), (x1, y1) = pos[u], pos[v]
            bend = 0.5 if y0 == y1 else 0.0  # links inside a tier arc over it
            mx, my = (x0 + x1) / 2, (y0 + y1) / 2 + bend * abs(x1 - x0)
            ax.plot([x0, mx, x1] if bend else [x0, x1], [y0, my, y1] if bend else [y0, y1],
                    color=color, lw=1.0, alpha=0.6, zorder=1,
                    label=f"{name} ({len(edges)} links)" if j == 0 else None)
        u, v = edges[len(edges) * (i + 1) // (len(classes) + 1)]  # labels spread out
        ax.annotate(name.split(": ")[1], ((pos[u][0] + pos[v][0]) / 2,
                                          (pos[u][1] + pos[v][1]) / 2),
                    fontsize=6, color=color, ha="center", va="center", zorder=3,
                    bbox={"boxstyle": "round,pad=0.15", "fc": "white", "ec": color, "lw": 0.5})


def _draw_vertices(ax: Any, pos: dict[object, tuple[float, float]]) -> None:
    by_tier: dict[int, list[object]] = {}
    for v in pos:
        by_tier.setdefault(tier_of(v), []).append(v)
    for members in by_tier.values():
        crowded = len(members) > 12
        for v in members:
            x, y = pos[v]
            ax.scatter([x], [y], s=22, color="black", zorder=2)
            ax.text(x, y - 0.09, vertex_label(v), fontsize=5 if crowded else 7,
                    rotation=90 if crowded else 0, ha="center", va="top", zorder=4)


def topology_figure(topo: Topology, max_nodes: int = MAX_NODES) -> Any:
    """The layered drawing's Figure (positions: :func:`layered_positions` of
    :func:`drawn_vertices`)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    nodes = shown_nodes(topo.cluster.nodes, max_nodes)
    vertices = drawn_vertices(topo, nodes)
    pos = layered_positions(topo, vertices)
    fig, ax = plt.subplots(figsize=(13, 7.5))
    _draw_links(ax, pos, _link_classes(topo, vertices))
    _draw_vertices(ax, pos)
    tiers = sorted({tier_of(v) for v in vertices})
    ax.set_yticks(tiers, [TIERS[t] for t in tiers], fontsize=8)
    ax.set_ylim(min(tiers) - 0.6, max(tiers) + 0.4)
    ax.set_xlim(-0.02, 1.02)
    ax.set_xticks([])
    ax.set_ylabel("network tier (devices at the bottom)")
    ax.set_xlabel("vertices in node order (gpu N, node N: its switch, nic N.K, leaf / rail / "
                  "router, spine)")
    for side in ("top", "right", "bottom"):
        ax.spines[side].set_visible(False)
    ax.legend(title="links: achievable rate per direction", fontsize=7, title_fontsize=7,
              loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    ax.set_title(_title(topo, nodes), fontsize=10)
    fig.tight_layout()
    return fig


def draw_topology(topo: Topology, path: Path, max_nodes: int = MAX_NODES) -> Path:
    """Write the layered drawing to ``path`` (PNG)."""
    return save_figure(topology_figure(topo, max_nodes), path)
