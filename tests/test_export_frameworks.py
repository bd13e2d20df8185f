"""Exports handed to each framework's own front door (``make test`` installs them: the
``export-check`` extra) and read back: every (format x plan) below is either accepted with
the parsed values equal to the plan's, or refused naming the field. Each test skips, saying
why, where its framework is not installed."""

from __future__ import annotations

import json
import os
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from optimizer.export import export
from sim import Plan, load_cluster, load_model
from sim.errors import SpecError
from sim.layout.flops import param_count
from sim.layout.stages import virtual_stage_layers
from sim.spec.experts import expert_tp

# The six plans of the exports table (docs/guide/optimizer.md); the search's Megatron-LM
# winner is the seventh (test_optimizer_constraints.py).
PLANS: dict[str, tuple[str, str, Plan]] = {
    "gpt3-175b tp8 pp16 dp8 sp zero1": ("gpt3-175b", "dgx-a100:128", Plan(
        1536, 2048, 1, dp=8, tp=8, pp=16, sequence_parallel=True, zero_stage=1,
        recompute="full")),
    "llama3-70b tp8 pp2 vpp4 dp8": ("llama3-70b", "dgx-h100:16", Plan(
        512, 4096, 1, dp=8, tp=8, pp=2, vpp=4, schedule="interleaved-1f1b",
        sequence_parallel=True)),
    "llama3-8b fsdp dp16": ("llama3-8b", "dgx-h100:2", Plan(64, 4096, 1, dp=16, zero_stage=3)),
    "llama3-8b fsdp dp16 fp32 grads": ("llama3-8b", "dgx-h100:2", Plan(
        64, 4096, 1, dp=16, zero_stage=3, grad_reduce_dtype="fp32")),
    "mixtral-8x7b ep8 tp2": ("mixtral-8x7b", "dgx-h100:4", Plan(
        256, 4096, 1, dp=16, tp=2, ep=8, sequence_parallel=True, zero_stage=1)),
    "llama3-8b tp4 cp2 seq16k": ("llama3-8b", "dgx-h100:2", Plan(
        32, 16384, 1, dp=2, tp=4, cp=2, sequence_parallel=True)),
    "llama3-70b tp8 pp2 uneven": ("llama3-70b", "dgx-h100:16", Plan(
        512, 4096, 2, dp=8, tp=8, pp=2, sequence_parallel=True, recompute="full",
        layers_per_stage=(39, 41), zero_stage=1)),
    "llama3-70b tp8 fsdp async tp": ("llama3-70b", "dgx-h100:16", Plan(
        256, 8192, 1, dp=16, tp=8, sequence_parallel=True, zero_stage=3, recompute="full",
        tp_overlap=True)),
}
# format -> plan -> None (accepted) or the field its one-line refusal names
EXPECTED: dict[str, dict[str, str | None]] = {
    "megatron": dict.fromkeys(PLANS),
    "torchtitan": {"gpt3-175b tp8 pp16 dp8 sp zero1": "model",
                   "llama3-70b tp8 pp2 vpp4 dp8": None, "llama3-8b fsdp dp16": None,
                   "llama3-8b fsdp dp16 fp32 grads": None,
                   "mixtral-8x7b ep8 tp2": "model",
                   "llama3-8b tp4 cp2 seq16k": "plan.zero_stage",
                   "llama3-70b tp8 pp2 uneven": "plan.zero_stage",
                   "llama3-70b tp8 fsdp async tp": None},
    "deepspeed": {"gpt3-175b tp8 pp16 dp8 sp zero1": "plan.tp",
                  "llama3-70b tp8 pp2 vpp4 dp8": "plan.tp", "llama3-8b fsdp dp16": None,
                  "llama3-8b fsdp dp16 fp32 grads": None,
                  "mixtral-8x7b ep8 tp2": "plan.tp", "llama3-8b tp4 cp2 seq16k": "plan.tp",
                  "llama3-70b tp8 pp2 uneven": "plan.tp",
                  "llama3-70b tp8 fsdp async tp": "plan.tp"},
}


def _expected(plan: Plan, model: Any) -> dict[str, Any]:
    return {"tp": plan.tp, "pp": plan.pp, "cp": plan.cp, "ep": plan.ep, "dp": plan.dp,
            "micro_batch": plan.micro_batch_size, "accumulation": plan.num_microbatches,
            "vpp": plan.vpp, "layers": virtual_stage_layers(plan, model),
            "zero": plan.zero_stage, "recompute": plan.recompute, "dtype": plan.dtype,
            "sequence_parallel": plan.sequence_parallel,
            "overlap_grad_reduce": plan.overlap_grad_reduce, "grad_bytes": plan.grad_bytes,
            "tp_overlap": plan.tp_overlap}


