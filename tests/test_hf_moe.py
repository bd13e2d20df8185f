"""sim.spec.hf_moe: the later MoE families' config.json, against published totals and
transformers' own models (built on the meta device in a subprocess)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.cli import assert_bad_input, cli

from sim.layout.flops import mtp_params, param_count
from sim.spec.hf_config import SUPPORTED_MODEL_TYPES, hf_config_to_spec

ROOT = Path(__file__).resolve().parent.parent
ENTRIES = json.loads((ROOT / "experiments" / "data" / "moe_hf_configs.json").read_text())


@pytest.mark.parametrize("entry", ENTRIES, ids=[e["name"] for e in ENTRIES])
def test_totals_within_half_a_percent_of_published(entry):
    spec = hf_config_to_spec(entry["config"], entry["name"])
    assert spec.is_moe
    if entry["published_total"]:
        # published totals leave DeepSeek-V3's multi-token prediction module out
        total = param_count(spec) - mtp_params(spec)
        assert total == pytest.approx(entry["published_total"], rel=5e-3)


def test_same_parameters_as_transformers_builds():
    """Equal for DeepSeek-V3, Qwen3-MoE, OLMoE and Llama 4; within 4e-6 where a ModelSpec
    cannot hold a piece (gpt-oss's sinks and router biases, DBRX's bias-free LayerNorms)."""
    pytest.importorskip("transformers")
    code = ("import sys; sys.path.insert(0, 'experiments'); import moe_configs as m; "
            "import json; print(json.dumps(m.table()[['model', 'vs_transformers']]"
            ".values.tolist()))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, timeout=300, check=True).stdout
    diffs = dict(json.loads(out.strip().splitlines()[-1]))
    assert diffs["Qwen3-235B-A22B"] == 0 and diffs["Qwen3-30B-A3B"] == 0
    assert diffs["OLMoE-1B-7B"] == 0 and diffs["DeepSeek-V3"] == 0
    assert diffs["Llama-4-Scout"] == 0 and diffs["Llama-4-Maverick"] == 0
    assert all(abs(d) < 4e-6 for d in diffs.values()), diffs


def test_families_are_supported():
    for t in ("qwen3_moe", "olmoe", "gpt_oss", "dbrx", "llama4", "llama4_text", "deepseek_v3"):
        assert t in SUPPORTED_MODEL_TYPES


def test_deepseek_v3_structure():
    """MLA sizes, three dense layers first, one ungated shared expert, 8 groups with 4 per
    token, one MTP module; transformers' defaults fill a bare config (they are V3's)."""
    spec = hf_config_to_spec({"model_type": "deepseek_v3"}, "dsv3")
    assert (spec.q_lora_rank, spec.kv_lora_rank, spec.head_dim, spec.qk_rope_head_dim,
            spec.v_head_dim) == (1536, 512, 128, 64, 128)
    assert spec.head_size == 192 and spec.q_dim == 128 * 192 and spec.o_dim == 128 * 128
    assert spec.mlp_only_layers == (0, 1, 2) and spec.num_moe_layers == 58
    assert spec.shared_expert_ffn_hidden_size == 2048 and not spec.shared_expert_gate
    assert (spec.expert_groups, spec.expert_groups_per_token, spec.num_mtp_layers) == (8, 4, 1)
    lite = hf_config_to_spec({"model_type": "deepseek_v3", "q_lora_rank": None,
                              "num_nextn_predict_layers": 0, "n_group": None}, "lite")
    assert lite.q_lora_rank == 0 and lite.num_mtp_layers == 0 and lite.expert_groups == 0


def test_llama4_reads_its_text_config_and_interleaving():
    text = next(e["config"] for e in ENTRIES if e["name"] == "Llama-4-Maverick")
    spec = hf_config_to_spec({"model_type": "llama4", "text_config": text}, "maverick")
    assert spec.num_moe_layers == 24 and spec.ffn_hidden_size == 16384
    assert spec.shared_expert_ffn_hidden_size == spec.moe_ffn_hidden_size == 8192


def test_gpt_oss_alternating_windows():
    cfg = next(e["config"] for e in ENTRIES if e["name"] == "gpt-oss-120b")
    spec = hf_config_to_spec(cfg, "gpt-oss-120b")
    assert spec.sliding_window == 128 and spec.sliding_window_layers == 18
    assert spec.linear_bias and spec.top_k == 4 and spec.num_experts == 128


@pytest.mark.parametrize("cfg,field", [
    ({"model_type": "dbrx", "d_model": 64, "n_heads": 4, "n_layers": 2, "vocab_size": 100,
      "attn_config": 3}, "attn_config"),
    ({"model_type": "llama4"}, "text_config"),
    ({"model_type": "qwen3_moe", "hidden_size": 64, "num_hidden_layers": 2,
      "num_attention_heads": 4, "vocab_size": 100, "num_experts": 8,
      "num_experts_per_tok": 0, "moe_intermediate_size": 32}, "num_experts_per_tok"),
    ({"model_type": "deepseek_v3", "q_lora_rank": 0}, "q_lora_rank"),
    ({"model_type": "deepseek_v3", "kv_lora_rank": 0}, "kv_lora_rank"),
    ({"model_type": "deepseek_v3", "n_group": 7}, "model.expert_groups"),
    ({"model_type": "deepseek_v3", "topk_group": 9}, "model.expert_groups_per_token"),
    ({"model_type": "deepseek_v3", "num_experts_per_tok": 300}, "model.top_k"),
    ({"model_type": "deepseek_v3", "attention_bias": True}, "attention_bias"),
    ({"model_type": "deepseek_v3", "num_key_value_heads": 16}, "model.num_kv_heads"),
])
def test_bad_moe_configs_are_one_line(capsys, tmp_path, cfg, field):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    rc, out, err = cli(capsys, "models", "--model", str(path))
    assert_bad_input(rc, out, err, field)
