import pytest

from sim.compute import gemm_efficiency, gemm_time, layer_time, stream_time
from sim.hardware import get_hardware
from sim.model import load_zoo
from sim.plan import Plan

A100 = get_hardware("a100-sxm4-80gb")


def test_gemm_efficiency_formula():
    d = A100.gemm_dim_half
    assert gemm_efficiency(A100, 1024, 2048, 4096) == pytest.approx(
        A100.gemm_eff_max * 1024 / (1024 + d) * 2048 / (2048 + d) * 4096 / (4096 + d))


def test_large_gemm_near_measured_cublas_rate():
    # measured cuBLASLt FP16 8192^3 on A100: 253.7 TFLOP/s (shared/data microbenchmarks)
    t = gemm_time(A100, "fp16", 8192, 8192, 8192)
    assert 2 * 8192**3 / t / 1e12 == pytest.approx(253.7, rel=0.05)


def test_skinny_gemm_is_memory_bound():
    t = gemm_time(A100, "bf16", 8192, 8192, 1)
    assert t == pytest.approx(stream_time(A100, (8192 + 8192 + 8192 * 8192) * 2))
    assert stream_time(A100, 2039e9 * 0.83) == pytest.approx(1.0)


def test_backward_is_twice_forward_without_fused_attention():
    p = Plan(global_batch_size=8, seq_len=2048, tp=8, attention="standard")
    lt = layer_time(A100, load_zoo("gpt3-175b"), p)
    assert lt.backward == pytest.approx(2 * lt.forward)
    assert 0 < lt.attention_forward < lt.forward


def test_flash_attention_backward_factor():
    p = Plan(global_batch_size=8, seq_len=2048, tp=8)
    lt = layer_time(A100, load_zoo("gpt3-175b"), p)
    linear = lt.forward - lt.attention_forward
    assert lt.backward == pytest.approx(2 * linear + 2.5 * lt.attention_forward)


def test_tensor_parallel_splits_the_work():
    m = load_zoo("gpt3-175b")
    t1 = layer_time(A100, m, Plan(global_batch_size=8, seq_len=2048)).forward
    t8 = layer_time(A100, m, Plan(global_batch_size=8, seq_len=2048, tp=8)).forward
    assert t1 / 8 < t8 < t1 / 6  # smaller GEMMs run less efficiently; norms are replicated
