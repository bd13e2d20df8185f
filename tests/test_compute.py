import pytest

from sim.cost.compute import layer_time, logits_time
from sim.cost.costmodel import Roofline, op_bytes, roofline_for
from sim.spec.hardware import get_hardware
from sim.spec.plan import Plan
from sim.spec.zoo import load_zoo

A100 = get_hardware("a100-sxm4-80gb")
RF = roofline_for(A100)


def test_roofline_rates_come_from_the_catalog():
    assert RF.gemm_flops["fp16"] == 312e12 * A100.gemm_eff_max
    assert RF.attention_flops["bf16"] == 312e12 * A100.attention_eff
    assert RF.mem_Bps == 2039e9 * A100.hbm_eff
    assert "fp8" not in RF.gemm_flops  # A100 has none


def test_gemm_efficiency_formula():
    d = A100.gemm_dim_half
    fwd, bwd = RF.gemm(1024, 2048, 4096, "bf16")
    eff = 1024 / (1024 + d) * 2048 / (2048 + d) * 4096 / (4096 + d)
    assert fwd == pytest.approx(2 * 1024 * 2048 * 4096 / (RF.gemm_flops["bf16"] * eff))
    assert bwd == 2 * fwd


def test_large_gemm_near_measured_cublas_rate():
    # measured cuBLASLt FP16 8192^3 on A100: 253.7 TFLOP/s (experiments/data microbenchmarks)
    t = RF.gemm(8192, 8192, 8192, "fp16")[0]
    assert 2 * 8192**3 / t / 1e12 == pytest.approx(253.7, rel=0.05)


def test_skinny_gemm_is_memory_bound():
    t = RF.gemm(8192, 8192, 1, "bf16")[0]
    assert t == pytest.approx((8192 + 8192 + 8192 * 8192) * 2 / RF.mem_Bps)


def test_elementwise_bytes():
    assert op_bytes("residual", 10, 100, "bf16") == 3 * 10 * 100 * 2  # read 2, write 1
    assert op_bytes("swiglu", 10, 100, "fp32") == 3 * 10 * 100 * 4
    assert RF.elementwise("rmsnorm", 10, 100, "bf16") == (4000 / RF.mem_Bps, 8000 / RF.mem_Bps)


def test_flash_attention_counts_the_causal_half():
    fwd, bwd = RF.attention(8, 2048, 2048, 128, "bf16", flash=True, dropout=False)
    assert fwd == pytest.approx(2 * 8 * 2048 * 2048 * 128 / RF.attention_flops["bf16"])
    assert bwd == pytest.approx(2.5 * fwd)


def test_backward_is_twice_forward_without_fused_attention():
    p = Plan(global_batch_size=8, seq_len=2048, tp=8, attention="standard")
    lt = layer_time(RF, load_zoo("gpt3-175b"), p)
    assert lt.backward == pytest.approx(2 * lt.forward)
    assert 0 < lt.attention_forward < lt.forward


def test_layer_is_the_sum_of_its_blocks():
    m = load_zoo("llama3-8b")
    p = Plan(global_batch_size=8, seq_len=4096, tp=2)
    t, h, f = 4096.0, 4096, 14336
    parts = [RF.gemm(t, (4096 + 2 * 1024) / 2, h, "bf16"), RF.gemm(t, h, 4096 / 2, "bf16"),
             RF.elementwise("rope", t, (4096 + 1024) / 2, "bf16"),
             RF.attention(16, t, t, 128, "bf16", True, False),
             RF.gemm(t, 2 * f / 2, h, "bf16"), RF.elementwise("swiglu", t, f / 2, "bf16"),
             RF.gemm(t, h, f / 2, "bf16")]
    parts += [RF.elementwise("rmsnorm", t, h, "bf16"), RF.elementwise("residual", t, h, "bf16")] * 2
    lt = layer_time(RF, m, p)
    assert lt.forward == pytest.approx(sum(c[0] for c in parts))
    assert lt.backward == pytest.approx(sum(c[1] for c in parts))


def test_tensor_parallel_splits_the_work():
    m = load_zoo("gpt3-175b")
    t1 = layer_time(RF, m, Plan(global_batch_size=8, seq_len=2048)).forward
    t8 = layer_time(RF, m, Plan(global_batch_size=8, seq_len=2048, tp=8)).forward
    assert t1 / 8 < t8 < t1 / 6  # smaller GEMMs run less efficiently; norms are replicated


def test_logits_include_loss_and_final_norm():
    m = load_zoo("llama3-8b")
    p = Plan(global_batch_size=8, seq_len=4096)
    gemm = RF.gemm(4096, m.vocab_size, m.hidden_size, "bf16")
    assert logits_time(RF, m, p) > gemm[0] + gemm[1]


def test_custom_rates():
    r = Roofline({"fp32": 1e11}, 0.0, 1e10, {"fp32": 5e10})
    assert r.gemm(100, 100, 100, "fp32")[0] == pytest.approx(max(2e6 / 1e11, 3e4 * 4 / 1e10))
