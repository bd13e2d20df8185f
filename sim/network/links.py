"""Per-link traffic of a DES run: bytes, utilisation and busy time of every used link.

``utilization`` is bytes / (capacity x seconds): the share of the link's capacity the run
used on average; ``busy_fraction`` the share of the time at least one flow crossed it.
A link is named ``"A->B"`` after its vertices as users write them (``gpu0->sw0``,
``nic3.0->pod0``: :func:`sim.network.topology.vertex_name`), the form ``--straggler link:`` and
``--fail-link`` take too.
"""

from __future__ import annotations

from typing import Any

from sim.network.topology import Topology, vertex_name

__all__ = ["link_table", "link_name"]


def link_name(topo: Topology, lid: int) -> str:
    u, v = topo.links[lid]
    return f"{vertex_name(u)}->{vertex_name(v)}"


def link_table(topo: Topology, link_bytes: Any, busy_s: Any, seconds: float,
               top: int | None = 10) -> list[dict[str, Any]]:
    """The used links, busiest first (ties by name); ``top=None`` keeps them all."""
    rows = []
    for i in (link_bytes > 0).nonzero()[0]:
        b = float(link_bytes[i])
        rows.append({"link": link_name(topo, int(i)), "bytes": b,
                     "utilization": b / (topo.cap[i] * seconds),
                     "busy_fraction": float(busy_s[i]) / seconds})
    rows.sort(key=lambda r: (-r["utilization"], r["link"]))
    return rows if top is None else rows[:top]
