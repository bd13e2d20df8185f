"""The server of a real federated run: each round it assigns the sampled clients to their
processes, sends the model down through its emulated egress, grants upload credits through
its emulated ingress (:class:`executor.federated.pacer.Pacer`, both max-min fair with each
client's own caps), and averages the first ``K`` updates that arrive (weighted by the
clients' samples). The round ends at the K-th arrival (or the deadline); the clients still
out are stopped (their downloads finished at once, so no message is left half-sent), and
the server waits until every assignment has reported before the next round.

Times are ``time.perf_counter()`` of this process; a round's ``collect_s`` runs from its
start (the assignments sent) to the K-th update delivered, as the simulator's does.
"""

from __future__ import annotations

import heapq
import math
import time
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from executor.federated.pacer import Pacer
from executor.federated.protocol import (
    ASSIGN,
    CTRL,
    DONE,
    DOWN,
    HEAD,
    MAX_ASSIGN,
    STOP,
    UP,
    chunks,
    watch,
)

__all__ = ["Server"]

POLL_S = 2e-4


class _Round:
    """The state of one round's assignments."""

    def __init__(self, clients: list[int], host: dict[int, int]) -> None:
        self.clients = clients
        self.queue: dict[int, list[int]] = {}  # process -> its clients, in order
        for c in clients:
            self.queue.setdefault(host[c], []).append(c)
        self.state = {c: "queued" for c in clients}
        self.heads: dict[int, tuple[torch.Tensor, Any]] = {}  # client -> (buffer, work)
        self.ups: list[tuple[int, int, Any, float]] = []  # (client, chunk, work, deliver)
        self.sent_down = {c: 0 for c in clients}
        self.arrived: dict[int, float] = {}
        self.samples: dict[int, int] = {}
        self.compute_s: dict[int, float] = {}
        self.down_done: dict[int, float] = {}
        self.works: list[Any] = []


