"""FedBuff for real (Nguyen et al., AISTATS 2022): asynchronous, buffered federated training.

Every client process trains one client at a time, so ``concurrency`` is the number of
processes. The server hands each free process a client (sampled among those no process is
training) and the current model; the process trains it and sends back its delta with the
model version it started from. The server adds the delta to a buffer; once ``buffer`` deltas
are in it applies ``x += server_lr * mean(delta_i / sqrt(1 + s_i))`` (``s_i``: the
server steps since that client's download, the paper's staleness scaling) and counts a
server step. Links are not emulated here (these runs measure steps to an accuracy, not
time). Messages: ``ASSIGN`` ``[job, client, version]`` (job -1 ends), ``DOWN`` the model,
``HEAD`` ``[client, samples, version]``, ``UP`` the delta.
"""

from __future__ import annotations

import math
import random
import time
from typing import Any

import torch
import torch.distributed as dist

from executor.federated.protocol import ASSIGN, DOWN, HEAD, UP, watch

__all__ = ["fedbuff_server", "fedbuff_client"]


def _flat(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def _load(model: torch.nn.Module, flat: torch.Tensor) -> None:
    start = 0
    for p in model.parameters():
        p.data.copy_(flat[start:start + p.numel()].view_as(p))
        start += p.numel()


class _Server:
    def __init__(self, cfg: dict[str, Any], model: torch.nn.Module, task: Any) -> None:
        self.cfg, self.model, self.task = cfg, model, task
        self.x = _flat(model)
        self.version, self.buffer = 0, []
        self.rng = random.Random(cfg["seed"])
        self.busy: dict[int, int] = {}  # process -> client it trains
        self.heads: dict[int, tuple[torch.Tensor, Any]] = {}
        self.steps: list[dict[str, Any]] = []
        self.t0 = time.perf_counter()

    def dispatch(self, p: int) -> None:
        free = [c for c in range(self.cfg["population"]) if c not in self.busy.values()]
        c = self.rng.choice(free)
        self.busy[p] = c
        dist.send(torch.tensor([1, c, self.version], dtype=torch.int64), dst=p, tag=ASSIGN)
        dist.send(self.x, dst=p, tag=DOWN)
        buf = torch.zeros(3, dtype=torch.int64)
        self.heads[p] = (buf, watch(dist.irecv(buf, src=p, tag=HEAD)))

    def receive(self, p: int) -> None:
        buf, _ = self.heads.pop(p)
        _, samples, v = buf.tolist()
        delta = torch.empty_like(self.x)
        dist.recv(delta, src=p, tag=UP)
        del self.busy[p]
        stale = self.version - v
        self.buffer.append((delta / math.sqrt(1 + stale), stale))
        if len(self.buffer) >= self.cfg["buffer"]:
            self.apply()

    def apply(self) -> None:
        used, self.buffer = self.buffer[:self.cfg["buffer"]], self.buffer[self.cfg["buffer"]:]
        self.x = self.x + self.cfg["server_lr"] * torch.stack([d for d, _ in used]).mean(0)
        self.version += 1
        row = {"round": self.version - 1, "staleness_mean": sum(s for _, s in used) / len(used),
               "end_s": time.perf_counter() - self.t0}
        if self.cfg["eval_every"] and self.version % self.cfg["eval_every"] == 0:
            _load(self.model, self.x)
            row["test_loss"], row["accuracy"] = self.task.evaluate(self.model)
        self.steps.append(row)


def fedbuff_server(cfg: dict[str, Any], model: torch.nn.Module, task: Any,
                   processes: list[int], on_step: Any = None) -> list[dict[str, Any]]:
    s = _Server(cfg, model, task)
    for p in processes:
        s.dispatch(p)
    while s.version < cfg["rounds"]:
        ready = [p for p, (_, w) in s.heads.items() if w.done()]
        if not ready:
            time.sleep(2e-4)
            continue
        for p in ready:
            s.receive(p)
            if on_step:
                on_step(s.version)
            if s.version < cfg["rounds"]:
                s.dispatch(p)
    for p in list(s.heads):  # drain: the updates still out are discarded
        s.heads[p][1].result()
        s.receive(p)
    for p in processes:
        dist.send(torch.tensor([-1, 0, 0], dtype=torch.int64), dst=p, tag=ASSIGN)
    return s.steps[:cfg["rounds"]]


def fedbuff_client(cfg: dict[str, Any], model: torch.nn.Module,
                   data: dict[int, tuple[torch.Tensor, torch.Tensor]]) -> dict[str, Any]:
    import torch.nn.functional as F

    gen = torch.Generator().manual_seed(cfg["seed"] * 1000 + dist.get_rank())
    x = _flat(model)
    xs, ys = data[0]  # warm torch up (its first backward and optimizer step take ~1 s) so
    F.cross_entropy(model(xs[:8]), ys[:8]).backward()  # no process lags the others' first
    model.zero_grad()  # jobs; a step on zero gradients leaves plain SGD's weights as they are
    torch.optim.SGD(model.parameters(), lr=cfg["lr"]).step()
    jobs = 0
    while True:
        head = torch.zeros(3, dtype=torch.int64)
        dist.recv(head, src=0, tag=ASSIGN)
        job, c, v = head.tolist()
        if job < 0:
            return {"served": jobs}
        dist.recv(x, src=0, tag=DOWN)
        _load(model, x)
        xs, ys = data[c]
        opt = torch.optim.SGD(model.parameters(), lr=cfg["lr"])
        for _ in range(cfg["local_epochs"]):
            order = torch.randperm(len(xs), generator=gen)
            for i in range(0, len(xs), cfg["batch_size"]):
                idx = order[i:i + cfg["batch_size"]]
                loss = F.cross_entropy(model(xs[idx]), ys[idx])
                opt.zero_grad()
                loss.backward()
                opt.step()
        dist.send(torch.tensor([c, len(xs), v], dtype=torch.int64), dst=0, tag=HEAD)
        dist.send(_flat(model) - x, dst=0, tag=UP)
        jobs += 1
