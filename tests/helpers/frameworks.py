"""Read an export back through each framework's own front door (installed from the package
registry by the ``export-check`` extra) into one vocabulary, to compare with the plan:
tp, pp, cp, ep, dp, micro_batch, accumulation, vpp, layers, zero, recompute, dtype,
sequence_parallel, dispatcher, dropout.

Megatron-LM's ``arguments.py`` is not on PyPI (only megatron-core is, and Megatron-Bridge
needs Transformer Engine, a CUDA build). :func:`megatron_parsed` therefore does what
Megatron-LM's ``core_transformer_config_from_args`` does (``--flag-name`` -> field
``flag_name`` of megatron-core's ``TransformerConfig`` or ``DistributedDataParallelConfig``,
plus its handful of renames) and lets megatron-core validate: ``TransformerConfig``
(divisibility, MoE, layout, recompute), ``DistributedDataParallelConfig``,
``ConstantNumMicroBatchesCalculator`` (batch arithmetic) and ``RankGenerator`` (rank order).
A flag with no megatron-core field and not in :data:`MEGATRON_SCRIPT_ARGS` fails. Not covered:
``validate_args``' checks of the training loop (data, checkpointing, logging).
"""

from __future__ import annotations

import dataclasses
import shlex
import sys
from pathlib import Path
from typing import Any

import torch

# Megatron-LM arguments the training script reads itself (model construction, data,
# batch): checked by the arithmetic below, not by a megatron-core config class.
MEGATRON_SCRIPT_ARGS = {"micro_batch_size", "global_batch_size", "seq_length",
                        "max_position_embeddings", "position_embedding_type", "tokenizer_type",
                        "vocab_size", "make_vocab_size_divisible_by", "mock_data",
                        "train_iters", "untie_embeddings_and_output_weights",
                        "group_query_attention", "ckpt_format", "spec"}
_RENAMES = {"num_experts": "num_moe_experts", "fp8_format": "fp8",
            "num_virtual_stages_per_pipeline_rank": "virtual_pipeline_model_parallel_size"}


def script_env_and_args(text: str, entry: str) -> tuple[dict[str, str], list[str]]:
    """The ``export`` lines and the words after ``entry`` in a launch script."""
    env, words = {}, shlex.split(text.replace("\\\n", " "), comments=True)
    for i, w in enumerate(words):
        if w == "export":
            key, value = words[i + 1].split("=", 1)
            env[key] = value
    return env, words[words.index(entry) + 1:]


