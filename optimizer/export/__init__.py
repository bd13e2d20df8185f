"""Launch files for real frameworks, from a plan: each format targets one pinned framework
version and either expresses every field of the plan or refuses with a one-line error
naming the field (:class:`sim.errors.SpecError`); nothing is dropped or changed silently.

=============  =========================================================================
format         what it writes, for which version
=============  =========================================================================
megatron       ``megatron_args.sh``: environment and ``torchrun ... pretrain_gpt.py``
               arguments for Megatron-LM core_r0.16 (megatron-core 0.16.1)
torchtitan     ``trainsim_torchtitan.py``: a config module for torchtitan 0.3.0's
               ``--module/--config`` entry point, and ``torchtitan.sh`` launching it
deepspeed      ``deepspeed_config.json`` for DeepSpeed 0.19.8 (data-parallel ZeRO plans)
torchrun       ``executor_config.json`` and ``torchrun.sh`` starting this project's own
               worker (``python -m executor.worker``) on every node
=============  =========================================================================

Where the plan's placement is not the frameworks' rank order (TP innermost, then CP, DP,
PP) a ``rank_table.json`` (global rank -> node and local device) is written too. A plan's
collective algorithms become ``NCCL_ALGO`` when one algorithm serves every group.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from sim.errors import SpecError
from sim.spec.cluster import ClusterSpec
from sim.spec.model import ModelSpec
from sim.spec.plan import DEFAULT_PLACEMENT, Plan

__all__ = ["export", "refusal", "FORMATS", "FRAMEWORKS", "rank_table", "nccl_env",
           "check_common"]

FORMATS = ("megatron", "torchtitan", "deepspeed", "torchrun")
FRAMEWORKS = {"megatron": "Megatron-LM core_r0.16 (megatron-core 0.16.1)",
              "torchtitan": "torchtitan 0.3.0", "deepspeed": "DeepSpeed 0.19.8",
              "torchrun": "torchrun (torch >= 2.3) + executor.worker"}
# Our algorithm names -> NCCL_ALGO values; the others have no NCCL switch.
_NCCL_ALGO = {"ring": "Ring", "tree": "Tree", "nvls": "NVLS"}


def rank_table(plan: Plan, cluster: ClusterSpec) -> list[dict[str, int]]:
    """Global rank (framework order: tp innermost, then cp, ep/dp, pp) -> device."""
    from sim.layout.placement import rank_coords

    sizes, strides = rank_coords(plan)
    order = ("tp", "cp", "ep", "dp", "pp")  # the frameworks' default, innermost first
    rows = []
    for fw_rank in range(plan.world_size):
        coord, rest = {}, fw_rank
        for d in order:
            coord[d], rest = rest % sizes[d], rest // sizes[d]
        logical = sum(coord[d] * strides[d] for d in order)
        device = logical if isinstance(plan.placement, str) else plan.placement[logical]
        rows.append({"rank": fw_rank, "node": device // cluster.gpus_per_node,
                     "local_rank": device % cluster.gpus_per_node})
    return rows


def nccl_env(plan: Plan, fmt: str) -> dict[str, str]:
    """``NCCL_ALGO`` for the plan's collective algorithms. NCCL takes one algorithm per
    process, not per group: a plan giving two groups different algorithms, or one NCCL
    cannot be told to use, is refused."""
    chosen = {g: a for g, a in plan.collectives if a != "auto"}
    if not chosen:
        return {}
    used = {g: chosen.get(g, "auto") for g in ("tp", "dp", "ep")
            if {"tp": plan.tp, "dp": plan.dp, "ep": plan.ep}[g] > 1 or g in chosen}
    algos = set(used.values())
    if len(algos) != 1 or next(iter(algos)) not in _NCCL_ALGO:
        raise SpecError("plan.collectives", f"{dict(plan.collectives)} is not expressible in "
                        f"{fmt}: NCCL_ALGO sets one algorithm ({'/'.join(_NCCL_ALGO)}) for every "
                        f"group of the process (groups in use: {', '.join(sorted(used))})")
    return {"NCCL_ALGO": _NCCL_ALGO[algos.pop()]}


def check_common(plan: Plan, fmt: str) -> None:
    """Refusals every format shares."""
    if plan.micro_batches_per_replica is not None:
        raise SpecError("plan.micro_batches_per_replica", "micro_batches_per_replica "
                        f"{list(plan.micro_batches_per_replica)} is not expressible: {fmt} gives "
                        "every data-parallel replica the same batch (export the even split)")
    nccl_env(plan, fmt)


def _checker(fmt: str) -> Callable[[Plan, ModelSpec], None]:
    from optimizer.export import deepspeed, megatron, torchrun, torchtitan

    table = {"megatron": megatron.check, "torchtitan": torchtitan.check,
             "deepspeed": deepspeed.check, "torchrun": torchrun.check}
    if fmt not in table:
        raise SpecError("--format", f"must be one of {', '.join(FORMATS)}, got {fmt!r}")
    return table[fmt]


def refusal(fmt: str, plan: Plan, model: ModelSpec) -> SpecError | None:
    """Why ``fmt`` cannot express ``plan`` (None when it can). Cheap: the optimizer asks it
    of every plan in the space when a framework is targeted."""
    try:
        check_common(plan, fmt)
        _checker(fmt)(plan, model)
    except SpecError as exc:
        return exc
    return None


def export(fmt: str, plan: Plan, model: ModelSpec, cluster: ClusterSpec) -> dict[str, str]:
    """File name -> text for one framework (plus ``rank_table.json`` when needed)."""
    from optimizer.export import deepspeed, megatron, torchrun, torchtitan
    from sim.spec.plan import validate

    validate(plan, model, cluster)
    why = refusal(fmt, plan, model)
    if why is not None:
        raise why
    writers = {"megatron": megatron.files, "torchtitan": torchtitan.files,
               "deepspeed": deepspeed.files, "torchrun": torchrun.files}
    files = writers[fmt](plan, model, cluster)
    if plan.placement != DEFAULT_PLACEMENT:
        files["rank_table.json"] = json.dumps({
            "note": "the plan's placement differs from the framework's rank order (tp "
                    "innermost, then cp, dp, pp): start each global rank on the node and "
                    "local device below (e.g. per-node CUDA_VISIBLE_DEVICES and RANK)",
            "placement": plan.placement if isinstance(plan.placement, str)
            else list(plan.placement),
            "ranks": rank_table(plan, cluster)}, indent=2) + "\n"
    return files


def env_lines(env: dict[str, str]) -> list[str]:
    return [f"export {k}={v}" for k, v in sorted(env.items())]


def launcher(cluster: ClusterSpec) -> str:
    """torchrun's multi-node rendezvous (the same command on every node)."""
    return (f"torchrun --nnodes {cluster.nodes} --nproc-per-node {cluster.gpus_per_node} "
            '--rdzv-backend c10d --rdzv-endpoint "$MASTER_ADDR:29500" --rdzv-id trainsim')


# every script's first lines: stop at the first error, and name a missing MASTER_ADDR
PREAMBLE = ["set -euo pipefail", ': "${MASTER_ADDR:?set MASTER_ADDR to the first node}"']
