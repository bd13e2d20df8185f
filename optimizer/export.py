"""Launch arguments and configs for real frameworks, from a plan.

Each exporter writes what that framework documents, and the plan's rank layout: where
the plan's placement is not the framework's default rank order an explicit rank table
(global rank -> node and local device) is written too, with how to apply it. Each format
has a ``check_*`` function applying the framework's documented consistency rules; the tests
also hand the exports to the frameworks' own parsers where those install.
"""

from __future__ import annotations

import json
from typing import Any

from sim.errors import SpecError
from sim.spec.cluster import ClusterSpec
from sim.spec.model import ModelSpec
from sim.spec.plan import DEFAULT_PLACEMENT, Plan

__all__ = ["export", "FORMATS", "rank_table", "megatron_args", "deepspeed_config",
           "torchtitan_toml", "torchrun_command", "check_megatron", "check_deepspeed",
           "check_torchtitan"]

FORMATS = ("megatron", "torchtitan", "deepspeed", "torchrun")
_DTYPE_FLAG = {"bf16": "--bf16", "fp16": "--fp16", "fp8": "--bf16 --fp8-format hybrid"}


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


def _needs_table(plan: Plan) -> bool:
    return plan.placement != DEFAULT_PLACEMENT


def _model_args(m: ModelSpec) -> list[str]:
    args = [f"--num-layers {m.num_layers}", f"--hidden-size {m.hidden_size}",
            f"--num-attention-heads {m.num_heads}", f"--ffn-hidden-size {m.ffn_hidden_size}",
            f"--max-position-embeddings {m.max_seq_len}"]
    if m.kv_heads != m.num_heads:
        args += ["--group-query-attention", f"--num-query-groups {m.kv_heads}"]
    if m.gated_mlp:
        args.append("--swiglu")
    if m.norm == "rmsnorm":
        args.append("--normalization RMSNorm")
    if m.position_embedding == "rope":
        args.append("--position-embedding-type rope")
    if not m.tied_embeddings:
        args.append("--untie-embeddings-and-output-weights")
    if not m.linear_bias:
        args.append("--disable-bias-linear")
    if m.is_moe:
        args += [f"--num-experts {m.num_experts}", f"--moe-router-topk {m.top_k}"]
    return args


def megatron_args(plan: Plan, model: ModelSpec) -> list[str]:
    """Megatron-LM ``pretrain_gpt.py`` arguments."""
    if plan.zero_stage > 1:
        raise SpecError("--format megatron", f"Megatron-LM has no ZeRO-{plan.zero_stage}; "
                        "export to torchtitan or deepspeed")
    args = [f"--tensor-model-parallel-size {plan.tp}",
            f"--pipeline-model-parallel-size {plan.pp}",
            f"--context-parallel-size {plan.cp}", f"--expert-model-parallel-size {plan.ep}",
            f"--micro-batch-size {plan.micro_batch_size}",
            f"--global-batch-size {plan.global_batch_size}", f"--seq-length {plan.seq_len}"]
    if plan.vpp > 1:
        args.append(f"--num-layers-per-virtual-pipeline-stage "
                    f"{model.num_layers // (plan.pp * plan.vpp)}")
    args += _uneven_args(plan)
    if plan.sequence_parallel:
        args.append("--sequence-parallel")
    if plan.zero_stage == 1:
        args.append("--use-distributed-optimizer")
    if plan.recompute == "full":
        args += ["--recompute-granularity full", "--recompute-method uniform",
                 "--recompute-num-layers 1"]
    elif plan.recompute == "selective":
        args.append("--recompute-granularity selective")
    if plan.attention == "flash":
        args.append("--use-flash-attn")
    if plan.overlap_grad_reduce:
        args.append("--overlap-grad-reduce")
    args += _DTYPE_FLAG.get(plan.dtype, "").split()
    return args + _model_args(model)


def _uneven_args(plan: Plan) -> list[str]:
    """Megatron-LM can give the first and last stage their own layer counts, the middle
    stages sharing the rest evenly; any other split cannot be exported."""
    lps = plan.layers_per_stage
    if not lps:
        return []
    middle = set(lps[1:-1])
    if plan.vpp > 1 or len(middle) > 1:
        raise SpecError("--format megatron", f"layers_per_stage {list(lps)} is not expressible "
                        "in Megatron-LM (only the first and last stage may differ, without "
                        "interleaving)")
    return [f"--decoder-first-pipeline-num-layers {lps[0]}",
            f"--decoder-last-pipeline-num-layers {lps[-1]}"]


def deepspeed_config(plan: Plan) -> dict[str, Any]:
    """A DeepSpeed config (ZeRO, batch, precision, checkpointing); TP and PP come from the
    model code (Megatron-DeepSpeed flags in ``trainsim_notes``)."""
    accum = plan.num_microbatches
    cfg: dict[str, Any] = {
        "train_batch_size": plan.global_batch_size,
        "train_micro_batch_size_per_gpu": plan.micro_batch_size,
        "gradient_accumulation_steps": accum,
        "zero_optimization": {"stage": plan.zero_stage,
                              "overlap_comm": plan.overlap_grad_reduce},
        "bf16": {"enabled": plan.dtype in ("bf16", "fp8")},
        "fp16": {"enabled": plan.dtype == "fp16"},
        "trainsim_notes": {"tensor_model_parallel_size": plan.tp,
                           "pipeline_model_parallel_size": plan.pp,
                           "context_parallel_size": plan.cp,
                           "sequence_parallel": plan.sequence_parallel,
                           "activation_recompute": plan.recompute,
                           # context-parallel ranks share samples: the batch is over dp
                           "data_parallel_size": plan.dp}}
    return cfg


