"""Multi-head latent attention, multi-token prediction and expert groups (DeepSeek-V3):
the ModelSpec rules, parameters and FLOPs by hand and against published figures, the
simulation in both tiers, and what the exporters and the executor make of them."""

import dataclasses
import json
from pathlib import Path

import pytest

from sim import Plan, load_cluster, load_model, simulate
from sim.errors import SpecError
from sim.layout.flops import (
    attention_params,
    attention_replicated_params,
    megatron_flops_per_token,
    mtp_params,
)
from sim.layout.memory import layer_rank_params
from sim.layout.stages import pipeline_rank_layers, virtual_stage_moe
from sim.spec.hf_config import hf_config_to_spec
from sim.spec.model import ModelSpec

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = {e["name"]: e["config"] for e in json.loads(
    (ROOT / "experiments" / "data" / "moe_hf_configs.json").read_text())}
SMALL = dict(name="mla-moe", num_layers=4, hidden_size=512, num_heads=8, ffn_hidden_size=1024,
             vocab_size=4096, head_dim=32, q_lora_rank=128, kv_lora_rank=64,
             qk_rope_head_dim=16, v_head_dim=32, gated_mlp=True, norm="rmsnorm",
             position_embedding="rope", tied_embeddings=False, num_experts=8, top_k=2,
             moe_ffn_hidden_size=256, shared_expert_ffn_hidden_size=256,
             shared_expert_gate=False, mlp_only_layers=(0,))


def dsv3(**changes) -> ModelSpec:
    return dataclasses.replace(hf_config_to_spec(CONFIGS["DeepSeek-V3"], "DeepSeek-V3"),
                               **changes)


@pytest.mark.parametrize("changes,field", [
    ({"kv_lora_rank": 0}, "model.q_lora_rank"),  # the other MLA sizes need a latent
    ({"kv_lora_rank": 0, "q_lora_rank": 0}, "model.qk_rope_head_dim"),
    ({"v_head_dim": 0}, "model.v_head_dim"),
    ({"head_dim": 0}, "model.head_dim"),
    ({"num_kv_heads": 4}, "model.num_kv_heads"),
    ({"expert_groups": 3, "expert_groups_per_token": 1}, "model.expert_groups"),
    ({"expert_groups": 4, "expert_groups_per_token": 5}, "model.expert_groups_per_token"),
    ({"expert_groups_per_token": 2}, "model.expert_groups_per_token"),
    ({"expert_groups": 4, "expert_groups_per_token": 1, "top_k": 3}, "model.top_k"),
    ({"num_mtp_layers": -1}, "model.num_mtp_layers"),
    ({"kv_lora_rank": 2**21}, "model.kv_lora_rank"),
])
def test_bad_mla_fields_name_the_field(changes, field):
    with pytest.raises(SpecError) as err:
        ModelSpec(**{**SMALL, **changes})
    assert err.value.field == field and "\n" not in str(err.value)


def test_deepseek_v3_attention_and_mtp_by_hand():
    """Per layer: q down 7168x1536, its norm, q up 1536x(128x192); kv down
    7168x(512+64), its norm, kv up 512x(128x256); output 16384x7168. The MTP module: a
    2h x h projection, three norms and an MoE layer."""
    m = dsv3()
    q = 7168 * 1536 + 1536 + 1536 * 128 * 192
    kv = 7168 * 576 + 512 + 512 * 128 * 256
    assert attention_params(m) == q + kv + 128 * 128 * 7168 == 187_107_328
    assert attention_replicated_params(m) == 7168 * (1536 + 576) + 1536 + 512
    moe_layer = (187_107_328 + 256 * 7168 + 256 * 3 * 7168 * 2048 + 3 * 7168 * 2048
                 + 2 * 7168)
    assert mtp_params(m) == moe_layer + 2 * 7168**2 + 3 * 7168 == 11_610_067_968


def test_megatron_flops_of_a_dense_gpt_are_the_causal_closed_form():
    """Megatron-LM's count for a GPT: 72 l h^2 (1 + s/(12h) + V/(12 l h)) per token (its
    2024+ causal halving of the attention square)."""
    m = load_model("gpt3-175b")
    s, l_, h, v = 2048, m.num_layers, m.hidden_size, m.vocab_size
    want = 72 * l_ * h * h * (1 + s / (12 * h) + v / (12 * l_ * h))
    assert megatron_flops_per_token(m, s) == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize("name,tflops,tokens_per_s", [
    ("DeepSeek-V3", 216, 865), ("Qwen3-30B-A3B", 277, 12040)])
