"""A profile of the ranks a synchronisation run will use, measured on those same ranks
(so the processes share the cores as they will in the runs): what the simulator needs to
predict them (``experiments/validate_sync_cpu.py``).

- ``step_s``: one worker's local step (forward, backward, SGD step on a mini-batch), every
  worker stepping at once;
- ``p2p_s``: one message of the flat gradient from worker 0 to the first server (or to
  worker 1), one way (half a ping-pong), the other ranks idle;
- ``allreduce_s``: ``dist.all_reduce`` of the flat gradient over the workers;
- ``apply_s``: a server's ``w -= lr g`` on its shard (every server at once).

Medians over ``reps`` repetitions after ``reps // 5`` warm-up ones.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from executor.rank import progress
from executor.sync.task import load_task, mlp
from sim.spec.plan import Plan
from sim.spec.sync import architecture

__all__ = ["probe"]


def _median(fn: Callable[[], None], reps: int) -> float:
    for _ in range(reps // 5):
        fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def probe(cfg: dict[str, Any], out: Path, rank: int) -> dict[str, Any]:
    plan = Plan.from_dict(cfg["plan"])
    n, reps = plan.dp, int(cfg["probe"])
    world = dist.get_world_size()
    task = load_task(cfg["task"], cfg["seed"])
    model = mlp(task, tuple(cfg["hidden"]), cfg["seed"])
    numel = sum(p.numel() for p in model.parameters())
    workers = dist.new_group(list(range(n)))
    res: dict[str, Any] = {"rank": rank, "role": "probe", "numel": numel}
    progress(out, rank, cfg.get("stage0", 0) + 1, "probing")
    if rank < n:
        opt = torch.optim.SGD(model.parameters(), lr=cfg["lr"])
        x, y = task.shard(rank, n)
        batch = plan.global_batch_size // n

        def step() -> None:
            idx = torch.randint(0, len(x), (batch,))
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x[idx]), y[idx]).backward()
            opt.step()

        res["step_s"] = _median(step, reps)
        flat = torch.randn(numel)
        res["allreduce_s"] = _median(lambda: dist.all_reduce(flat, group=workers), reps)
    dist.barrier()
    peer = n if world > n else 1
    buf = torch.randn(numel)
    if rank == 0:
        def ping() -> None:
            dist.send(buf, dst=peer)
            dist.recv(buf, src=peer)

        res["p2p_s"] = _median(ping, reps) / 2
    elif rank == peer:
        for _ in range(reps + reps // 5):
            dist.recv(buf, src=0)
            dist.send(buf, dst=0)
    dist.barrier()
    if architecture(plan) == "ps":
        res.update(_service(cfg, plan, rank, numel, reps))
    return res


def _service(cfg: dict[str, Any], plan: Plan, rank: int, numel: int, reps: int
             ) -> dict[str, float]:
    """A server's whole handling of one push, measured on the server: parse the header,
    apply the gradient, reply with its parameters (:class:`executor.sync.server.Server`'s
    own code, asynchronous), worker 0 pushing one message at a time."""
    from executor.sync.server import HEADER, PUSH, Server

    n = plan.dp
    shard = numel // plan.communication.servers
    out: dict[str, float] = {}
    if rank >= n:
        g = torch.randn(shard)
        w = torch.randn_like(g)
        out["apply_s"] = _median(lambda: w.add_(g, alpha=-0.1), reps)
    if rank == n:
        asp = {**cfg, "plan": {**cfg["plan"], "sync": {"kind": "asp"}}}
        server = Server(asp, torch.randn(shard), n)
        buf = torch.empty(HEADER + shard)
        times = []
        for _ in range(reps + reps // 5):
            dist.recv(buf, src=0)
            t0 = time.perf_counter()
            kind, worker, tag, read = (int(x) for x in buf[:HEADER].tolist())
            server._push(worker, tag, read, buf[HEADER:])
            server._release()
            times.append(time.perf_counter() - t0)
        out["service_s"] = statistics.median(times[reps // 5:])
    elif rank == 0:
        msg = torch.cat([torch.tensor([PUSH, 0.0, 0.0, 0.0]), torch.randn(shard)])
        reply = torch.empty(HEADER + shard)
        for _ in range(reps + reps // 5):
            dist.send(msg, dst=n)
            dist.recv(reply, src=n)
    dist.barrier()
    return out
