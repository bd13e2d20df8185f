"""The network drawn in layers, shared by the topology drawing and the link heat map.

Vertices sit in rows by tier — devices at the bottom; node switches and NICs; pod (leaf),
rail or router switches; core and spine switches on top — each row ordered by node, so a
node's devices, its switch and its NICs line up. Labels are what a reader says: ``gpu 7``,
``node 2`` (its switch), ``nic 2.0``, ``leaf 0``, ``rail 0.3``, ``spine 1``, ``router 5``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, cast

from sim.network.topology import Topology

__all__ = ["TIERS", "KINDS", "KIND_NAMES", "kind_of", "tier_of", "vertex_label",
           "layered_positions"]

TIERS = ("devices", "node switches, NICs", "leaf / rail / router", "core / spine")
KINDS = ("device", "sw", "nic", "pod", "rail", "rt", "core", "spine")  # one colour each
KIND_NAMES = {"device": "gpu", "sw": "node switch", "nic": "nic", "pod": "leaf",
              "rail": "rail", "rt": "router", "core": "core", "spine": "spine"}
_TIER = {"sw": 1, "nic": 1, "pod": 2, "rail": 2, "rt": 2, "core": 3, "spine": 3}
_NAME = {"sw": "node", "nic": "nic", "pod": "leaf", "rail": "rail", "rt": "router",
         "core": "core", "spine": "spine"}


def kind_of(v: object) -> str:
    """``device`` for a device, else the vertex tuple's kind (``sw``, ``nic``, ``pod``, ...)."""
    return "device" if isinstance(v, int) else str(cast(tuple[Any, ...], v)[0])


def tier_of(v: object) -> int:
    """0 for devices, 1 node switches and NICs, 2 leaf/rail/router, 3 core and spines."""
    return 0 if isinstance(v, int) else _TIER[kind_of(v)]


def vertex_label(v: object) -> str:
    """``gpu 7``, ``node 2`` (a node's switch), ``nic 2.0``, ``leaf 0``, ``rail 0.3``,
    ``spine 1``, ``router 5``, ``core``."""
    if isinstance(v, int):
        return f"gpu {v}"
    t = cast(tuple[Any, ...], v)
    rest = ".".join(str(x) for x in t[1:])
    return f"{_NAME[kind_of(v)]} {rest}".rstrip()


def _order(topo: Topology, v: object) -> tuple[Any, ...]:
    """Position within a tier: by node (or pod), then kind and index."""
    if isinstance(v, int):
        return (v // topo.cluster.gpus_per_node, "", v)
    t = cast(tuple[Any, ...], v)  # a switch or NIC: (kind, node or pod, ...)
    if t[0] == "sw":  # a node's switch in the middle of its NICs
        return (t[1], "nic", (topo.cluster.node_nics(t[1])[1] / 2 - 0.5,))
    return (t[1] if len(t) > 1 else 0, str(t[0]), t[2:])


def layered_positions(topo: Topology, vertices: Iterable[object] | None = None
                      ) -> dict[object, tuple[float, float]]:
    """(x, y) of each vertex (default: all of the graph's): y is its tier (0 devices at the
    bottom, 3 core and spines on top), x spreads a tier's members over [0, 1] in node
    order."""
    rows: dict[int, list[object]] = {}
    for v in (topo.graph.nodes if vertices is None else vertices):
        rows.setdefault(tier_of(v), []).append(v)
    pos = {}
    for tier, members in rows.items():
        members.sort(key=lambda v: _order(topo, v))
        for i, v in enumerate(members):
            pos[v] = ((i + 0.5) / len(members), float(tier))
    return pos
