"""The data-parallel gradient reduction as DDP's buckets run it, in closed form: one
collective a bucket, one after another, each paying its own latency
(:func:`sim.layout.inventory.layer_buckets`, the buckets the DES reduces). A bucket's dense
and expert gradients are reduced at once over their two groups (as the DES runs them):
one latency, both loads.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["bucketed_s"]

Coll = Callable[[str, str, float], float]  # (group, kind, bytes) -> seconds


def bucketed_s(coll: Coll, kind: str, buckets: list[tuple[float, float]], width: float,
               memo: dict[tuple[str, float, float], float]) -> float:
    """Seconds of ``kind`` over ``buckets`` of (dense, expert) parameters of ``width``
    bytes each; ``memo`` keeps a bucket's seconds by (kind, dense, expert)."""
    for d, e in buckets:
        if (kind, d, e) not in memo:
            dense, expert = coll("dp", kind, d * width), coll("edp", kind, e * width)
            if dense and expert:  # one latency (a collective's time less its bandwidth
                # term), never below the longer of the two (fits need not be monotone)
                dense -= min(_latency(coll, "dp", kind, d * width),
                             _latency(coll, "edp", kind, e * width), dense, expert)
            memo[kind, d, e] = dense + expert
    return sum(memo[kind, d, e] for d, e in buckets)


def _latency(coll: Coll, group: str, kind: str, size: float) -> float:
    """The size-independent part of a collective's seconds at ``size`` bytes (``2 t(s) -
    t(2 s)``: α for α + bytes/β with the algorithm the size picks, so it does not move with
    the bandwidth; a measured table need not be affine, hence the floor)."""
    return max(0.0, 2 * coll(group, kind, size) - coll(group, kind, 2 * size))