def test_megatron_flops_match_what_nemo_published(name, tflops, tokens_per_s):
    """NeMo Automodel's H100 rows (moe_calibration_h100.csv AM-1, AM-3): published TFLOP/s
    over published tokens/s is their FLOPs per token; DeepSeek-V3 without MTP."""
    m = hf_config_to_spec(CONFIGS[name], name)
    m = dataclasses.replace(m, num_mtp_layers=0)
    assert megatron_flops_per_token(m, 4096) == pytest.approx(tflops * 1e12 / tokens_per_s,
                                                              rel=2e-3)


def test_mtp_layers_run_on_the_last_stage_and_cost_time():
    m = ModelSpec(**SMALL, num_mtp_layers=1)
    plan = Plan(global_batch_size=32, seq_len=512, dp=4, pp=2, ep=2)
    stages = pipeline_rank_layers(plan, m)
    assert (stages[0].total, stages[1].total) == (2, 3) and stages[1].moe == 3
    assert virtual_stage_moe(plan, m)[-1] == [True, True, True]
    cluster = load_cluster("dgx-h100:1")
    without = ModelSpec(**SMALL)
    for tier in ("analytic", "des"):
        assert simulate(m, cluster, plan, tier).iteration_time_s > \
            simulate(without, cluster, plan, tier).iteration_time_s


@pytest.mark.parametrize("plan", [
    Plan(global_batch_size=64, seq_len=1024, dp=4, tp=2, pp=2, ep=2, sequence_parallel=True),
    Plan(global_batch_size=64, seq_len=1024, dp=8, pp=2, ep=4, zero_stage=1),
], ids=["tp2-ep2", "ep4-zero1"])
def test_mla_moe_simulates_alike_in_both_tiers(plan):
    m = ModelSpec(**SMALL, expert_groups=4, expert_groups_per_token=2, num_mtp_layers=1)
    cluster = load_cluster("dgx-h100:2")
    a, d = simulate(m, cluster, plan), simulate(m, cluster, plan, "des")
    assert d.iteration_time_s == pytest.approx(a.iteration_time_s, rel=0.02)
    assert a.fits_in_memory


def test_tensor_parallelism_keeps_mla_down_projections_whole():
    m = dsv3()
    one = layer_rank_params(m, Plan(8, 4096, dp=1), moe=False)[0]
    eight = layer_rank_params(m, Plan(8, 4096, tp=8, dp=1, sequence_parallel=True),
                              moe=False)[0]
    whole = attention_replicated_params(m)
    assert eight == pytest.approx((one - whole - 2 * 7168) / 8 + whole + 2 * 7168)


def test_megatron_core_reads_deepseek_v3_back():
    pytest.importorskip("megatron.core", reason="megatron-core not installed")
    from helpers.frameworks import _flags, _megatron_configs, megatron_parsed, script_env_and_args

    from optimizer.export import export

    m = dsv3()
    plan = Plan(global_batch_size=1024, seq_len=4096, dp=128, pp=16, ep=64, zero_stage=1,
                layers_per_stage=(3,) + (4,) * 14 + (2,))
    text = export("megatron", plan, m, load_cluster("dgx-h100:256"))["megatron_args.sh"]
    parsed = megatron_parsed(text, 2048)
    assert parsed["layers"] == list(plan.layers_per_stage) and parsed["ep"] == 64
    cfg, _ = _megatron_configs(_flags(script_env_and_args(text, "pretrain_gpt.py")[1]))
    assert (cfg.q_lora_rank, cfg.kv_lora_rank, cfg.qk_head_dim, cfg.qk_pos_emb_head_dim,
            cfg.v_head_dim) == (1536, 512, 128, 64, 128)
    assert cfg.mtp_num_layers == 1 and cfg.moe_shared_expert_intermediate_size == 2048
    assert (cfg.moe_router_num_groups, cfg.moe_router_group_topk) == (8, 4)
    assert not cfg.moe_shared_expert_gate


def test_executor_and_torchtitan_refuse_mla_by_name():
    from executor.capabilities import unsupported
    from optimizer.export import refusal

    plan = Plan(global_batch_size=8, seq_len=512, dp=2)
    m = ModelSpec(**{**SMALL, "num_experts": 0, "top_k": 0, "moe_ffn_hidden_size": 0,
                     "shared_expert_ffn_hidden_size": 0, "mlp_only_layers": ()})
    assert unsupported(m, plan)[0] == "model.kv_lora_rank"
    plain = dataclasses.replace(m, q_lora_rank=0, kv_lora_rank=0, qk_rope_head_dim=0,
                                v_head_dim=0, num_mtp_layers=1)
    assert unsupported(plain, plan)[0] == "model.num_mtp_layers"
    why = refusal("torchtitan", Plan(global_batch_size=8, seq_len=512, dp=2, zero_stage=3), m)
    assert why is not None and "standard attention" in str(why)
