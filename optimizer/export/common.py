"""What every export shares: the pinned versions, the script preamble, the launcher line,
the refusals common to all formats and the rank table file."""

from __future__ import annotations

import json

from sim.errors import SpecError
from sim.layout.placement import framework_rank_table
from sim.network.algorithms import nccl_env
from sim.spec.cluster import ClusterSpec
from sim.spec.plan import DEFAULT_PLACEMENT, Plan

__all__ = ["FRAMEWORKS", "PREAMBLE", "env_lines", "launcher", "check_common", "rank_files"]

FRAMEWORKS = {"megatron": "Megatron-LM core_r0.16 (megatron-core 0.16.1)",
              "torchtitan": "torchtitan 0.3.0", "deepspeed": "DeepSpeed 0.19.8"}
# every script's first lines: stop at the first error, and name a missing MASTER_ADDR
PREAMBLE = ["set -euo pipefail", ': "${MASTER_ADDR:?set MASTER_ADDR to the first node}"']


def env_lines(env: dict[str, str]) -> list[str]:
    return [f"export {k}={v}" for k, v in sorted(env.items())]


def launcher(cluster: ClusterSpec) -> str:
    """torchrun's multi-node rendezvous (the same command on every node)."""
    return (f"torchrun --nnodes {cluster.nodes} --nproc-per-node {cluster.gpus_per_node} "
            '--rdzv-backend c10d --rdzv-endpoint "$MASTER_ADDR:29500" --rdzv-id trainsim')


def check_common(plan: Plan, fmt: str) -> None:
    """Refusals every format shares."""
    if plan.micro_batches_per_replica is not None:
        raise SpecError("plan.micro_batches_per_replica", "micro_batches_per_replica "
                        f"{list(plan.micro_batches_per_replica)} is not expressible: {fmt} gives "
                        "every data-parallel replica the same batch (export the even split)")
    if plan.moe_overlap == "operator":
        raise SpecError("plan.moe_overlap", f"operator is not expressible in {fmt}: it is "
                        "MegaScale-MoE's overlap, which no public framework runs (export "
                        "with none, shared-expert or a2a)")
    if plan.moe_dispatch_dtype is not None:
        raise SpecError("plan.moe_dispatch_dtype", f"{plan.moe_dispatch_dtype} dispatch is not "
                        f"expressible in {fmt}: no option sets the dispatch's wire dtype "
                        "(export with moe_dispatch_dtype null)")
    nccl_env(plan, fmt)


def rank_files(plan: Plan, cluster: ClusterSpec) -> dict[str, str]:
    """``rank_table.json`` where the placement is not the frameworks' rank order."""
    if plan.placement == DEFAULT_PLACEMENT:
        return {}
    return {"rank_table.json": json.dumps({
        "note": "the plan's placement differs from the framework's rank order (tp "
                "innermost, then cp, dp, pp): start each global rank on the node and "
                "local device below (e.g. per-node CUDA_VISIBLE_DEVICES and RANK)",
        "placement": plan.placement if isinstance(plan.placement, str)
        else list(plan.placement),
        "ranks": framework_rank_table(plan, cluster.gpus_per_node)}, indent=2) + "\n"}