def _case(name: str, fmt: str) -> tuple[Any, Any, Plan, dict[str, str] | None]:
    model_name, cluster_name, plan = PLANS[name]
    model, cluster = load_model(model_name), load_cluster(cluster_name)
    refused = EXPECTED[fmt][name]
    if refused is not None:
        with pytest.raises(SpecError) as err:
            export(fmt, plan, model, cluster)
        assert err.value.field == refused and "\n" not in str(err.value)
        return model, cluster, plan, None
    return model, cluster, plan, export(fmt, plan, model, cluster)


def _same(parsed: dict[str, Any], want: dict[str, Any]) -> None:
    missing = sorted(set(want) - set(parsed))
    assert not missing, f"the framework's parsed config lacks {missing}"
    diff = {k: (parsed[k], want[k]) for k in want if parsed[k] != want[k]}
    assert not diff, f"framework parsed != plan: {diff}"


@pytest.mark.parametrize("name", list(PLANS))
def test_megatron_core_reads_the_arguments_back(name):
    pytest.importorskip("megatron.core", reason="megatron-core not installed (pip install -e "
                        "'.[export-check]')")
    from helpers.frameworks import megatron_parsed

    model, cluster, plan, files = _case(name, "megatron")
    assert files is not None
    parsed = megatron_parsed(files["megatron_args.sh"], cluster.world_size)
    _same(parsed, {**_expected(plan, model), "etp": expert_tp(plan)})
    rate = 0.1 if model.dropout else 0.0  # Megatron-LM's default is 0.1 for every model
    assert parsed["dropout"] == (rate, rate) and parsed["num_layers"] == model.num_layers
    assert parsed["dispatcher"] == ("alltoall" if model.is_moe else None)
    assert parsed["attention"] == ("flash" if plan.attention == "flash" else "local")


def test_megatron_core_refuses_what_it_should():
    """The front door does check: heads not divisible by TP (megatron-core), and a flag
    that neither megatron-core nor the training script reads (the old ``--use-flash-attn``:
    Megatron-LM 0.16 still parses it, but nothing reads it)."""
    pytest.importorskip("megatron.core", reason="megatron-core not installed")
    from helpers.frameworks import megatron_parsed

    model, cluster, plan, files = _case("llama3-8b tp4 cp2 seq16k", "megatron")
    assert files is not None
    text = files["megatron_args.sh"]
    with pytest.raises(ValueError):
        megatron_parsed(text.replace("--num-attention-heads 32", "--num-attention-heads 30"),
                        cluster.world_size)
    with pytest.raises(AssertionError, match="use_flash_attn"):
        megatron_parsed(text.replace("--bf16", "--bf16 --use-flash-attn"), cluster.world_size)


@pytest.mark.parametrize("name", list(PLANS))
def test_torchtitan_loads_the_config_module(name, tmp_path):
    pytest.importorskip("torchtitan.config", reason="torchtitan not installed (pip install -e "
                        "'.[export-check]')")
    pytest.importorskip("triton", reason="torchtitan 0.3.0's models import triton")
    from helpers.frameworks import torchtitan_parsed

    from optimizer.export.torchtitan import CONFIG_FN, MODULE

    model, cluster, plan, files = _case(name, "torchtitan")
    if files is None:
        return
    for file, text in files.items():
        (tmp_path / file).write_text(text)
    parsed = torchtitan_parsed(tmp_path, MODULE, CONFIG_FN, cluster.world_size)
    want = _expected(plan, model)
    want.pop("overlap_grad_reduce")  # always on in torchtitan (false is refused)
    if plan.grad_reduce_dtype is None:  # torchtitan reduces in fp32 only: the script says so
        want["grad_bytes"] = 4
        assert "torchtitan reduces gradients in float32" in files["torchtitan.sh"]
    if plan.pp == 1:
        want.pop("layers")
    want["reshard"] = parsed["reshard"]  # read back below
    _same(parsed, want)
    assert parsed["params"] == param_count(model)  # the same architecture, built by torchtitan


