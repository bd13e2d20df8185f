"""Gossip graphs over data-parallel workers (``plan.sync.graph``): ring, 2-D torus,
exponential (peers at distances 1, 2, 4, ...) or an explicit edge list, checked connected.

>>> gossip_edges("ring", (), 4)
[(0, 1), (0, 3), (1, 2), (2, 3)]
"""

from __future__ import annotations

import math
from typing import Any

from sim.errors import SpecError

__all__ = ["gossip_edges", "MAX_GOSSIP_WORKERS"]

# Workers a gossip graph may join: far above published decentralised runs (SGP's 256 GPUs),
# low enough that building and checking the graph takes about a second.
MAX_GOSSIP_WORKERS = 16_384


def gossip_edges(graph: str, pairs: Any, n: int) -> list[tuple[int, int]]:
    """The undirected edges of the gossip graph over ``n`` workers (for ``exponential``:
    every peer a worker cycles through, at distances 1, 2, 4, ...)."""
    if n > MAX_GOSSIP_WORKERS:
        raise SpecError("plan.dp", f"gossip over {n:,} workers: at most "
                        f"{MAX_GOSSIP_WORKERS:,} (each builds and checks the whole graph)")
    edges: set[tuple[int, ...]]
    if graph == "ring":
        edges = {tuple(sorted((i, (i + 1) % n))) for i in range(n)}
    elif graph == "torus2d":
        a = max(d for d in range(1, math.isqrt(n) + 1) if n % d == 0)
        if a < 2:
            raise SpecError("plan.sync.graph", f"torus2d needs dp = rows x columns with both "
                            f">= 2, got dp = {n}")
        b = n // a
        edges = {tuple(sorted((r * b + c, r2 * b + c2))) for r in range(a) for c in range(b)
                 for r2, c2 in (((r + 1) % a, c), (r, (c + 1) % b))}
    elif graph == "exponential":
        edges = {tuple(sorted((i, (i + 2**k) % n))) for i in range(n)
                 for k in range(max(1, math.ceil(math.log2(n))))}
    else:
        edges = set(_explicit_edges(pairs, n))
    edges = {e for e in edges if e[0] != e[1]}
    _check_connected(sorted(edges), n)  # type: ignore[arg-type]
    return sorted(edges)  # type: ignore[arg-type]


def _explicit_edges(pairs: Any, n: int) -> set[tuple[int, int]]:
    if not isinstance(pairs, (list, tuple)) or not pairs:
        raise SpecError("plan.sync.edges", "graph \"edges\" needs a list of worker pairs "
                        "[[0, 1], [1, 2], ...]")
    out = set()
    for pair in pairs:
        if not isinstance(pair, tuple) or len(pair) != 2 or any(
                isinstance(w, bool) or not isinstance(w, int) for w in pair):
            raise SpecError("plan.sync.edges", f"each edge must be a pair of worker indices, "
                            f"got {list(pair) if isinstance(pair, tuple) else pair!r}")
        bad = [w for w in pair if not 0 <= w < n]
        if bad:
            raise SpecError("plan.sync.edges", f"names worker {bad[0]}, but workers are "
                            f"0..{n - 1} (dp = {n})")
        if pair[0] == pair[1]:
            raise SpecError("plan.sync.edges", f"edge {list(pair)} joins a worker to itself")
        out.add((min(pair), max(pair)))
    return out


def _check_connected(edges: list[tuple[int, int]], n: int) -> None:
    import networkx as nx  # only for gossip plans: plain ones load without it

    g = nx.Graph()
    g.add_nodes_from(range(n))
    g.add_edges_from(edges)
    parts = list(nx.connected_components(g))
    if len(parts) > 1:
        alone = min(i for part in parts if 0 not in part for i in part)
        raise SpecError("plan.sync.graph", f"the gossip graph over {n} workers is not "
                        f"connected ({len(parts)} parts; worker {alone} never reaches "
                        f"worker 0): their averages would never agree")
