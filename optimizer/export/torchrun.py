"""torchrun (torch >= 2.3): the plan run by this project's own worker,
``python -m executor.worker executor_config.json``, on every node through torchrun's
rendezvous. The worker writes ``rank<N>.json`` (step times, losses, peak memory) beside its
config; ``trainsim compare`` reads them against the prediction.
"""

from __future__ import annotations

import json

from sim.errors import SpecError
from sim.spec.cluster import ClusterSpec
from sim.spec.model import ModelSpec
from sim.spec.plan import Plan

__all__ = ["check", "worker_config", "files", "STEPS", "WARMUP"]

STEPS, WARMUP = 20, 5


def check(plan: Plan, model: ModelSpec) -> None:
    """What the executor's worker cannot run (its own pre-launch check)."""
    from executor.capabilities import unsupported

    why = unsupported(model, plan)
    if why is not None:
        raise SpecError(*why)


def worker_config(plan: Plan, model: ModelSpec) -> dict[str, object]:
    return {"model": model.to_dict(), "plan": plan.to_dict(), "steps": STEPS,
            "warmup": WARMUP, "timeout_s": 600.0, "device": "cuda", "threads": 1, "seed": 0,
            "lr": 1e-3, "fault": None}


def files(plan: Plan, model: ModelSpec, cluster: ClusterSpec) -> dict[str, str]:
    from optimizer.export import FRAMEWORKS, PREAMBLE, env_lines, launcher, nccl_env

    script = ["#!/bin/bash", f"# {FRAMEWORKS['torchrun']}: run from a trainsim checkout (or "
              "with trainsim installed) on every node", *PREAMBLE,
              *env_lines(nccl_env(plan, "torchrun")),
              f'{launcher(cluster)} -m executor.worker "$(dirname "$0")/executor_config.json"']
    return {"executor_config.json": json.dumps(worker_config(plan, model), indent=2) + "\n",
            "torchrun.sh": "\n".join(script) + "\n"}