@pytest.mark.parametrize("keep", [False, True])
def test_torchtitan_reads_back_whether_zero3_keeps_gathered_weights(keep, tmp_path):
    """FSDP2's flag as torchtitan parses it: ZeRO-3 reshards after forward ("always"),
    keeping the gathered weights is "never" (the program trainsim's ZeRO-2 exports too)."""
    pytest.importorskip("torchtitan.config", reason="torchtitan not installed (pip install -e "
                        "'.[export-check]')")
    pytest.importorskip("triton", reason="torchtitan 0.3.0's models import triton")
    from helpers.frameworks import torchtitan_parsed

    from optimizer.export.torchtitan import CONFIG_FN, MODULE

    plan = Plan(64, 4096, 1, dp=16, zero_stage=3, reshard_after_forward=not keep)
    for file, text in export("torchtitan", plan, load_model("llama3-8b"),
                             load_cluster("dgx-h100:2")).items():
        (tmp_path / file).write_text(text)
    parsed = torchtitan_parsed(tmp_path, MODULE, CONFIG_FN, 16)
    assert parsed["reshard"] == ("never" if keep else "always")
    assert (parsed["dp"], parsed["zero"]) == (16, 2 if keep else 3)


@pytest.fixture
def deepspeed_comm():
    """DeepSpeed asks its communication layer for the rank: a single gloo process."""
    pytest.importorskip("deepspeed", reason="DeepSpeed not installed (pip install -e "
                        "'.[export-check]')")
    import deepspeed.comm as dscomm
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29581", RANK="0", WORLD_SIZE="1",
                      LOCAL_RANK="0")
    dscomm.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
    yield
    dist.destroy_process_group()


@pytest.mark.parametrize("name", list(PLANS))
def test_deepspeed_parses_the_config(name, deepspeed_comm):
    from helpers.frameworks import deepspeed_parsed

    model, cluster, plan, files = _case(name, "deepspeed")
    if files is None:
        return
    cfg = json.loads(files["deepspeed_config.json"])
    # the config holds the data-parallel side only; the export refuses every other degree
    want = {k: v for k, v in _expected(plan, model).items()
            if k in ("dp", "micro_batch", "accumulation", "zero", "dtype", "grad_bytes")}
    assert (plan.tp, plan.pp, plan.cp, plan.ep, plan.recompute) == (1, 1, 1, 1, "none")
    _same(deepspeed_parsed(cfg, cluster.world_size), want)
    with pytest.raises(AssertionError):  # it does check: a wrong accumulation is refused
        deepspeed_parsed({**cfg, "gradient_accumulation_steps": 31}, cluster.world_size)


def test_torchrun_parses_the_launch_line_and_the_worker_reads_its_config(tmp_path: Path):
    from helpers.frameworks import torchrun_parsed

    from executor.export import torchrun_files
    from executor.worker import Runner  # noqa: F401  (the worker module imports)

    model, cluster, plan = load_model("llama3-8b"), load_cluster("dgx-h100:2"), \
        PLANS["llama3-8b fsdp dp16"][2]
    files = torchrun_files(plan, model, cluster)
    parsed = torchrun_parsed(files["torchrun.sh"])
    assert (parsed["nnodes"], parsed["nproc_per_node"]) == ("2", "8")
    assert parsed["module"] and parsed["script"] == "executor.worker"
    cfg = json.loads(files["executor_config.json"])
    assert Plan.from_dict(cfg["plan"]) == plan and cfg["model"] == model.to_dict()


# Hugging Face types with parts beyond Llama's layer: expressed where the framework builds
# them (Qwen 3's per-head query/key norms), refused by name where it does not.
NEW_TYPES = {"qwen3-8b": ("QWEN3_8B", {"megatron": None, "torchtitan": "model",
                                       "torchrun": "model.qk_norm"}),
             "gemma2-9b": ("GEMMA2_9B", {"megatron": "model.norms_per_layer",
                                         "torchtitan": "model",
                                         "torchrun": "model.norms_per_layer"}),
             "olmo2-7b": ("OLMO2_7B", {"megatron": "model.qk_norm", "torchtitan": "model",
                                       "torchrun": "model.qk_norm"})}


@pytest.mark.parametrize("name", list(NEW_TYPES))
def test_new_model_types_expressed_or_refused_by_name(name):
    import test_hf_config

    from executor.export import torchrun_files
    from sim.spec.hf_config import hf_config_to_spec

    config, expected = NEW_TYPES[name]
    model = hf_config_to_spec(getattr(test_hf_config, config), name)
    cluster, plan = load_cluster("dgx-h100:2"), Plan(64, 4096, 1, dp=8, tp=2, zero_stage=2)
    for fmt, field in expected.items():
        if field is None:
            files = export(fmt, plan, model, cluster)
            assert "--qk-layernorm" in files["megatron_args.sh"]
            continue
        with pytest.raises(SpecError) as err:
            (torchrun_files if fmt == "torchrun" else partial(export, fmt))(plan, model, cluster)
        assert err.value.field == field and "\n" not in str(err.value), (fmt, str(err.value))


