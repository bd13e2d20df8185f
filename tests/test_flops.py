import pytest
from megatron_sc21 import eq3_flops, load_rows, row_model

from sim.layout.flops import (
    active_param_count,
    forward_flops_per_token,
    hardware_flops_per_token,
    model_flops_per_token,
    param_count,
)
from sim.spec.model import ModelSpec
from sim.spec.zoo import load_zoo

ROWS = load_rows()


@pytest.mark.parametrize("row", ROWS, ids=[r["params_B"] for r in ROWS])
def test_megatron_table1_param_counts(row):
    """Within 0.5%, or within the rounding of the published figure (one decimal of a
    billion: 1.652 B prints as "1.7" and 3.562 B as "3.6")."""
    published = float(row["params_B"]) * 1e9
    ours = param_count(row_model(row))
    assert abs(ours - published) <= max(0.005 * published, 0.05e9)


def test_megatron_param_formula_exactly():
    # Narayanan et al.: P = 12 l h^2 (1 + 13/(12h) + (V + s)/(12 l h)), plus the final norm.
    n, h, v, s = 96, 12288, 51200, 2048
    m = ModelSpec("g", n, h, 96, 4 * h, v, max_seq_len=s, linear_bias=True)
    assert param_count(m) == 12 * n * h * h + 13 * n * h + (v + s) * h + 2 * h


@pytest.mark.parametrize("name,published", [
    ("llama3-8b", 8_030_261_248), ("llama3-70b", 70_553_706_496),
    ("llama3-405b", 405_853_388_800), ("mixtral-8x7b", 46_702_792_704)])
def test_zoo_param_counts_match_published(name, published):
    assert param_count(load_zoo(name)) == published


def test_gpt3_175b():
    assert param_count(load_zoo("gpt3-175b")) == pytest.approx(174.6e9, rel=1e-3)


def test_tiny_is_a_few_million():
    assert 1e6 < param_count(load_zoo("tiny")) < 10e6


def test_mixtral_active_params():
    assert active_param_count(load_zoo("mixtral-8x7b")) == 12_879_925_248


@pytest.mark.parametrize("row", ROWS[:4], ids=[r["params_B"] for r in ROWS[:4]])
def test_hardware_flops_with_full_recompute_equal_eq3(row):
    m = row_model(row)
    tokens = int(row["global_batch_seqs"]) * int(row["seq_len"])
    ours = hardware_flops_per_token(m, int(row["seq_len"]), "full") * tokens
    assert ours == pytest.approx(eq3_flops(row), rel=1e-12)


def test_model_flops_match_the_mfu_formula():
    # 72 B s l h^2 (1 + s/(6h) + V/(12 l h)) for one sequence (B = 1)
    n, h, v, s = 24, 2304, 51200, 2048
    m = ModelSpec("g", n, h, 24, 4 * h, v, max_seq_len=s)
    expected = 72 * s * n * h * h * (1 + s / (6 * h) + v / (12 * n * h))
    assert model_flops_per_token(m, s) * s == pytest.approx(expected, rel=1e-12)


def test_selective_recompute_adds_attention_core_only():
    m = load_zoo("llama3-8b")
    extra = hardware_flops_per_token(m, 4096, "selective") - model_flops_per_token(m, 4096)
    assert extra == 32 * 4 * 4096 * 4096


def test_forward_flops_is_two_per_active_weight_plus_attention():
    m = load_zoo("llama3-8b")
    s = 1
    embed = m.vocab_size * m.hidden_size  # input lookup: no FLOPs; output matmul counted
    norms = m.hidden_size * (2 * m.num_layers + 1)
    weights = param_count(m) - embed - norms
    assert forward_flops_per_token(m, s) == 2 * weights + m.num_layers * 4 * s * m.q_dim


def test_unknown_recompute_mode():
    with pytest.raises(ValueError, match="recompute"):
        hardware_flops_per_token(load_zoo("tiny"), 128, "sometimes")
