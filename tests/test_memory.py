import pytest

from sim.layout.memory import (
    GIB,
    inflight_microbatches,
    layer_activation_bytes,
    model_state_bytes_per_param,
    peak_memory,
)
from sim.spec.plan import Plan
from sim.spec.zoo import load_zoo

GPT3 = load_zoo("gpt3-175b")  # s=2048, h=12288, a=96; has dropout like Korthikanti's GPT
S, H, A = 2048, 12288, 96
SBH = S * 1 * H


def plan(**kw):
    base = dict(global_batch_size=64, seq_len=S, tp=8, pp=8, dp=8, attention="standard")
    return Plan(**{**base, **kw})


# Korthikanti et al. 2022, Table 2 (bytes per layer, micro-batch b = 1, t = 8).
def test_korthikanti_tensor_parallel_no_recompute():
    # s b h (10 + 24/t + 5 a s / (h t)) = 25165824 * (10 + 3 + 10) = 578,813,952
    assert layer_activation_bytes(GPT3, plan()) == SBH * (10 + 24 / 8 + 5 * A * S / (H * 8))
    assert layer_activation_bytes(GPT3, plan()) == 578_813_952


def test_korthikanti_sequence_parallel():
    # s b h / t (34 + 5 a s / h) = 25165824 / 8 * (34 + 80) = 358,612,992
    got = layer_activation_bytes(GPT3, plan(sequence_parallel=True))
    assert got == SBH / 8 * (34 + 5 * A * S / H) == 358_612_992


def test_korthikanti_selective_recompute_with_sequence_parallel():
    # 34 s b h / t = 106,954,752
    p = plan(sequence_parallel=True, recompute="selective")
    assert layer_activation_bytes(GPT3, p) == 34 * SBH / 8 == 106_954_752


def test_korthikanti_full_recompute_keeps_layer_inputs():
    # 2 s b h / t per layer; first of 8 stages holds 12 layers x 8 micro-batches (1F1B)
    p = plan(sequence_parallel=True, recompute="full")
    first = peak_memory(GPT3, p, reserved_gib=0.0)[0]
    assert first.activations == 2 * SBH / 8 * 12 * 8


def test_flash_attention_drops_the_score_matrix():
    flash = layer_activation_bytes(GPT3, plan(attention="flash"))
    # 34-term part with t=8 and no SP is 10 + 24/8 = 13 sbh, plus 4*a/t*s*b bytes of LSE
    assert flash == SBH * 13 + 4 * (A / 8) * S


# ZeRO (Rajbhandari et al. 2020), Figure 1: Psi = 7.5 B parameters, N_d = 64, K = 12.
@pytest.mark.parametrize("stage,gb", [(0, 120.0), (1, 31.4), (2, 16.6), (3, 1.9)])
def test_zero_paper_figure_1(stage, gb):
    w, g, o = model_state_bytes_per_param("bf16", stage, 64)
    assert (w + g + o) * 7.5e9 / 1e9 == pytest.approx(gb, abs=0.05)


def test_fp32_training_states():
    assert model_state_bytes_per_param("fp32", 0, 8) == (4.0, 4.0, 8.0)


def test_inflight_microbatches_per_schedule():
    assert inflight_microbatches(plan(schedule="gpipe"), 0) == 64 / 8  # m = 8
    assert [inflight_microbatches(plan(), r) for r in (0, 7)] == [8, 1]
    p = Plan(global_batch_size=64, seq_len=S, tp=8, pp=4, dp=2, vpp=2,
             schedule="interleaved-1f1b")
    # Korthikanti: first stage holds pp * (1 + (pp-1)/(pp*vpp)) micro-batches of its layers
    assert inflight_microbatches(p, 0) == pytest.approx(4 * (1 + 3 / 8))


def test_gpt3_with_full_recompute_fits_a100_and_without_does_not():
    fits = max(r.total for r in peak_memory(GPT3, plan(recompute="full"), 1.0)) / GIB
    no = max(r.total for r in peak_memory(GPT3, plan(), 1.0)) / GIB
    assert fits < 80 < no


def test_zero3_shards_weights_across_data_parallel():
    m = load_zoo("llama3-8b")
    p0 = Plan(global_batch_size=64, seq_len=4096, dp=8)
    p3 = Plan(global_batch_size=64, seq_len=4096, dp=8, zero_stage=3)
    r0, r3 = peak_memory(m, p0, 0.0)[0], peak_memory(m, p3, 0.0)[0]
    assert r3.weights == pytest.approx(r0.weights / 8)
    assert r3.optimizer == pytest.approx(r0.optimizer / 8)


def test_expert_parallel_shards_experts():
    m = load_zoo("mixtral-8x7b")
    a = peak_memory(m, Plan(global_batch_size=64, seq_len=4096, dp=8), 0.0)[0]
    b = peak_memory(m, Plan(global_batch_size=64, seq_len=4096, dp=8, ep=8), 0.0)[0]
    assert b.weights < a.weights / 4