class Server:
    def __init__(self, cfg: dict[str, Any], model: torch.nn.Module, host: dict[int, int]
                 ) -> None:
        self.cfg, self.model, self.host = cfg, model, host
        self.params = list(model.parameters())
        self.flat = torch.cat([p.detach().reshape(-1) for p in self.params])
        self.bounds = chunks(len(self.flat), cfg["chunk_bytes"], cfg["paced"])
        self.updates = {c: torch.empty(len(self.flat)) for c in host}
        self.caps = {c["id"]: c for c in cfg["clients"]}
        self.processes = sorted(set(host.values()))

    def run_round(self, r: int, clients: list[int]) -> dict[str, Any]:
        cfg = self.cfg
        rd = _Round(clients, self.host)
        down, up = Pacer(cfg["server"]["egress_Bps"]), Pacer(cfg["server"]["ingress_Bps"])
        timed: list[tuple[float, int, int]] = []  # (deliver at, client, chunk) downloads
        t0 = time.perf_counter()
        for p in self.processes:
            mine = rd.queue.get(p, [])
            head = torch.zeros(2 + MAX_ASSIGN, dtype=torch.int64)
            head[0], head[1] = r, len(mine)
            head[2:2 + len(mine)] = torch.tensor(mine, dtype=torch.int64)
            dist.send(head, dst=p, tag=ASSIGN)
        for p in rd.queue:
            self._start(rd, rd.queue[p][0], down, t0)
        keep = min(cfg["clients_per_round"], len(clients))
        stop_at = t0 + cfg["deadline_s"] if cfg["deadline_s"] > 0 else math.inf
        end = self._loop(rd, down, up, timed, t0, keep, stop_at)
        collect = end - t0
        t_agg = time.perf_counter()
        used = sorted(rd.arrived, key=lambda c: rd.arrived[c])[:keep]
        self._aggregate(rd, used)
        agg = time.perf_counter() - t_agg
        self._close(rd)
        return {"round": r, "sampled": clients, "used": used, "collect_s": collect,
                "aggregate_s": agg, "duration_s": collect + agg,
                "close_s": time.perf_counter() - t0 - collect - agg,
                "arrival_s": {str(c): rd.arrived[c] - t0 for c in rd.arrived},
                "download_s": {str(c): t - t0 for c, t in rd.down_done.items()},
                "compute_s": {str(c): v for c, v in rd.compute_s.items()}}

    def _start(self, rd: _Round, c: int, down: Pacer, now: float) -> None:
        """Client ``c`` is its process's current one: its download joins the egress."""
        rd.state[c] = "down"
        down.add(c, 4.0 * len(self.flat), self.cfg["chunk_bytes"],
                 self.caps[c]["down_Bps"])
        del now  # the pacer starts it at its next call

    def _loop(self, rd: _Round, down: Pacer, up: Pacer, timed: list, t0: float, keep: int,
              stop_at: float) -> float:
        while True:
            now = time.perf_counter()
            for c, k, at in down.due(now):
                heapq.heappush(timed, (at, c, k))
            while timed and timed[0][0] <= now:
                at, c, k = heapq.heappop(timed)
                self._send_down(rd, c, k, at)
            for c, k, at in up.due(now):
                self._credit(rd, c, k, at)
            self._heads(rd, up, now)
            self._uploads(rd, down, now)
            done = sorted(rd.arrived.values())
            if len(done) >= keep:
                return done[keep - 1]
            if now >= stop_at:
                return stop_at
            if all(s in ("done", "stopped") for s in rd.state.values()):
                return max(done) if done else now
            wake = min(down.wake_at(), up.wake_at(), timed[0][0] if timed else math.inf,
                       now + POLL_S)
            time.sleep(max(0.0, wake - time.perf_counter()))

    def _send_down(self, rd: _Round, c: int, k: int, at: float) -> None:
        a, b = self.bounds[k]
        rd.works.append(dist.isend(self.flat[a:b].contiguous(), dst=self.host[c], tag=DOWN))
        rd.sent_down[c] = k + 1
        if k == len(self.bounds) - 1:
            rd.state[c] = "compute"
            rd.down_done[c] = at
            buf = torch.zeros(4, dtype=torch.int64)
            rd.heads[c] = (buf, watch(dist.irecv(buf, src=self.host[c], tag=HEAD)))

    def _credit(self, rd: _Round, c: int, k: int, at: float) -> None:
        p = self.host[c]
        rd.works.append(dist.isend(torch.tensor([k], dtype=torch.int64), dst=p, tag=CTRL))
        a, b = self.bounds[k]
        work = watch(dist.irecv(self.updates[c][a:b], src=p, tag=UP))
        rd.ups.append((c, k, work, at))

    def _heads(self, rd: _Round, up: Pacer, now: float) -> None:
        for c, (buf, work) in list(rd.heads.items()):
            if rd.state[c] != "compute" or not work.done():
                continue
            _, ok, samples, compute_us = buf.tolist()
            rd.compute_s[c] = compute_us / 1e6
            rd.samples[c] = samples
            if ok:
                rd.state[c] = "up"
                up.add(c, 4.0 * len(self.flat), self.cfg["chunk_bytes"],
                       self.caps[c]["up_Bps"])
            else:
                rd.state[c] = "stopped"

    def _uploads(self, rd: _Round, down: Pacer, now: float) -> None:
        last = len(self.bounds) - 1
        still = []
        for c, k, work, at in rd.ups:
            if not work.done():
                still.append((c, k, work, at))
            elif k == last:
                if now < at:  # bytes in, but the emulated link delivers them at `at`
                    still.append((c, k, work, at))
                    continue
                rd.arrived[c] = at
                rd.state[c] = "done"
                rd.works.append(dist.isend(torch.tensor([DONE], dtype=torch.int64),
                                           dst=self.host[c], tag=CTRL))
                self._next_of(rd, c, down, now)
        rd.ups = still

    def _next_of(self, rd: _Round, c: int, down: Pacer, now: float) -> None:
        """The process of ``c`` is free: its next queued client starts downloading."""
        q = rd.queue[self.host[c]]
        i = q.index(c)
        if i + 1 < len(q):
            self._start(rd, q[i + 1], down, now)

    def _aggregate(self, rd: _Round, used: list[int]) -> None:
        if not used:
            return
        w = np.array([rd.samples[c] for c in used], dtype=float)
        w /= w.sum()
        new = sum(float(wi) * self.updates[c] for wi, c in zip(w, used, strict=True))
        self.flat = torch.as_tensor(new).clone()
        start = 0
        for p in self.params:
            p.data.copy_(self.flat[start:start + p.numel()].view_as(p))
            start += p.numel()

    def _close(self, rd: _Round) -> None:
        """Stop every assignment still out, in each process's order, and wait for all."""
        for c, k, work, _ in rd.ups:
            work.result()
            if k == len(self.bounds) - 1 and rd.state[c] == "up":
                rd.state[c] = "done"
                rd.works.append(dist.isend(torch.tensor([DONE], dtype=torch.int64),
                                           dst=self.host[c], tag=CTRL))
        for q in rd.queue.values():
            for c in q:
                if rd.state[c] in ("done", "stopped"):
                    if c in rd.heads:
                        rd.heads[c][1].result()
                    continue
                self._stop(rd, c)
        for w in rd.works:
            w.wait()

    def _stop(self, rd: _Round, c: int) -> None:
        p = self.host[c]
        for k in range(rd.sent_down[c], len(self.bounds)):  # the rest of its download
            a, b = self.bounds[k]
            rd.works.append(dist.isend(self.flat[a:b].contiguous(), dst=p, tag=DOWN))
        if c not in rd.heads:
            buf = torch.zeros(4, dtype=torch.int64)
            rd.heads[c] = (buf, watch(dist.irecv(buf, src=p, tag=HEAD)))
        rd.works.append(dist.isend(torch.tensor([STOP], dtype=torch.int64), dst=p, tag=CTRL))
        rd.heads[c][1].result()
        rd.state[c] = "stopped"

    def finish(self) -> None:
        for p in self.processes:
            head = torch.zeros(2 + MAX_ASSIGN, dtype=torch.int64)
            head[0] = -1
            dist.send(head, dst=p, tag=ASSIGN)