def test_megatron_core_builds_qwen3s_query_key_norms():
    pytest.importorskip("megatron.core", reason="megatron-core not installed")
    import test_hf_config
    from helpers.frameworks import megatron_parsed

    from sim.spec.hf_config import hf_config_to_spec

    model = hf_config_to_spec(test_hf_config.QWEN3_8B, "qwen3-8b")
    files = export("megatron", Plan(64, 4096, 1, dp=8, tp=2), model, load_cluster("dgx-h100:2"))
    parsed = megatron_parsed(files["megatron_args.sh"], 16)
    assert parsed["qk_layernorm"] is True and parsed["kv_channels"] == model.head_size == 128


def test_megatron_fsdp_and_local_attention_pass_validate_args_rules():
    """Megatron-FSDP (ZeRO-2/3) with TP: the fsdp_dtensor checkpoint format and no
    CUDA_DEVICE_MAX_CONNECTIONS=1 (validate_args asserts both); standard attention: the local
    backend with the local layer spec (validate_args asserts it)."""
    pytest.importorskip("megatron.core", reason="megatron-core not installed")
    from helpers.frameworks import megatron_parsed

    model, cluster = load_model("llama3-70b"), load_cluster("dgx-h100:16")
    plan = Plan(512, 4096, 1, dp=64, tp=2, zero_stage=3, attention="standard")
    text = export("megatron", plan, model, cluster)["megatron_args.sh"]
    assert "CUDA_DEVICE_MAX_CONNECTIONS" not in text and "--ckpt-format fsdp_dtensor" in text
    assert "--spec local" in text
    parsed = megatron_parsed(text, cluster.world_size)
    assert (parsed["zero"], parsed["tp"], parsed["attention"]) == (3, 2, "local")
    with pytest.raises(AssertionError, match="Megatron-FSDP refuses 1"):
        megatron_parsed("export CUDA_DEVICE_MAX_CONNECTIONS=1\n" + text, cluster.world_size)


@pytest.mark.parametrize("fmt, model_name, cluster_name, plan, field", [
    ("torchtitan", "tiny", "cpu:4", Plan(8, 256, 1, dp=2, pp=2, zero_stage=2), "plan.pp"),
    ("deepspeed", "llama3-8b", "dgx-h100:2", Plan(64, 4096, 1, dp=16), "plan.overlap_grad_reduce"),
    ("deepspeed", "llama3-8b", "dgx-h100:2", Plan(64, 4096, 1, dp=16, zero_stage=1,
                                                  collectives=(("dp", "tree"),)),
     "plan.collectives"),
])
def test_refused_where_the_framework_would_do_otherwise(fmt, model_name, cluster_name, plan,
                                                        field):
    with pytest.raises(SpecError) as err:
        export(fmt, plan, load_model(model_name), load_cluster(cluster_name))
    assert err.value.field == field and "\n" not in str(err.value)


@pytest.mark.parametrize("model_name, changes, field", [
    ("llama3-8b", {"dtype": "fp16"}, "plan.dtype"),
    ("llama3-8b", {"attention": "standard"}, "plan.attention"),
    ("llama3-8b", {"overlap_grad_reduce": False}, "plan.overlap_grad_reduce"),
    ("llama3-8b", {"seq_len": 16384}, "plan.seq_len"),
    ("gpt3-175b", {}, "model.dropout"),
])
def test_torchrun_refuses_what_the_worker_would_run_differently(model_name, changes, field):
    import dataclasses

    from executor.export import torchrun_files

    plan = dataclasses.replace(Plan(64, 2048, 1, dp=16, zero_stage=3), **changes)
    with pytest.raises(SpecError) as err:
        torchrun_files(plan, load_model(model_name), load_cluster("dgx-h100:2"))
    assert err.value.field == field


def test_torchrun_writes_no_rank_table_the_worker_places_ranks_itself():
    from executor.export import torchrun_files

    plan = Plan(8, 256, 1, dp=2, tp=2, pp=2, zero_stage=2, placement="pp-dp-cp-ep-tp")
    files = torchrun_files(plan, load_model("tiny"), load_cluster("cpu:8"))
    assert set(files) == {"executor_config.json", "torchrun.sh"}