def torchtitan_toml(plan: Plan) -> str:
    """torchtitan's ``[parallelism]``, ``[training]`` and ``[activation_checkpoint]``."""
    # ZeRO-1/2 map to FSDP (full sharding, an approximation); EP draws on the shard degree
    shard, replicate = (plan.dp, 1) if plan.zero_stage >= 1 or plan.ep > 1 else (1, plan.dp)
    schedule = {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved-1f1b": "Interleaved1F1B"}
    lines = ["[parallelism]", f"data_parallel_replicate_degree = {replicate}",
             f"data_parallel_shard_degree = {shard}", f"tensor_parallel_degree = {plan.tp}",
             f"pipeline_parallel_degree = {plan.pp}",
             f"context_parallel_degree = {plan.cp}", f"expert_parallel_degree = {plan.ep}",
             f'pipeline_parallel_schedule = "{schedule[plan.schedule]}"',
             f"pipeline_parallel_microbatch_size = {plan.micro_batch_size}",
             f"enable_sequence_parallel = {str(plan.sequence_parallel).lower()}", "",
             "[training]", f"global_batch_size = {plan.global_batch_size}",
             f"local_batch_size = {plan.global_batch_size // plan.dp}",
             f"seq_len = {plan.seq_len}",
             f'mixed_precision_param = "{"bfloat16" if plan.dtype != "fp32" else "float32"}"',
             "", "[activation_checkpoint]", f'mode = "{plan.recompute}"']
    return "\n".join(lines) + "\n"


def torchrun_command(plan: Plan, cluster: ClusterSpec) -> str:
    return (f"torchrun --nnodes {cluster.nodes} --nproc-per-node {cluster.gpus_per_node} "
            f"--rdzv-backend c10d --rdzv-endpoint $MASTER_ADDR:29500 --rdzv-id trainsim "
            f"train.py --plan best_plan.json")


def export(fmt: str, plan: Plan, model: ModelSpec, cluster: ClusterSpec) -> dict[str, str]:
    """File name -> text for one framework (plus ``rank_table.json`` when needed)."""
    from sim.spec.plan import validate

    validate(plan, model, cluster)
    if plan.micro_batches_per_replica is not None and fmt in FORMATS:
        raise SpecError(f"--format {fmt}", f"micro_batches_per_replica "
                        f"{list(plan.micro_batches_per_replica)} is not expressible: {fmt} gives "
                        "every data-parallel replica the same batch (export the even-split plan)")
    if fmt == "deepspeed":
        check_deepspeed(deepspeed_config(plan))
    if fmt == "megatron":
        files = {"megatron_args.sh": "python pretrain_gpt.py \\\n    "
                 + " \\\n    ".join(megatron_args(plan, model)) + "\n"}
    elif fmt == "deepspeed":
        files = {"deepspeed_config.json": json.dumps(deepspeed_config(plan), indent=2) + "\n"}
    elif fmt == "torchtitan":
        files = {"torchtitan.toml": torchtitan_toml(plan)}
    elif fmt == "torchrun":
        files = {"torchrun.sh": torchrun_command(plan, cluster) + "\n"}
    else:
        raise SpecError("--format", f"must be one of {', '.join(FORMATS)}, got {fmt!r}")
    if _needs_table(plan):
        files["rank_table.json"] = json.dumps({
            "note": "the plan's placement differs from the framework's rank order (tp "
                    "innermost, then cp, dp, pp): start each global rank on the node and "
                    "local device below (e.g. per-node CUDA_VISIBLE_DEVICES and RANK)",
            "placement": plan.placement if isinstance(plan.placement, str)
            else list(plan.placement),
            "ranks": rank_table(plan, cluster)}, indent=2) + "\n"
    return files


# Documented consistency rules --------------------------------------------------------------
def check_megatron(args: list[str], world: int) -> None:
    """Megatron-LM: world divisible by tp*pp*cp; dp = world/(tp*pp*cp) divisible by ep;
    global batch divisible by micro-batch * dp; sequence parallel needs tp > 1."""
    flags = dict(a.split(" ", 1) for a in args if " " in a)
    tp = int(flags["--tensor-model-parallel-size"])
    pp = int(flags["--pipeline-model-parallel-size"])
    cp, ep = int(flags["--context-parallel-size"]), int(flags["--expert-model-parallel-size"])
    mb, gbs = int(flags["--micro-batch-size"]), int(flags["--global-batch-size"])
    assert world % (tp * pp * cp) == 0, "world size not divisible by tp*pp*cp"
    dp = world // (tp * pp * cp)
    assert dp % ep == 0, "dp not divisible by ep"
    assert gbs % (mb * dp) == 0, "global batch not divisible by micro-batch * dp"
    assert "--sequence-parallel" not in args or tp > 1, "sequence parallel needs tp > 1"


def check_deepspeed(cfg: dict[str, Any]) -> None:
    """DeepSpeed: train_batch_size = micro * accumulation * data-parallel size; stage 0-3."""
    dp = cfg["trainsim_notes"]["data_parallel_size"]
    assert cfg["train_batch_size"] == cfg["train_micro_batch_size_per_gpu"] \
        * cfg["gradient_accumulation_steps"] * dp, "batch arithmetic"
    assert cfg["zero_optimization"]["stage"] in (0, 1, 2, 3)


def check_torchtitan(toml_text: str, world: int) -> None:
    """torchtitan ParallelDims: replicate * shard * cp * tp * pp == world size."""
    import tomllib

    par = tomllib.loads(toml_text)["parallelism"]
    product = (par["data_parallel_replicate_degree"] * par["data_parallel_shard_degree"]
               * par["context_parallel_degree"] * par["tensor_parallel_degree"]
               * par["pipeline_parallel_degree"])
    assert product == world, f"parallel dims product {product} != world {world}"
