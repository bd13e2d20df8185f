"""A worker of a real synchronisation run: its model, data shard, mini-batches and
optimizer, and how it pushes to the parameter servers and exchanges with gossip
neighbours. Shared by the runs (:mod:`executor.sync.worker`) and the profile taken on
their ranks (:mod:`executor.sync.probe`), so both run the same code.

The parameter servers hold the plan's shards of the flat parameter vector
(:func:`shard_indices`): ``sharding = "flat"`` cuts it in contiguous, nearly equal slices
(a tensor may straddle two servers); ``size-balanced`` and ``round-robin`` give each
server whole tensors, as the simulator deals them (:func:`sim.layout.sync.shard_assignment`).
"""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from executor.sync.compress import Compressor, ring_bytes
from executor.sync.server import DONE, HEADER, PUSH
from executor.sync.task import Task, build_model
from executor.sync.text import TextTask
from sim.layout.sync import shard_assignment
from sim.spec.gossip import gossip_edges
from sim.spec.plan import Plan

__all__ = ["Worker", "shard_indices", "gossip_weights", "gossip_mix", "vec"]

vec = torch.nn.utils.parameters_to_vector


def _load(params: list[torch.nn.Parameter], flat: torch.Tensor) -> None:
    """Copy ``flat`` into the parameters' own storage."""
    with torch.no_grad():
        i = 0
        for p in params:
            p.copy_(flat[i: i + p.numel()].view_as(p))
            i += p.numel()


def _optimizer(kind: str, params: list[torch.nn.Parameter], lr: float
               ) -> torch.optim.Optimizer:
    """A worker's (DiLoCo's inner) optimizer: plain SGD, or AdamW as DiLoCo trains language
    models (weight decay 0.1, betas 0.9/0.95)."""
    if kind == "sgd":
        return torch.optim.SGD(params, lr=lr)
    if kind == "adamw":
        return torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=0.1)
    raise ValueError(f"inner: must be sgd or adamw, got {kind!r}")


