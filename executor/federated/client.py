"""A client process of a real federated run: serves the clients the server assigns it, one
after another: receives the model, trains locally (FedAvg, or FedProx's proximal term),
reports, and uploads its model chunk by chunk as the server grants credits
(:mod:`executor.federated.protocol`)."""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from executor.federated.protocol import (
    ASSIGN,
    CTRL,
    DONE,
    DOWN,
    HEAD,
    MAX_ASSIGN,
    UP,
    chunks,
    watch,
)

__all__ = ["ClientProcess"]

POLL_S = 2e-4


class ClientProcess:
    def __init__(self, cfg: dict[str, Any], model: torch.nn.Module,
                 data: dict[int, tuple[torch.Tensor, torch.Tensor]]) -> None:
        self.cfg, self.model, self.data = cfg, model, data
        self.params = list(model.parameters())
        self.elems = sum(p.numel() for p in self.params)
        self.bounds = chunks(self.elems, cfg["chunk_bytes"], cfg["paced"])
        self.gen = torch.Generator().manual_seed(cfg["seed"] * 1000 + dist.get_rank())

    def serve(self) -> dict[str, Any]:
        served = 0
        while True:
            head = torch.zeros(2 + MAX_ASSIGN, dtype=torch.int64)
            dist.recv(head, src=0, tag=ASSIGN)
            if int(head[0]) < 0:
                return {"served": served}
            for c in head[2:2 + int(head[1])].tolist():
                self._one(int(c))
                served += 1

    def _one(self, client: int) -> None:
        ctrl = torch.zeros(1, dtype=torch.int64)
        work = watch(dist.irecv(ctrl, src=0, tag=CTRL))
        flat = torch.empty(self.elems)
        for a, b in self.bounds:
            dist.recv(flat[a:b], src=0, tag=DOWN)
        t = time.perf_counter()
        ok = self._train(client, flat, work)
        compute_us = int((time.perf_counter() - t) * 1e6)
        x, _ = self.data[client]
        dist.send(torch.tensor([client, int(ok), len(x), compute_us]), dst=0, tag=HEAD)
        if not ok:  # stopped while training: the STOP consumed the control message
            return
        mine = torch.cat([p.detach().reshape(-1) for p in self.params])
        while True:
            work.result()
            k = int(ctrl[0])
            if k < 0:
                return  # STOP or DONE
            ctrl = torch.zeros(1, dtype=torch.int64)
            work = watch(dist.irecv(ctrl, src=0, tag=CTRL))
            a, b = self.bounds[k]
            dist.send(mine[a:b].contiguous(), dst=0, tag=UP)
            if k == len(self.bounds) - 1:
                work.result()
                assert int(ctrl[0]) == DONE, f"expected DONE after the last chunk, got {ctrl}"
                return

    def _train(self, client: int, flat: torch.Tensor, ctrl: Any) -> bool:
        """Local epochs from the received model; False if the server stopped it."""
        cfg = self.cfg
        start = 0
        for p in self.params:
            p.data.copy_(flat[start:start + p.numel()].view_as(p))
            start += p.numel()
        anchor = [p.detach().clone() for p in self.params] if cfg["mu"] > 0 else None
        x, y = self.data[client]
        opt = torch.optim.SGD(self.params, lr=cfg["lr"])
        batch = cfg["batch_size"]
        for _ in range(cfg["local_epochs"]):
            order = torch.randperm(len(x), generator=self.gen)
            for i in range(0, len(x), batch):
                if ctrl.done():
                    return False
                idx = order[i:i + batch]
                loss = F.cross_entropy(self.model(x[idx]), y[idx])
                if anchor is not None:
                    loss = loss + cfg["mu"] / 2 * sum(
                        ((p - a) ** 2).sum() for p, a in zip(self.params, anchor, strict=True))
                opt.zero_grad()
                loss.backward()
                opt.step()
        return True

    def probe(self, passes: int = 3) -> dict[int, float]:
        """Milliseconds of local training per sample of each of its clients (one pass of
        warm-up, then the median of ``passes``), its model left as it was."""
        saved = [p.detach().clone() for p in self.params]
        never = _Never()
        flat = torch.cat([s.reshape(-1) for s in saved])
        out = {}
        for c, (x, _) in self.data.items():
            times = []
            for i in range(passes + 1):
                t = time.perf_counter()
                self._train(c, flat, never)
                if i:
                    times.append((time.perf_counter() - t) / (len(x) * self.cfg["local_epochs"]))
            out[c] = sorted(times)[len(times) // 2] * 1e3
        for p, s in zip(self.params, saved, strict=True):
            p.data.copy_(s)
        return out


class _Never:
    def done(self) -> bool:
        return False
