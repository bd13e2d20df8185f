"""sim.spec.hf_moe: the later MoE families' config.json, against published totals and
transformers' own models (built on the meta device in a subprocess)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.cli import assert_bad_input, cli

from sim.errors import SpecError
from sim.layout.flops import param_count
from sim.spec.hf_config import SUPPORTED_MODEL_TYPES, hf_config_to_spec

ROOT = Path(__file__).resolve().parent.parent
ENTRIES = json.loads((ROOT / "experiments" / "data" / "moe_hf_configs.json").read_text())


@pytest.mark.parametrize("entry", ENTRIES, ids=[e["name"] for e in ENTRIES])
def test_totals_within_half_a_percent_of_published(entry):
    spec = hf_config_to_spec(entry["config"], entry["name"])
    assert spec.is_moe
    if entry["published_total"]:
        assert param_count(spec) == pytest.approx(entry["published_total"], rel=5e-3)


def test_same_parameters_as_transformers_builds():
    """Equal for Qwen3-MoE and OLMoE; within 4e-6 where a ModelSpec cannot hold a piece
    (gpt-oss's sinks and router biases, DBRX's bias-free LayerNorms, Llama 4's
    shared-expert gate)."""
    pytest.importorskip("transformers")
    code = ("import sys; sys.path.insert(0, 'experiments'); import moe_configs as m; "
            "import json; print(json.dumps(m.table()[['model', 'vs_transformers']]"
            ".values.tolist()))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, timeout=300, check=True).stdout
    diffs = dict(json.loads(out.strip().splitlines()[-1]))
    assert diffs["Qwen3-235B-A22B"] == 0 and diffs["Qwen3-30B-A3B"] == 0
    assert diffs["OLMoE-1B-7B"] == 0
    assert all(abs(d) < 4e-6 for d in diffs.values()), diffs


def test_families_are_supported_and_deepseek_says_why_not():
    for t in ("qwen3_moe", "olmoe", "gpt_oss", "dbrx", "llama4", "llama4_text"):
        assert t in SUPPORTED_MODEL_TYPES
    with pytest.raises(SpecError, match="multi-head latent attention"):
        hf_config_to_spec({"model_type": "deepseek_v3", "hidden_size": 7168}, "dsv3")


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
])
def test_bad_moe_configs_are_one_line(capsys, tmp_path, cfg, field):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    rc, out, err = cli(capsys, "models", "--model", str(path))
    assert_bad_input(rc, out, err, field)
