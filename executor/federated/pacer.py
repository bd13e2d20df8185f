"""A link emulated chunk by chunk: the server's egress or ingress in a real federated run.

Transfers are cut into chunks. The link is a token bucket of ``rate`` bytes/s and every
transfer one of its own cap: a chunk may start when the link is free and its transfer's
bucket allows; it is *delivered* when both have paid for it (``max`` of the two bucket
times). A transfer's bucket banks at most one chunk of credit. Among the transfers allowed
to go, the one served least recently goes first (round robin), so transfers below their
fair share run at their caps and the rest split the link evenly: max-min fairness at the
granularity of a chunk, the fluid model the simulator uses (:mod:`sim.network.shared_link`).
A transfer with an infinite cap on an infinite link is delivered at once in one chunk (no
pacing).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

__all__ = ["Pacer"]


@dataclass
class _Flow:
    chunks: int
    chunk_bytes: list[float]  # each chunk's bytes
    cap: float
    bucket_at: float = 0.0  # when its own bucket allows the next chunk
    sent: int = 0


class Pacer:
    def __init__(self, rate: float) -> None:
        if not rate > 0:
            raise ValueError(f"rate must be positive, got {rate!r}")
        self.rate = rate
        self.free_at = 0.0
        self.flows: dict[int, _Flow] = {}
        self.order: deque[int] = deque()

    def add(self, fid: int, size: float, chunk: float, cap: float) -> int:
        """Transfer ``fid`` of ``size`` bytes in chunks of ``chunk`` bytes; its chunk count."""
        if math.isinf(cap) and math.isinf(self.rate):
            sizes = [size]
        else:
            n = max(1, math.ceil(size / chunk))
            sizes = [chunk] * (n - 1) + [size - chunk * (n - 1)]
        self.flows[fid] = _Flow(len(sizes), sizes, cap)
        self.order.append(fid)
        return len(sizes)

    def remove(self, fid: int) -> None:
        self.flows.pop(fid, None)
        if fid in self.order:
            self.order.remove(fid)

    def due(self, now: float) -> list[tuple[int, int, float]]:
        """Chunks that start now: ``(transfer, chunk index, delivered at)`` each."""
        out = []
        while self.free_at <= now + 1e-9:
            fid = next((f for f in self.order if self.flows[f].bucket_at <= now + 1e-9), None)
            if fid is None:
                break
            flow = self.flows[fid]
            size = flow.chunk_bytes[flow.sent]
            self.free_at = max(now, self.free_at) + size / self.rate
            # a transfer served late (others were ahead of it in the round) keeps one chunk
            # of credit, so one below its fair share still averages its cap
            flow.bucket_at = max(now - size / flow.cap, flow.bucket_at) + size / flow.cap
            out.append((fid, flow.sent, max(self.free_at, flow.bucket_at)))
            flow.sent += 1
            self.order.remove(fid)
            if flow.sent < flow.chunks:
                self.order.append(fid)  # to the back: round robin
        return out

    def wake_at(self) -> float:
        """When :meth:`due` may next return a chunk (``inf`` with nothing waiting)."""
        waiting = [self.flows[f].bucket_at for f in self.order]
        if not waiting:
            return math.inf
        return max(self.free_at, min(waiting))
