"""Asynchronous decentralised SGD (AD-PSGD, Lian et al. 2018) in the real runs
(:mod:`executor.sync.worker` runs it for ``gossip_mode = "ad-psgd"``).

After each local step a worker picks a random neighbour of the gossip graph and averages
its parameters with that neighbour's, whatever step the neighbour is at: it sends
``[REQUEST, its rank, its parameters]`` on a request group and waits for the neighbour's
parameters on a reply group; a background thread of every worker answers requests at once
(any source, so two workers asking each other cannot deadlock), and both sides keep the
pair's mean. A lock keeps each average off the worker's own forward, backward and SGD
update (the worker takes it for each; an average may land between its backward and its
update, so the update applies a gradient of the parameters before the average, as AD-PSGD
allows), and averages are written into the parameters in place. A worker
that has run its steps tells every other (``DONE``) and keeps answering until all have.
"""

from __future__ import annotations

import random
import threading
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["AsyncGossip"]

REQUEST, DONE = 0.0, 1.0
vec = torch.nn.utils.parameters_to_vector


class AsyncGossip:
    def __init__(self, worker: Any, neighbours: list[int]) -> None:
        self.w, self.neighbours = worker, neighbours
        n = worker.n
        self.requests = dist.new_group(list(range(n)))  # every rank creates both, in order
        self.replies = dist.new_group(list(range(n)))
        self.lock = threading.Lock()
        self.rng = random.Random(worker.cfg["seed"] * 7919 + worker.rank)
        self.numel = vec(worker.params).numel()
        self.done = 0
        self.swaps = 0
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        buf = torch.empty(2 + self.numel)
        while self.done < self.w.n - 1:
            src = dist.recv(buf, group=self.requests)
            if int(buf[0]) == int(DONE):
                self.done += 1
                continue
            with self.lock:
                mine = vec(self.w.params).detach().clone()
                dist.send(mine, dst=src, group=self.replies)
                _write(self.w.params, (mine + buf[2:]) / 2)
                self.swaps += 1

    def step_done(self) -> None:
        """Average with a random neighbour (after the worker's SGD update)."""
        peer = self.rng.choice(self.neighbours)
        with self.lock:
            mine = vec(self.w.params).detach().clone()
        msg = torch.cat([torch.tensor([REQUEST, float(self.w.rank)]), mine])
        dist.send(msg, dst=peer, group=self.requests)
        theirs = torch.empty(self.numel)
        dist.recv(theirs, src=peer, group=self.replies)
        with self.lock:
            now = vec(self.w.params).detach()
            # what this worker's server thread averaged in meanwhile stays in
            _write(self.w.params, now + (theirs - mine) / 2)

    def finish(self) -> None:
        msg = torch.zeros(2 + self.numel)
        msg[0], msg[1] = DONE, float(self.w.rank)
        for j in range(self.w.n):
            if j != self.w.rank:
                dist.send(msg, dst=j, group=self.requests)
        self.thread.join()


def _write(params: list[torch.Tensor], flat: torch.Tensor) -> None:
    """Copy ``flat`` into the parameters in place (the worker's lock held: no backward
    is running on them)."""
    i = 0
    with torch.no_grad():
        for p in params:
            p.copy_(flat[i:i + p.numel()].view_as(p))
            i += p.numel()
