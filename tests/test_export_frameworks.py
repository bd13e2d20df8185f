"""Exports handed to the frameworks' own validation (the ``export-check`` extra: DeepSpeed,
megatron-core, torchtitan; ``make test`` installs it). Each test skips, saying why, where
its framework is not installed; the documented rules are checked in test_optimizer.py."""

import os
import tomllib

import pytest
import torch

from optimizer.export import deepspeed_config, megatron_args, torchtitan_toml
from sim import Plan, load_model

L8 = load_model("llama3-8b")
PLAN = Plan(global_batch_size=64, seq_len=4096, dp=2, tp=4, pp=2, vpp=2,
            schedule="interleaved-1f1b", sequence_parallel=True, recompute="full",
            zero_stage=1)


class _MPU:
    def __init__(self, dp: int) -> None:
        self.dp = dp

    def get_data_parallel_world_size(self) -> int:
        return self.dp

    def get_data_parallel_rank(self) -> int:
        return 0

    def get_model_parallel_world_size(self) -> int:
        return 1

    def get_model_parallel_rank(self) -> int:
        return 0


@pytest.fixture
def deepspeed_comm():
    """DeepSpeed reads the data-parallel size from its communication layer: start it as a
    single gloo process (the size itself comes from the mpu below)."""
    pytest.importorskip("deepspeed", reason="DeepSpeed not installed (pip install -e "
                        "'.[export-check]')")
    import deepspeed.comm as dscomm
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29581", RANK="0", WORLD_SIZE="1",
                      LOCAL_RANK="0")
    dscomm.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
    yield
    dist.destroy_process_group()


def test_deepspeed_parses_the_config(deepspeed_comm):
    import deepspeed.runtime.config as ds

    cfg = deepspeed_config(PLAN)
    dp = cfg.pop("trainsim_notes")["data_parallel_size"]
    parsed = ds.DeepSpeedConfig(cfg, mpu=_MPU(dp))
    assert parsed.train_batch_size == 64 and parsed.gradient_accumulation_steps == 32
    assert parsed.zero_optimization_stage == 1
    with pytest.raises(AssertionError):  # it does check: a wrong accumulation is refused
        ds.DeepSpeedConfig({**cfg, "gradient_accumulation_steps": 31}, mpu=_MPU(dp))


def _flags(args: list[str]) -> dict[str, str]:
    return dict(a.split(" ", 1) for a in args if " " in a)


def test_megatron_core_accepts_the_arguments():
    core = pytest.importorskip("megatron.core.transformer", reason="megatron-core not "
                               "installed (pip install -e '.[export-check]')")
    f = _flags(megatron_args(PLAN, L8))
    layers = int(f["--num-layers"])
    per_virtual = int(f["--num-layers-per-virtual-pipeline-stage"])
    cfg = core.TransformerConfig(
        num_layers=layers, hidden_size=int(f["--hidden-size"]),
        num_attention_heads=int(f["--num-attention-heads"]),
        num_query_groups=int(f["--num-query-groups"]),
        ffn_hidden_size=int(f["--ffn-hidden-size"]),
        tensor_model_parallel_size=int(f["--tensor-model-parallel-size"]),
        pipeline_model_parallel_size=int(f["--pipeline-model-parallel-size"]),
        virtual_pipeline_model_parallel_size=layers // (int(
            f["--pipeline-model-parallel-size"]) * per_virtual),
        context_parallel_size=int(f["--context-parallel-size"]),
        sequence_parallel="--sequence-parallel" in megatron_args(PLAN, L8),
        pipeline_dtype=torch.bfloat16 if "--bf16" in megatron_args(PLAN, L8) else torch.float16,
        recompute_granularity=f["--recompute-granularity"],
        recompute_method=f["--recompute-method"],
        recompute_num_layers=int(f["--recompute-num-layers"]))
    assert cfg.tensor_model_parallel_size == 4
    with pytest.raises(ValueError):  # it does check: heads must divide over TP
        core.TransformerConfig(num_layers=32, hidden_size=4096, num_attention_heads=30,
                               ffn_hidden_size=14336, tensor_model_parallel_size=4)


def test_torchtitan_accepts_the_parallel_dims():
    dims = pytest.importorskip("torchtitan.distributed", reason="torchtitan not installed "
                               "(pip install -e '.[export-check]')")
    par = tomllib.loads(torchtitan_toml(PLAN))["parallelism"]
    dims.ParallelDims(dp_replicate=par["data_parallel_replicate_degree"],
                      dp_shard=par["data_parallel_shard_degree"],
                      cp=par["context_parallel_degree"], tp=par["tensor_parallel_degree"],
                      pp=par["pipeline_parallel_degree"], ep=par["expert_parallel_degree"],
                      world_size=16)
    with pytest.raises(AssertionError):  # it does check the product
        dims.ParallelDims(dp_replicate=1, dp_shard=3, cp=1, tp=4, pp=2, ep=1, world_size=16)
