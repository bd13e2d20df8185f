"""A profile of the ranks a synchronisation run will use, measured on those same ranks and
under the runs' own concurrency (every worker doing the same thing at once, as nccl-tests
times a collective over all its ranks): what the simulator needs to predict them
(``experiments/validate_sync_cpu.py``). Each primitive runs the real loop's own code
(:mod:`executor.sync.worker`, :mod:`executor.sync.server`).

- ``step_s``: one worker's whole local step as ``_worker_loop`` does it (mini-batch,
  forward, backward, SGD step unless the plan's servers step, its bookkeeping), every
  worker stepping at once;
  ``step_samples_s``: every such step's time (the spread: a descheduled worker's step
  takes a scheduler time slice longer);
- ``allreduce_s``: BSP's reduction (flatten, ``dist.all_reduce`` over the workers, unflatten),
  every worker at once;
- ``exchange_s``: a gossip neighbour exchange (``_gossip``'s: the parameters to every
  neighbour of the plan's graph, a ring unless the plan gossips, theirs back, the mix),
  every worker at once;
- ``p2p_s``: one message of the flat gradient between a worker and the first server (or the
  next worker), one way (half a ping-pong), the other workers stepping; each worker in turn;
- ``service_s`` (parameter servers): a server's whole handling of one push with its own code
  (receive from any worker, apply, reply: the mean time between its replies), every worker
  pushing to every shard back to back (as ``Worker.ps_step``), so that it is never idle;
  ``handling_s``: the part from the push's arrival to the reply sent; ``push_s``: a
  worker's whole push and pull of every shard under that load (for reference).

Means (throughput is a mean quantity) over ``reps`` repetitions after ``reps // 5`` warm-up
ones; ``step_samples_s`` keeps the repetitions themselves. Beside each wall time, the CPU
seconds the rank spent on it (``step_cpu_s``, ``allreduce_cpu_s``, ``exchange_cpu_s``,
``push_cpu_s``; a server's ``serve_cpu_s`` a push: ``time.process_time``, its gloo threads
included) and the cores this process may run on (``host_cores``): the simulator's host cap
(:func:`sim.strategies.host.host_cap`) needs what every rank costs the shared cores.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from executor.rank import progress
from executor.sync.replica import Worker, gossip_mix, gossip_weights, shard_indices, vec
from executor.sync.server import HEADER, Server
from executor.sync.task import build_model, load_task
from sim.spec.plan import Plan
from sim.spec.sync import architecture

__all__ = ["probe", "host_cores"]

LOAD_S = 0.5  # how long the other workers step while one times a message


def host_cores() -> float:
    """The cores this process may run on: its CPU affinity (``os.cpu_count()`` where the
    platform has none), or its cgroup v2 quota (``cpu.max`` of the group
    ``/proc/self/cgroup`` names, else the root's) below that."""
    try:
        n = float(len(os.sched_getaffinity(0)))
    except AttributeError:
        n = float(os.cpu_count() or 1)
    root = Path("/sys/fs/cgroup")
    try:
        group = next((line.split("::", 1)[1].strip() for line in
                      Path("/proc/self/cgroup").read_text().splitlines()
                      if line.startswith("0::")), "/")
    except OSError:
        group = "/"
    for where in (root / group.lstrip("/"), root):
        try:
            quota, period = (where / "cpu.max").read_text().split()[:2]
            if quota != "max":
                n = min(n, max(1.0, int(quota) / int(period)))
        except (OSError, ValueError):
            continue
        break
    return n


def _times(fn: Callable[[], None], reps: int) -> tuple[list[float], float]:
    """Each repetition's wall time, and the mean CPU seconds of one."""
    for _ in range(reps // 5):
        fn()
    times = []
    cpu0 = time.process_time()
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times, (time.process_time() - cpu0) / reps


def _mean(fn: Callable[[], None], reps: int) -> tuple[float, float]:
    """(mean wall seconds, mean CPU seconds) of one repetition."""
    times, cpu = _times(fn, reps)
    return statistics.fmean(times), cpu


def _replica(cfg: dict[str, Any], rank: int) -> Worker:
    """A worker as the runs build it (:class:`executor.sync.replica.Worker`)."""
    return Worker(cfg, rank, load_task(cfg["task"], cfg["seed"]))


def _local_step(w: Worker, sgd: bool = True) -> Callable[[], None]:
    """``_worker_loop``'s local step: its gradient, the SGD step (not a parameter-server
    worker's: its server steps), its bookkeeping."""
    def step() -> None:
        t0 = time.monotonic()
        w.log["loss"].append(w.gradient())
        w.log["compute_s"].append(time.monotonic() - t0)
        if sgd:
            w.opt.step()
        w.log["step_end"].append(time.monotonic())
    return step


def _reduction(w: Worker, group: Any) -> Callable[[], None]:
    """``Worker.allreduce_step`` without its SGD step (an all-reduce plan's local step
    has it)."""
    for p in w.params:
        p.grad = torch.zeros_like(p)

    def reduce() -> None:
        flat = vec([p.grad for p in w.params])
        dist.all_reduce(flat, group=group)
        torch.nn.utils.vector_to_parameters(flat / w.n, [p.grad for p in w.params])
    return reduce


def _gossip_plan(plan: Plan) -> Plan:
    if plan.sync.kind == "gossip":
        return plan
    d = plan.to_dict()
    d["sync"], d["communication"] = {"kind": "gossip", "graph": "ring"}, {}
    return Plan.from_dict(d)


def _workers(cfg: dict[str, Any], plan: Plan, rank: int, reps: int) -> dict[str, Any]:
    n = plan.dp
    group = dist.new_group(list(range(n)))
    res: dict[str, Any] = {}
    token = torch.zeros(1)
    if rank >= n:  # a server waits in a blocking receive (a collective's wait takes a core)
        dist.recv(token, src=0)
        return res
    w = _replica(cfg, rank)
    samples, res["step_cpu_s"] = _times(_local_step(w, architecture(plan) != "ps"), reps)
    res["step_s"], res["step_samples_s"] = statistics.fmean(samples), samples
    res["allreduce_s"], res["allreduce_cpu_s"] = _mean(_reduction(w, group), reps)
    weights = gossip_weights(_gossip_plan(plan), rank)
    res["exchange_s"], res["exchange_cpu_s"] = _mean(lambda: gossip_mix(w, weights), reps)
    if rank == 0:
        for server in range(n, dist.get_world_size()):
            dist.send(token, dst=server)
    return res


def probe(cfg: dict[str, Any], out: Path, rank: int) -> dict[str, Any]:
    plan = Plan.from_dict(cfg["plan"])
    reps = int(cfg["probe"])
    numel = sum(p.numel() for p in build_model(load_task(cfg["task"], cfg["seed"]),
                                       tuple(cfg["hidden"]), cfg["seed"]).parameters())
    res: dict[str, Any] = {"rank": rank, "role": "probe", "numel": numel,
                           "host_cores": host_cores()}
    progress(out, rank, cfg.get("stage0", 0) + 1, "probing")
    res.update(_workers(cfg, plan, rank, reps))
    dist.barrier()
    res.update(_message(cfg, plan, rank, numel))
    dist.barrier()
    if architecture(plan) == "ps":
        res.update(_service(cfg, plan, rank, reps))
    return res


def _message(cfg: dict[str, Any], plan: Plan, rank: int, numel: int) -> dict[str, float]:
    """Half a ping-pong of the flat gradient between each worker in turn and the first
    server (or the next worker) while the other workers step (the runs keep the cores busy;
    on an idle host a message also pays for waking an idle core). Where the kernel places
    the processes moves a message's time several-fold, so every worker takes a turn."""
    n, world = plan.dp, dist.get_world_size()
    out = []
    for w in range(n):
        peer = n if world > n else (w + 1) % n
        if rank == w:
            out.append(_ping(peer, numel))
        elif rank == peer:
            _echo(w, numel)
        elif rank < n:
            step = _local_step(_replica(cfg, rank), architecture(plan) != "ps")
            end = time.monotonic() + LOAD_S
            while time.monotonic() < end:
                step()
        dist.barrier()
    return {"p2p_s": statistics.fmean(out)} if out else {}


def _ping(peer: int, numel: int) -> float:
    """Ping-pongs with ``peer`` for most of ``LOAD_S`` (the first fifth a warm-up), then a
    stop (``buf[0] = 1``); half the mean round trip."""
    buf = torch.randn(numel)
    buf[0] = 0.0
    times: list[float] = []
    start = time.monotonic()
    while time.monotonic() - start < 0.8 * LOAD_S:
        t0 = time.perf_counter()
        dist.send(buf, dst=peer)
        dist.recv(buf, src=peer)
        if time.monotonic() - start > 0.16 * LOAD_S:
            times.append(time.perf_counter() - t0)
    buf[0] = 1.0
    dist.send(buf, dst=peer)
    return statistics.fmean(times) / 2


def _echo(src: int, numel: int) -> None:
    buf = torch.empty(numel)
    while True:
        dist.recv(buf, src=src)
        if buf[0] == 1.0:
            return
        dist.send(buf, dst=src)


def _service(cfg: dict[str, Any], plan: Plan, rank: int, reps: int) -> dict[str, float]:
    """Every worker pushes to every shard and pulls back to back (as ``Worker.ps_step``);
    each server receives from any worker and answers with its own code, asynchronously
    (as ASP), never idle: the mean time between its replies is its whole handling of one push
    (receive from any worker, apply, reply)."""
    n, pushes = plan.dp, reps + reps // 5
    asp = {**cfg, "plan": {**cfg["plan"], "sync": {"kind": "asp"}}}
    out: dict[str, float] = {}
    if rank >= n:
        model = build_model(load_task(cfg["task"], cfg["seed"]), tuple(cfg["hidden"]), cfg["seed"])
        flat = vec(model.parameters()).detach()
        comm = plan.communication
        idx = shard_indices([p.numel() for p in model.parameters()], comm.servers,
                            comm.sharding)[rank - n]
        server = Server(asp, flat[idx], n)
        buf = torch.empty(HEADER + idx.numel())
        handling, ends = [], []
        warm = n * (reps // 5)
        cpu0 = time.process_time()
        for i in range(n * pushes):
            if i == warm:
                cpu0 = time.process_time()
            dist.recv(buf)
            t0 = time.perf_counter()
            _, worker, tag, read = (int(x) for x in buf[:HEADER].tolist())
            server._push(worker, tag, read, buf[HEADER:])
            server._release()
            ends.append(time.perf_counter())
            handling.append(ends[-1] - t0)
        out["handling_s"] = statistics.fmean(handling[warm:])
        out["service_s"] = (ends[-1] - ends[warm]) / (len(ends) - 1 - warm)
        out["serve_cpu_s"] = (time.process_time() - cpu0) / (len(ends) - warm)
    else:
        w = _replica(asp, rank)
        w.gradient()
        out["push_s"], out["push_cpu_s"] = _mean(lambda: w.ps_step(0), reps)
    dist.barrier()
    return out
