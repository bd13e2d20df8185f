"""One rank of a real synchronisation run; started by torchrun (:mod:`executor.sync.launch`).

``python -m executor.sync.worker CONFIG.json``. Ranks ``0..dp-1`` are workers, the rest
parameter servers (:mod:`executor.sync.server`). Every worker trains the task's model
(:func:`executor.sync.task.build_model`) with plain SGD (``inner = "adamw"``: AdamW) on its
own shard and synchronises as ``plan.sync`` says:

- ``bsp`` over all-reduce: the mean gradient (``dist.all_reduce``, or compressed as
  ``plan.compression`` says: :mod:`executor.sync.compress`) every step; over servers,
  and ``asp``, ``ssp``, ``backup-workers``: push the gradient's shards, pull the parameters;
- ``local-sgd``: BSP for the warm-up steps, then torch's ``average_parameters`` after every
  H-th local step (as the simulator times it);
- ``diloco``: H inner SGD steps, then the mean pseudo-gradient (rounded to its dtype,
  all-reduced in fp32: gloo has no 16-bit sums) through an outer Nesterov SGD;
- ``gossip`` ``d-psgd``: after each step average the parameters with the neighbours'
  (Metropolis-Hastings weights); ``sgp``: push-sum to one peer a step; ``ad-psgd``:
  average with a random neighbour without waiting for its progress
  (:mod:`executor.sync.adpsgd`);
- ``two-stage``: the important part of the gradient all-reduced at once, the rest in the
  background under the next step (:mod:`executor.sync.two_stage`).

Worker 0 evaluates its parameters on the test split every ``eval_every`` steps (DiLoCo
with ``eval_global``: the outer parameters of the last synchronisation, the model a
DiLoCo run has). Times are
``time.monotonic()`` (one clock for every process on the host).
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from executor.rank import progress, rank_main
from executor.sync.replica import Worker, gossip_mix, gossip_weights, shard_indices, vec
from executor.sync.server import Server
from executor.sync.task import build_model, load_task
from sim.spec.plan import Plan
from sim.spec.sync import architecture

__all__ = ["main"]


def _sgp(w: Worker, k: int, state: dict[str, Any]) -> None:
    """Push-sum: keep half of (x, weight), send half to the out-peer, add the in-peer's."""
    from sim.network.workers import sgp_peer

    n = w.n
    out = sgp_peer(w.rank, k, n)
    into = next(j for j in range(n) if sgp_peer(j, k, n) == w.rank)
    x = vec(w.params) * state["weight"]  # the push-sum numerator
    half = torch.cat([x / 2, torch.tensor([state["weight"] / 2])])
    got = torch.empty_like(half)
    reqs = [dist.isend(half, dst=out), dist.irecv(got, src=into)]
    for r in reqs:
        r.wait()
    num = half[:-1] + got[:-1]
    state["weight"] = float(half[-1] + got[-1])
    torch.nn.utils.vector_to_parameters(num / state["weight"], w.params)


def _diloco(w: Worker, state: dict[str, Any]) -> None:
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16,
             "int8": torch.float32}[w.plan.sync.pseudo_gradient_dtype]
    pseudo = (state["global"] - vec(w.params)).to(dtype).to(torch.float32)
    dist.all_reduce(pseudo)
    g = state["global"]
    g.grad = pseudo / w.n
    state["outer"].step()
    # a copy: vector_to_parameters makes the parameters views of the vector it is given, and
    # views of ``g`` would carry every inner step into the outer parameters (the
    # pseudo-gradient then reads 0 and the replicas never meet again)
    torch.nn.utils.vector_to_parameters(g.detach().clone(), w.params)


def _strategy_state(w: Worker) -> dict[str, Any]:
    """What a strategy keeps across steps (averager, outer optimizer, gossip weights...)."""
    plan, kind = w.plan, w.plan.sync.kind
    state: dict[str, Any] = {"weight": 1.0, "weights": {}}
    if kind == "local-sgd":
        from torch.distributed.algorithms.model_averaging.utils import average_parameters

        state["average"] = average_parameters
    if kind == "diloco":
        g = torch.nn.Parameter(vec(w.params).detach().clone())
        state["global"] = g
        state["outer"] = torch.optim.SGD([g], lr=plan.sync.outer_lr, nesterov=True,
                                         momentum=plan.sync.outer_momentum)
    if kind == "two-stage":
        from executor.sync.two_stage import TwoStage

        state["two"] = TwoStage(w)
    if kind == "gossip":
        state["weights"] = gossip_weights(plan, w.rank)
    if kind == "gossip" and plan.sync.gossip_mode == "ad-psgd":
        from executor.sync.adpsgd import AsyncGossip

        state["ad"] = AsyncGossip(w, sorted(state["weights"]))
    return state