def _flags(words: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    i = 0
    while i < len(words):
        name = words[i].removeprefix("--").replace("-", "_")
        values = []
        while i + 1 + len(values) < len(words) and \
                not words[i + 1 + len(values)].startswith("--"):
            values.append(words[i + 1 + len(values)])
        # a flag alone is a switch; several values a list (argparse nargs)
        out[_RENAMES.get(name, name)] = True if not values else \
            values[0] if len(values) == 1 else values
        i += 1 + len(values)
    return out


def _is_float(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _typed(cls: type, flags: dict[str, Any]) -> dict[str, Any]:
    """The flags that are fields of ``cls``, converted to the field's default's type."""
    from megatron.core.transformer.enums import AttnBackend

    fields = {f.name: f for f in dataclasses.fields(cls)}
    out = {}
    for name, value in flags.items():
        if name not in fields:
            continue
        default = fields[name].default
        if name == "attention_backend":
            value = AttnBackend[value]
        elif name == "moe_layer_freq":
            value = [int(x) for x in value.strip("[]").split(",")]
        elif name == "recompute_modules":  # argparse nargs="*": a list even of one
            value = [value] if isinstance(value, str) else value
        elif isinstance(default, bool) or value is True:
            value = bool(value)
        elif isinstance(default, float):
            value = float(value)
        elif isinstance(default, int) or (default is None and str(value).isdigit()):
            value = int(value)
        elif default is None and _is_float(str(value)):  # argparse's type=float flags
            value = float(value)
        out[name] = value
    return out


def _megatron_configs(flags: dict[str, Any]) -> tuple[Any, Any]:
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.transformer_config import MLATransformerConfig

    if flags.get("multi_latent_attention"):  # what pretrain_gpt.py builds for MLA
        TransformerConfig = MLATransformerConfig  # noqa: N806
    # arguments.py: bf16 accumulates and reduces in fp32 unless --grad-reduce-in-bf16
    flags = dict(flags)
    in_bf16 = flags.pop("grad_reduce_in_bf16", False)
    in_fp32 = flags.pop("accumulate_allreduce_grads_in_fp32", False)
    flags["grad_reduce_in_fp32"] = bool(in_fp32 or (flags.get("bf16") and not in_bf16))
    unknown = set(flags) - {f.name for f in dataclasses.fields(TransformerConfig)} \
        - {f.name for f in dataclasses.fields(DistributedDataParallelConfig)} \
        - MEGATRON_SCRIPT_ARGS - {"swiglu", "disable_bias_linear", "add_qkv_bias"}
    assert not unknown, f"flags megatron-core has no field for: {sorted(unknown)}"
    kw = _typed(TransformerConfig, flags)
    if flags.get("swiglu"):
        kw.update(gated_linear_unit=True, activation_func=torch.nn.functional.silu)
    kw["add_bias_linear"] = not flags.get("disable_bias_linear", False)
    kw["add_qkv_bias"] = bool(flags.get("add_qkv_bias", kw["add_bias_linear"]))
    kw["params_dtype"] = torch.bfloat16 if flags.get("bf16") else \
        torch.float16 if flags.get("fp16") else torch.float32
    kw["pipeline_dtype"] = kw["params_dtype"]
    if flags.get("group_query_attention") is not True:
        kw.pop("num_query_groups", None)
    return TransformerConfig(**kw), DistributedDataParallelConfig(
        **_typed(DistributedDataParallelConfig, flags))


def _megatron_layers(cfg: Any) -> list[int]:
    pp, vpp = cfg.pipeline_model_parallel_size, cfg.virtual_pipeline_model_parallel_size or 1
    layout = cfg.pipeline_model_parallel_layout
    if layout is None:
        return [cfg.num_layers // (pp * vpp)] * (pp * vpp)
    stages = [layout.layout[p][v] for v in range(vpp) for p in range(pp)]
    return [sum(1 for layer in stage if layer.name == "decoder") for stage in stages]


def megatron_parsed(text: str, world: int) -> dict[str, Any]:
    from megatron.core.num_microbatches_calculator import ConstantNumMicroBatchesCalculator
    from megatron.core.parallel_state import RankGenerator

    env, words = script_env_and_args(text, "pretrain_gpt.py")
    flags = _flags(words)
    cfg, ddp = _megatron_configs(flags)
    tp, pp, cp = (cfg.tensor_model_parallel_size, cfg.pipeline_model_parallel_size,
                  cfg.context_parallel_size)
    assert world % (tp * pp * cp) == 0, "world not divisible by tp*pp*cp"
    dp, ep = world // (tp * pp * cp), cfg.expert_model_parallel_size
    assert int(flags["max_position_embeddings"]) >= int(flags["seq_length"])
    fsdp = bool(flags.get("use_megatron_fsdp"))
    if fsdp:  # validate_args: Megatron-FSDP asserts != 1 and the fsdp_dtensor format
        assert env.get("CUDA_DEVICE_MAX_CONNECTIONS") != "1", "Megatron-FSDP refuses 1"
        assert flags.get("ckpt_format") == "fsdp_dtensor", "Megatron-FSDP needs fsdp_dtensor"
    elif tp > 1 or cp > 1:
        assert env.get("CUDA_DEVICE_MAX_CONNECTIONS") == "1", "validate_args needs it"
    if cfg.attention_backend.name == "local":
        assert flags.get("spec") == "local", "validate_args: local attention needs --spec local"
    micro = ConstantNumMicroBatchesCalculator(int(flags["global_batch_size"]),
                                              int(flags["micro_batch_size"]), dp, False, 0)
    RankGenerator(tp=tp, ep=1, dp=dp, pp=pp, cp=cp, order="tp-cp-ep-dp-pp")
    etp = cfg.expert_tensor_parallel_size or tp  # initialize_model_parallel's expert grid
    assert world % (etp * ep * pp) == 0, "world not divisible by etp*ep*pp"
    experts = RankGenerator(tp=etp, ep=ep, dp=world // (etp * ep * pp), pp=pp, cp=1,
                            order="tp-cp-ep-dp-pp")
    zero = 3 if ddp.data_parallel_sharding_strategy == "optim_grads_params" else \
        2 if ddp.data_parallel_sharding_strategy == "optim_grads" else \
        int(ddp.use_distributed_optimizer)
    return {"tp": tp, "pp": pp, "cp": cp, "ep": ep, "dp": dp, "etp": etp,
            "ep_groups": experts.get_ranks("ep"), "edp_groups": experts.get_ranks("dp"),
            "micro_batch": micro.micro_batch_size, "accumulation": micro.get(),
            "vpp": cfg.virtual_pipeline_model_parallel_size or 1,
            "layers": _megatron_layers(cfg), "zero": zero,
            "grad_bytes": 4 if ddp.grad_reduce_in_fp32 or not (cfg.bf16 or cfg.fp16) else 2,
            "recompute": cfg.recompute_granularity or "none",
            "dtype": "fp8" if cfg.fp8 else "bf16" if cfg.bf16 else "fp16" if cfg.fp16
            else "fp32", "sequence_parallel": cfg.sequence_parallel,
            "dispatcher": cfg.moe_token_dispatcher_type if cfg.num_moe_experts else None,
            "moe_overlap": "a2a" if cfg.overlap_moe_expert_parallel_comm else
            "shared-expert" if cfg.moe_shared_expert_overlap else "none",
            "dropout": (cfg.hidden_dropout, cfg.attention_dropout),
            "overlap_grad_reduce": ddp.overlap_grad_reduce, "num_layers": cfg.num_layers,
            "attention": cfg.attention_backend.name, "qk_layernorm": cfg.qk_layernorm,
            "kv_channels": cfg.kv_channels, "cp_comm": cfg.cp_comm_type or "p2p",
            "recompute_modules": cfg.recompute_modules, "tp_overlap": cfg.tp_comm_overlap}


def torchtitan_parsed(folder: Path, module: str, fn: str, world: int) -> dict[str, Any]:
    """Load the config module the way torchtitan's trainer does (ConfigManager with
    --module/--config), validate the mesh (ParallelDims) and do the trainer's batch
    arithmetic; build the model on the meta device to count its parameters."""
    from torchtitan.config import ConfigManager
    from torchtitan.distributed import ParallelDims
    from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC

    sys.path.insert(0, str(folder))
    try:
        cfg = ConfigManager().parse_args(["--module", module, "--config", fn])
    finally:
        sys.path.remove(str(folder))
        sys.modules.pop(module, None)
    par, train = cfg.parallelism, cfg.training
    dims = ParallelDims.from_config(par, world)
    batch = dims.dp_replicate * dims.dp_shard
    assert train.global_batch_size % (train.local_batch_size * batch) == 0
    accumulation = train.global_batch_size // (train.local_batch_size * batch)
    parts = par.module_fqns_per_model_part or [["layers"]]
    cfg.model_spec.model.update_from_config(config=cfg)  # the trainer's own checks
    with torch.device("meta"):
        model = cfg.model_spec.model.build()
    ac = cfg.activation_checkpoint
    return {"tp": dims.tp, "pp": dims.pp, "cp": dims.cp, "ep": dims.ep, "dp": batch,
            "micro_batch": par.pipeline_parallel_microbatch_size if dims.pp > 1
            else train.local_batch_size,
            "accumulation": accumulation * (train.local_batch_size
                                            // par.pipeline_parallel_microbatch_size
                                            if dims.pp > 1 else 1),
            "vpp": len(parts) // dims.pp if dims.pp > 1 else 1,
            "grad_bytes": {"float32": 4, "bfloat16": 2}[train.mixed_precision_reduce],
            "layers": [sum(1 for m in p if m.startswith("layers.")) for p in parts]
            if dims.pp > 1 else None,
            # "never" is ZeRO-2's program and ZeRO-3's keeping gathered weights alike
            "zero": 0 if dims.dp_shard == 1 else
            3 if par.fsdp_reshard_after_forward == "always" else 2,
            "reshard": par.fsdp_reshard_after_forward,
            "recompute": "full" if isinstance(ac, FullAC.Config) else
            "selective" if isinstance(ac, SelectiveAC.Config) else "none",
            "dtype": "fp8" if "Float8" in repr(cfg.model_spec.model) else
            "bf16" if train.mixed_precision_param == "bfloat16" else "fp32",
            "sequence_parallel": par.enable_sequence_parallel and dims.tp > 1,
            "schedule": par.pipeline_parallel_schedule,
            "tp_overlap": cfg.compile.enable_async_tensor_parallel and cfg.compile.enable,
            "params": sum(p.numel() for p in model.parameters())}


def deepspeed_parsed(cfg: dict[str, Any], world: int) -> dict[str, Any]:
    """DeepSpeedConfig as ``deepspeed.initialize`` builds it with no mpu: the data-parallel
    size is the world size (DeepSpeed asks the communication layer; a single gloo process
    stands in, so the test states the world through the mpu interface DeepSpeed reads)."""
    import deepspeed.runtime.config as ds

    class WorldOfDataParallelRanks:  # what DeepSpeed derives when tp = pp = 1
        def get_data_parallel_world_size(self) -> int:
            return world

        def get_data_parallel_rank(self) -> int:
            return 0

        def get_model_parallel_world_size(self) -> int:
            return 1

        def get_model_parallel_rank(self) -> int:
            return 0

    parsed = ds.DeepSpeedConfig(dict(cfg), mpu=WorldOfDataParallelRanks())
    return {"dp": parsed.world_size, "micro_batch": parsed.train_micro_batch_size_per_gpu,
            "accumulation": parsed.gradient_accumulation_steps,
            "zero": parsed.zero_optimization_stage,
            "dtype": "bf16" if parsed.bfloat16_config.enabled else
            "fp16" if parsed.float16_config.enabled else "fp32",
            "overlap_grad_reduce": parsed.zero_config.overlap_comm,
            # DeepSpeedEngine.communication_data_type: the config's, else the model dtype
            "grad_bytes": parsed.communication_data_type.itemsize
            if parsed.communication_data_type is not None else
            2 if parsed.bfloat16_config.enabled or parsed.float16_config.enabled else 4}


def torchrun_parsed(text: str) -> dict[str, Any]:
    """torchrun's own argument parser over the launch line."""
    from torch.distributed.run import get_args_parser

    _, words = script_env_and_args(text, "torchrun")
    args = get_args_parser().parse_args(words)
    return {"nnodes": args.nnodes, "nproc_per_node": args.nproc_per_node,
            "module": args.module, "script": args.training_script,
            "script_args": args.training_script_args}
