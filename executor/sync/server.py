"""A parameter-server rank of a real synchronisation run (:mod:`executor.sync.worker`).

Messages are flat float32 tensors. A worker's push: ``[PUSH, worker, tag, read_version,
gradient shard...]``; its last message ``[DONE, worker, 0, 0, ...]``. The server's reply:
``[version, step, 0, 0, parameter shard...]``. The server receives from any worker
(``dist.recv`` without a source) and:

- ``asp``: applies each push at once (``w -= lr g``) and replies;
- ``ssp``: applies each push at once and replies once every worker has at least
  ``clock - staleness`` pushes applied (``clock``: the pusher's pushes so far);
- ``bsp``: sums the pushes of a step; at the ``n``-th applies their mean and replies to all;
- ``backup-workers``: a step closes at its ``n - b``-th push (fewer once workers are done);
  a push of a closed step is dropped and answered at once with the current parameters.

Staleness of a push: the updates applied between the pusher's read (the version its last
reply carried) and the push.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["Server", "PUSH", "DONE", "HEADER"]

PUSH, DONE, HEADER = 0.0, 1.0, 4


class Server:
    def __init__(self, cfg: dict[str, Any], params: torch.Tensor, workers: int) -> None:
        sync = cfg["plan"]["sync"]
        self.kind = sync["kind"]
        staleness = sync.get("staleness", 0)
        self.bound = math.inf if self.kind == "asp" or staleness == "inf" else float(staleness)
        self.backups = int(sync.get("backups", 0))
        self.lr, self.n = float(cfg["lr"]), workers
        self.w = params.clone()
        self.version, self.step = 0, 0
        self.clock = [0] * workers
        self.done: set[int] = set()
        self.pending: list[tuple[int, float]] = []  # (worker, clocks everyone needs)
        self.acc = torch.zeros_like(self.w)
        self.waiting: list[int] = []
        self.staleness: list[int] = []
        self.applied_at: list[float] = []  # monotonic time of each update
        self.busy_s = 0.0
        self.dropped = 0

    def reply(self, worker: int) -> None:
        msg = torch.cat([torch.tensor([float(self.version), float(self.step), 0.0, 0.0]),
                         self.w])
        dist.send(msg, dst=worker)

    def serve(self, tick: Callable[[], None]) -> dict[str, Any]:
        """Serve until every worker is done; ``tick()`` at most once a second (the
        launcher's progress report)."""
        buf = torch.empty(HEADER + self.w.numel())
        last = 0.0
        cpu0 = time.process_time()
        while len(self.done) < self.n:
            if time.monotonic() - last > 1.0:
                tick()
                last = time.monotonic()
            dist.recv(buf)
            kind, worker, tag, read = (int(x) for x in buf[:HEADER].tolist())
            if kind == int(DONE):
                self.done.add(worker)
            else:
                t0 = time.perf_counter()
                self._push(worker, tag, read, buf[HEADER:])
                self.busy_s += time.perf_counter() - t0
            self._close()
            self._release()
        return {"staleness": self.staleness, "applied_at": self.applied_at,
                "busy_s": self.busy_s, "cpu_s": time.process_time() - cpu0,
                "updates": self.version, "dropped": self.dropped}

    def _push(self, worker: int, tag: int, read: int, grad: torch.Tensor) -> None:
        if self.kind in ("asp", "ssp"):
            self.staleness.append(self.version - read)
            self.w.add_(grad, alpha=-self.lr)
            self._applied()
            self.clock[worker] += 1
            self.pending.append((worker, self.clock[worker] - self.bound))
        elif self.kind == "backup-workers" and tag < self.step:
            self.dropped += 1
            self.reply(worker)  # too late: start again from the newest parameters
        else:
            self.acc.add_(grad)
            self.waiting.append(worker)

    def _applied(self) -> None:
        self.version += 1
        self.applied_at.append(time.monotonic())

    def _close(self) -> None:
        """Apply a BSP or backup-workers step once enough pushes are in."""
        if self.kind not in ("bsp", "backup-workers") or not self.waiting:
            return
        need = self.n - len(self.done)
        if self.kind == "backup-workers":
            need = min(self.n - self.backups, need)
        if len(self.waiting) < need:
            return
        self.w.add_(self.acc, alpha=-self.lr / len(self.waiting))
        self.staleness += [0] * len(self.waiting)
        self._applied()
        self.step += 1
        self.acc.zero_()
        waiting, self.waiting = self.waiting, []
        for worker in waiting:
            self.reply(worker)

    def _release(self) -> None:
        if not self.pending:
            return
        low = min(self.clock)
        keep = []
        for worker, need in self.pending:
            if low >= need:
                self.reply(worker)
            else:
                keep.append((worker, need))
        self.pending = keep