def _synchronise(w: Worker, k: int, state: dict[str, Any]) -> None:
    """Step ``k``'s update and synchronisation, the gradient computed."""
    plan, kind = w.plan, w.plan.sync.kind
    warm = kind == "local-sgd" and k < plan.sync.warmup_steps  # post-local SGD: BSP first
    if architecture(plan) == "ps":
        w.ps_step(k)
    elif kind == "bsp" or warm:
        w.allreduce_step(k)
    elif kind == "two-stage":
        state["two"].step(k)
    elif "ad" in state:
        with state["ad"].lock:  # atomic with the averages the neighbours ask for
            w.opt.step()
        w.updates = k + 1
        state["ad"].step_done()
    else:
        w.opt.step()
        w.updates = k + 1
        if kind == "local-sgd" and (k + 1 - plan.sync.warmup_steps) % plan.sync.period == 0:
            state["average"](iter(w.params), dist.group.WORLD)
        elif kind == "diloco" and (k + 1) % plan.sync.period == 0:
            _diloco(w, state)
        elif kind == "gossip" and plan.sync.gossip_mode == "sgp":
            _sgp(w, k, state)
        elif kind == "gossip":
            gossip_mix(w, state["weights"])


def _worker_loop(w: Worker, out: Path) -> None:
    cfg = w.cfg
    state = _strategy_state(w)
    start = last = time.monotonic()
    cpu0 = time.process_time()  # this process's CPU seconds, its gloo threads included
    outer = state.get("global") if cfg.get("eval_global") else None
    for k in range(cfg["steps"]):
        if w.rank == 0 and k % cfg["eval_every"] == 0:
            w.evaluate(k, start, outer)
        if k == 0 or time.monotonic() - last > 0.5:  # a file write: not every short step
            progress(out, w.rank, cfg.get("stage0", 0) + k + 1, f"step {k + 1} of "
                     f"{cfg['steps']}")
            last = time.monotonic()
        t0 = time.monotonic()
        with state["ad"].lock if "ad" in state else contextlib.nullcontext():
            w.log["loss"].append(w.gradient())  # AD-PSGD: no average under a backward
        w.log["compute_s"].append(time.monotonic() - t0)
        _synchronise(w, k, state)
        w.log["step_end"].append(time.monotonic())
    if "two" in state:
        state["two"].finish()
    if "ad" in state:
        state["ad"].finish()
        w.log["swaps_served"] = [state["ad"].swaps]
    if w.rank == 0:
        w.evaluate(cfg["steps"], start, outer)
    if architecture(w.plan) == "ps":
        w.finish_ps()
    w.log["start"] = [start]
    w.log["cpu_s"] = [time.process_time() - cpu0]


def _one(cfg: dict[str, Any], out: Path, rank: int) -> dict[str, Any]:
    if cfg.get("probe"):
        from executor.sync.probe import probe

        return probe(cfg, out, rank)
    task = load_task(cfg["task"], cfg["seed"])
    plan = Plan.from_dict(cfg["plan"])
    if rank >= plan.dp:  # a parameter server
        model = build_model(task, tuple(cfg["hidden"]), cfg["seed"])
        flat = vec(model.parameters()).detach()
        s = rank - plan.dp
        comm = plan.communication
        idx = shard_indices([p.numel() for p in model.parameters()], comm.servers,
                            comm.sharding)[s]
        server = Server(cfg, flat[idx], plan.dp)
        stage = cfg.get("stage0", 0)
        return {"rank": rank, "role": "server", **server.serve(
            lambda: progress(out, rank, stage + server.version + 1, "serving"))}
    w = Worker(cfg, rank, task)
    _worker_loop(w, out)
    return {"rank": rank, "role": "worker", **w.log, "torch": torch.__version__}


def run(cfg: dict[str, Any], out: Path, rank: int) -> dict[str, Any]:
    """One run, or each of ``cfg["runs"]`` in turn (the same ranks, one torchrun start):
    a run's fields override the config's."""
    if "runs" not in cfg:
        return _one(cfg, out, rank)
    results = []
    for i, over in enumerate(cfg["runs"]):
        results.append(_one({**cfg, **over, "stage0": i * 10**7}, out, rank))
        dist.barrier()
    return {"rank": rank, "runs": results}


def main(argv: list[str] | None = None) -> int:
    return rank_main(run, argv)


if __name__ == "__main__":
    import sys

    sys.exit(main())