def shard_indices(sizes: list[int], servers: int, sharding: str) -> list[torch.Tensor]:
    """Each server's elements of the flat parameter vector (tensors of ``sizes`` in order):
    contiguous slices (``flat``) or the whole tensors the simulator deals it."""
    numel = sum(sizes)
    if sharding == "flat":
        cuts = [numel * s // servers for s in range(servers + 1)]
        return [torch.arange(a, b) for a, b in zip(cuts[:-1], cuts[1:], strict=True)]
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    return [torch.cat([torch.arange(starts[i], starts[i] + sizes[i]) for i in sorted(mine)])
            for mine in shard_assignment(sizes, servers, sharding)]


class Worker:
    def __init__(self, cfg: dict[str, Any], rank: int, task: Task | TextTask) -> None:
        self.cfg, self.rank, self.task = cfg, rank, task
        self.plan = Plan.from_dict(cfg["plan"])
        self.n = self.plan.dp
        self.model = build_model(task, tuple(cfg["hidden"]), cfg["seed"])
        self.params = list(self.model.parameters())
        self.data = task.shard(rank, self.n)
        self.batch = self.plan.global_batch_size // self.n
        self.gen = torch.Generator().manual_seed(cfg["seed"] * 7919 + rank)
        self.opt = _optimizer(cfg.get("inner", "sgd"), self.params, cfg["lr"])
        self.net: torch.nn.Module = self.model
        self.comp: Compressor | None = None
        if self.plan.compression.kind != "none":
            self.comp = Compressor(self.plan.compression, self.n, rank)
            if self.plan.compression.kind in ("fp16", "powersgd"):
                self.net = self.comp.hook_ddp(self.model)
        self.read, self.updates = 0, 0
        self.tags = [0] * max(1, self.plan.communication.servers)  # each shard's step
        comm = self.plan.communication
        self.shards = shard_indices([p.numel() for p in self.params], comm.servers,
                                    comm.sharding)
        self.log: dict[str, list[Any]] = {"step_end": [], "compute_s": [], "loss": [],
                                          "evals": [], "sent_bytes": []}

    def gradient(self) -> float:
        """Forward and backward on a fresh mini-batch of this worker's shard; a straggler
        (``cfg["straggler"]``: ``{"worker": w, "factor": f}``) then idles ``f - 1`` times
        that long, as a device ``f`` times slower would take."""
        t0 = time.perf_counter()
        x, y = self.task.sample(self.data, self.batch, self.gen)  # type: ignore[arg-type]
        self.opt.zero_grad()
        loss = F.cross_entropy(self.net(x).flatten(0, -2), y.flatten())
        loss.backward()
        slow = self.cfg.get("straggler") or {}
        if slow.get("worker") == self.rank:
            time.sleep((float(slow["factor"]) - 1.0) * (time.perf_counter() - t0))
        return float(loss.detach())

    def evaluate(self, step: int, start: float, params: torch.Tensor | None = None) -> None:
        """Test loss and accuracy of this worker's parameters, or of ``params`` (DiLoCo's
        outer, global ones)."""
        own = None
        if params is not None:  # copied in and back in place: no parameter becomes a view
            own = vec(self.params).detach().clone()
            _load(self.params, params)
        loss, acc = self.task.evaluate(self.model)
        if own is not None:
            _load(self.params, own)
        self.log["evals"].append({"step": step, "updates": self.updates,
                                  "time_s": time.monotonic() - start, "loss": loss,
                                  "accuracy": acc})

    # strategies ---------------------------------------------------------------------------
    def allreduce_step(self, k: int) -> None:
        """The workers' mean gradient, then an SGD step (compressed: a DDP hook averaged it
        in the backward, or :class:`Compressor` averages it here)."""
        if self.net is not self.model:
            assert self.comp is not None
            self.log["sent_bytes"].append(self.comp.ddp_bytes(self.model))
        else:
            flat = vec([p.grad for p in self.params])
            if self.comp is not None:
                mean, sent = self.comp.average(flat)
            else:
                dist.all_reduce(flat)
                mean, sent = flat / self.n, ring_bytes(4 * flat.numel(), self.n)
            self.log["sent_bytes"].append(sent)
            torch.nn.utils.vector_to_parameters(mean, [p.grad for p in self.params])
        self.opt.step()
        self.updates = k + 1

    def ps_step(self, k: int) -> None:
        servers = self.plan.communication.servers
        flat = vec([p.grad for p in self.params])
        msgs, replies, reqs = [], [], []
        for s, idx in enumerate(self.shards[:servers]):
            head = torch.tensor([PUSH, float(self.rank), float(self.tags[s]),
                                 float(self.read)])
            msgs.append(torch.cat([head, flat[idx]]))
            replies.append(torch.empty(HEADER + idx.numel()))
            reqs.append(dist.isend(msgs[-1], dst=self.n + s))
        for s, buf in enumerate(replies):
            dist.recv(buf, src=self.n + s)
        for req in reqs:
            req.wait()
        self.read = int(replies[0][0])
        self.tags = [int(r[1]) for r in replies]
        new = torch.empty_like(flat)
        for idx, r in zip(self.shards, replies, strict=True):
            new[idx] = r[HEADER:]
        torch.nn.utils.vector_to_parameters(new, self.params)
        self.updates = self.read

    def finish_ps(self) -> None:
        for s, idx in enumerate(self.shards):
            msg = torch.zeros(HEADER + idx.numel())
            msg[0], msg[1] = DONE, float(self.rank)
            dist.send(msg, dst=self.n + s)


def gossip_weights(plan: Plan, rank: int) -> dict[int, float]:
    """Metropolis-Hastings mixing weights of ``rank``'s neighbours (itself: the rest)."""
    edges = gossip_edges(plan.sync.graph, plan.sync.edges, plan.dp)
    degree = [0] * plan.dp
    for a, b in edges:
        degree[a] += 1
        degree[b] += 1
    return {(b if a == rank else a): 1.0 / (1 + max(degree[a], degree[b]))
            for a, b in edges if rank in (a, b)}


def gossip_mix(w: Worker, weights: dict[int, float]) -> None:
    mine = vec(w.params)
    bufs = {j: torch.empty_like(mine) for j in weights}
    reqs = [dist.isend(mine, dst=j) for j in weights] + [dist.irecv(bufs[j], src=j)
                                                         for j in weights]
    for r in reqs:
        r.wait()
    mixed = mine * (1.0 - sum(weights.values()))
    for j, x in bufs.items():
        mixed += weights[j] * x
    torch.nn.utils.vector_to_parameters(mixed, w.params)
