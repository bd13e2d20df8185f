"""``trainsim export --format torchrun``: the plan run by this project's own worker,
``python -m executor.worker executor_config.json``, on every node through torchrun's
rendezvous (torch >= 2.3). Plans the worker cannot run are refused before anything is
written (:func:`executor.capabilities.unsupported`). The worker writes ``rank<N>.json``
(step times, losses, peak memory) beside its config. The worker lays the ranks out by the
plan's placement itself (``executor.parallel.mesh_ranks``), so no rank table is written.
"""

from __future__ import annotations

import json

from executor.capabilities import unsupported
from sim.errors import SpecError
from sim.network.algorithms import nccl_env
from sim.spec.cluster import ClusterSpec
from sim.spec.model import ModelSpec
from sim.spec.plan import Plan, validate

__all__ = ["torchrun_files", "worker_config", "STEPS", "WARMUP"]

STEPS, WARMUP = 20, 5


def worker_config(plan: Plan, model: ModelSpec) -> dict[str, object]:
    return {"model": model.to_dict(), "plan": plan.to_dict(), "steps": STEPS,
            "warmup": WARMUP, "timeout_s": 600.0, "device": "cuda", "threads": 1, "seed": 0,
            "lr": 1e-3, "fault": None}


def torchrun_files(plan: Plan, model: ModelSpec, cluster: ClusterSpec) -> dict[str, str]:
    validate(plan, model, cluster)
    why = unsupported(model, plan)
    if why is not None:
        raise SpecError(*why)
    env = [f"export {k}={v}" for k, v in sorted(nccl_env(plan, "torchrun").items())]
    script = ["#!/bin/bash", "# torchrun + this project's executor worker: run from a trainsim "
              "checkout (or with trainsim installed) on every node", "set -euo pipefail",
              ': "${MASTER_ADDR:?set MASTER_ADDR to the first node}"', *env,
              f"torchrun --nnodes {cluster.nodes} --nproc-per-node {cluster.gpus_per_node} "
              '--rdzv-backend c10d --rdzv-endpoint "$MASTER_ADDR:29500" --rdzv-id trainsim '
              '-m executor.worker "$(dirname "$0")/executor_config.json"']
    files = {"executor_config.json": json.dumps(worker_config(plan, model), indent=2) + "\n",
             "torchrun.sh": "\n".join(script) + "\n"}
    return files  # no rank table: the worker lays ranks out by the plan's placement itself
