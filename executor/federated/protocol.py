"""What the server and the client processes of a real federated run say to each other.

Every message is a tensor on gloo point-to-point, told apart by its tag:

- ``ASSIGN`` (server -> process, once a round): ``[round, n, client ids...]``; round -1 ends;
- ``DOWN`` (server -> process): the model, chunk by chunk, each sent when the emulated egress
  has delivered it;
- ``CTRL`` (server -> process): for the client being served, ``k >= 0`` "send upload chunk
  k", ``STOP`` "the round is over without you", ``DONE`` "your update is in"; exactly one of
  the last two ends each assignment;
- ``HEAD`` (process -> server, once an assignment): ``[client, status, samples, compute
  microseconds]``, status 1 ready to upload, 0 aborted;
- ``UP`` (process -> server): the client's model, chunk by chunk, each after its credit.

A process serves its assigned clients one after another; a chunk boundary is the same on
both sides (:func:`chunks`).
"""

from __future__ import annotations

import math
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

__all__ = ["ASSIGN", "DOWN", "CTRL", "HEAD", "UP", "STOP", "DONE", "MAX_ASSIGN", "chunks",
           "watch"]

_WAITERS = ThreadPoolExecutor(max_workers=64, thread_name_prefix="fl-wait")


def watch(work: Any) -> Future:
    """A future done when a gloo point-to-point ``work`` is: gloo's ``is_completed()``
    stays False until someone calls ``wait()``, so a pool thread waits for it."""
    return _WAITERS.submit(work.wait)

ASSIGN, DOWN, CTRL, HEAD, UP = 1, 2, 3, 4, 5
STOP, DONE = -1, -2
MAX_ASSIGN = 256  # clients one process may serve in a round


def chunks(elems: int, chunk_bytes: float, paced: bool) -> list[tuple[int, int]]:
    """``[start, end)`` of each chunk of a flat fp32 model of ``elems`` values."""
    if not paced:
        return [(0, elems)]
    per = max(1, int(chunk_bytes // 4))
    return [(a, min(a + per, elems)) for a in range(0, elems, per)] or [(0, 0)]


def paced(cfg: dict) -> bool:
    """Whether the run emulates links (any finite rate), else transfers go at once."""
    rates = [cfg["server"]["ingress_Bps"], cfg["server"]["egress_Bps"]]
    rates += [r for c in cfg["clients"] for r in (c["up_Bps"], c["down_Bps"])]
    return any(math.isfinite(r) for r in rates)
