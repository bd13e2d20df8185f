"""One rank of a real federated run (under torchrun): rank 0 the server, ranks 1..N the
client processes. Client ``c`` of the population lives on process ``1 + c mod N``; its data
is its part of a non-IID Dirichlet split of the task's training set
(:func:`executor.federated.split.dirichlet_split`).

Before the rounds, with ``probe`` set, every client process times local training of each
of its clients (all processes at once, the concurrency of a round) and reports
milliseconds per sample: the compute speed the simulator is given.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from executor.federated.client import ClientProcess
from executor.federated.fedbuff import fedbuff_client, fedbuff_server
from executor.federated.server import Server
from executor.federated.split import dirichlet_split
from executor.rank import progress, rank_main
from executor.sync.task import load_task, mlp

__all__ = ["run", "main"]


def _schedule(cfg: dict[str, Any], r: int, rng: random.Random) -> list[int]:
    if cfg.get("schedule"):
        return [int(c) for c in cfg["schedule"][r]]
    return sorted(rng.sample(range(cfg["population"]), cfg["sampled"]))


def _server(cfg: dict[str, Any], out: Path, task: Any, host: dict[int, int]
            ) -> dict[str, Any]:
    model = mlp(task, tuple(cfg["hidden"]), cfg["seed"])
    server = Server(cfg, model, host)
    rng = random.Random(cfg["seed"])
    rounds = []
    for r in range(cfg["rounds"]):
        row = server.run_round(r, _schedule(cfg, r, rng))
        if cfg["eval_every"] and (r + 1) % cfg["eval_every"] == 0:
            loss, acc = task.evaluate(model)
            row |= {"test_loss": loss, "accuracy": acc}
        rounds.append(row)
        progress(out, 0, r + 1, f"round {r + 1}")
    server.finish()
    return {"role": "server", "rounds": rounds}


def run(cfg: dict[str, Any], out: Path, rank: int) -> dict[str, Any]:
    """One run, or each of ``cfg["runs"]`` in turn on the same processes (torchrun's
    start-up paid once): a run's fields override the config's."""
    if "runs" not in cfg:
        return _one(cfg, out, rank)
    results = []
    for over in cfg["runs"]:
        results.append(_one({**cfg, **over}, out, rank))
        dist.barrier()
    return {"role": results[0]["role"], "runs": results}


def _one(cfg: dict[str, Any], out: Path, rank: int) -> dict[str, Any]:
    task = load_task(cfg["task"], cfg["seed"])
    n = dist.get_world_size() - 1
    parts = dirichlet_split(task.y_train.numpy(), cfg["population"], cfg["alpha"],
                            cfg["seed"])
    host = {c: 1 + c % n for c in range(cfg["population"])}
    dist.barrier()
    if cfg.get("strategy") == "fedbuff":
        return _fedbuff(cfg, out, rank, task, parts)
    if rank == 0:
        dist.barrier()  # the clients probe meanwhile
        return _server(cfg, out, task, host)
    torch.manual_seed(cfg["seed"])
    data = {c: (task.x_train[torch.as_tensor(parts[c])], task.y_train[torch.as_tensor(parts[c])])
            for c in host if host[c] == rank}
    proc = ClientProcess(cfg, mlp(task, tuple(cfg["hidden"]), cfg["seed"]), data)
    probed = proc.probe() if cfg.get("probe") else {}
    dist.barrier()
    progress(out, rank, 1, "serving")
    served = proc.serve()
    return {"role": "client", "process": rank, **served,
            "ms_per_sample": {str(c): v for c, v in probed.items()},
            "samples": {str(c): int(len(x)) for c, (x, _) in data.items()},
            "labels": {str(c): np.bincount(y.numpy(), minlength=task.classes).tolist()
                       for c, (_, y) in data.items()}}


def _fedbuff(cfg: dict[str, Any], out: Path, rank: int, task: Any, parts: list) -> dict:
    """FedBuff: every process may train any client (each holds every client's data)."""
    model = mlp(task, tuple(cfg["hidden"]), cfg["seed"])
    if rank == 0:
        steps = fedbuff_server(cfg, model, task, list(range(1, dist.get_world_size())),
                               lambda v: progress(out, 0, v, f"step {v}"))
        return {"role": "server", "rounds": steps}
    torch.manual_seed(cfg["seed"])
    data = {c: (task.x_train[torch.as_tensor(p)], task.y_train[torch.as_tensor(p)])
            for c, p in enumerate(parts)}
    progress(out, rank, 1, "serving")
    return {"role": "client", "process": rank, **fedbuff_client(cfg, model, data),
            "ms_per_sample": {}, "samples": {str(c): int(len(x)) for c, (x, _) in data.items()},
            "labels": {}}


def main(argv: list[str] | None = None) -> int:
    return rank_main(run, argv)


if __name__ == "__main__":
    import sys

    sys.exit(main())
