"""The gradient-reduction dtype (``grad_reduce_dtype``) and stages that hold no layers
(Megatron-LM layouts with the embedding or the loss on stages of their own)."""

import dataclasses

import pytest

from optimizer.export.megatron import layout
from sim import Plan, load_cluster, load_model, simulate
from sim.errors import SpecError
from sim.layout.flops import param_count
from sim.layout.inventory import expected_collectives
from sim.layout.memory import memory_report

LLAMA = load_model("llama3-8b")
H100 = load_cluster("dgx-h100:2")


def _plan(**kw):
    return Plan(**{"global_batch_size": 32, "seq_len": 2048, "dp": 16, "zero_stage": 1, **kw})


def test_default_is_the_training_dtype():
    assert _plan().grad_bytes == 2 and _plan(dtype="fp32").grad_bytes == 4
    assert _plan(grad_reduce_dtype="fp32").grad_bytes == 4
    assert _plan(dtype="fp32", grad_reduce_dtype="bf16").grad_bytes == 2
    with pytest.raises(SpecError, match="plan.grad_reduce_dtype: must be null or one of"):
        _plan(grad_reduce_dtype="fp8")


def test_fp32_gradients_double_the_reduction_bytes_and_the_buffer():
    p16, p32 = _plan(), _plan(grad_reduce_dtype="fp32")

    def total(plan, kind):
        return sum(r["bytes"] for r in expected_collectives(LLAMA, plan) if r["kind"] == kind)
    assert total(p32, "reduce_scatter") == pytest.approx(2 * total(p16, "reduce_scatter"))
    assert total(p32, "all_gather") == total(p16, "all_gather")  # weights stay 16-bit
    m16, m32 = (memory_report(LLAMA, H100, p).ranks_gib[0] for p in (p16, p32))
    assert m32["gradients"] == pytest.approx(2 * m16["gradients"])
    assert (m32["weights"], m32["optimizer"]) == (m16["weights"], m16["optimizer"])


@pytest.mark.parametrize("fidelity", ["analytic", "des"])
def test_fp32_gradients_take_longer_to_reduce_in_both_tiers(fidelity):
    """Without overlap the whole reduction is exposed: twice the bytes, more time."""
    base = _plan(zero_stage=0, overlap_grad_reduce=False)
    t16 = simulate(LLAMA, H100, base, fidelity=fidelity).breakdown["dp"]
    t32 = simulate(LLAMA, H100, dataclasses.replace(base, grad_reduce_dtype="fp32"),
                   fidelity=fidelity).breakdown["dp"]
    assert 1.6 < t32 / t16 < 2.05


def test_a_stage_may_hold_no_layers():
    with pytest.raises(SpecError, match="integers >= 0"):
        _plan(dp=4, pp=4, layers_per_stage=(-1, 17, 16, 0))
    p = Plan(16, 2048, 1, dp=2, pp=4, layers_per_stage=(0, 16, 16, 0))
    assert layout(p, LLAMA) == "E|" + "t" * 16 + "|" + "t" * 16 + "|L"
    cluster = load_cluster("dgx-h100:1")
    with pytest.raises(SpecError, match="no layers with zero_stage 3 is not modelled"):
        simulate(LLAMA, load_cluster("dgx-h100:1"), dataclasses.replace(p, zero_stage=3))
    for z in (0, 1):
        for split in ((0, 16, 16, 0), (16, 0, 16, 0)):
            q = dataclasses.replace(p, layers_per_stage=split, zero_stage=z)
            a = simulate(LLAMA, cluster, q).iteration_time_s
            d = simulate(LLAMA, cluster, q, fidelity="des").iteration_time_s
            assert d == pytest.approx(a, rel=0.05)
            # an empty stage costs a pipeline hop, not a layer: close to two even stages
            even = simulate(LLAMA, cluster, dataclasses.replace(
                q, pp=2, dp=4, layers_per_stage=None)).iteration_time_s
            assert a > even


def test_qwen3_235b_on_96_virtual_stages_is_expressible():
    """NVIDIA's Q235-4: 94 layers on pp 32 x vpp 3, embedding and loss on their own."""
    m = load_model("qwen3-235b-a22b")
    p = Plan(2048, 4096, 1, dp=4, tp=2, pp=32, ep=8, etp=1, vpp=3,
             schedule="interleaved-1f1b", sequence_parallel=True, zero_stage=1,
             layers_per_stage=(0,) + (1,) * 94 + (0,), recompute="selective")
    r = simulate(m, load_cluster("dgx-h100:32"), p)
    assert r.iteration_time_s > 0 and layout(p, m).startswith("E|t|t|")
    assert layout(p, m).endswith("|t|L")


def test_megascale_moe_352b_model_and_h800():
    m = load_model("experiments/data/megascale_moe_352b.toml")
    assert param_count(m) == pytest.approx(352e9, rel=0.001)
    c = load_cluster("hgx-h800:30")
    assert c.world_size == 240 and c.gpu.nvlink_GBps == 200


def test_fp8_dispatch_halves_the_forward_dispatch_only():
    """Full recomputation: 6 exchanges a layer, 2 of them forward dispatches in fp8."""
    m, c = load_model("mixtral-8x7b"), load_cluster("dgx-h100:2")
    p = Plan(64, 4096, 1, dp=16, ep=8, zero_stage=1, recompute="full")
    q = dataclasses.replace(p, moe_dispatch_dtype="fp8")
    scale = (1 + 4 / 128) / 2
    for fidelity in ("analytic", "des"):
        e16 = simulate(m, c, p, fidelity=fidelity).breakdown["ep"]
        e8 = simulate(m, c, q, fidelity=fidelity).breakdown["ep"]
        assert e8 < e16 and e8 / e16 > (4 + 2 * scale) / 6 - 0.02
    def a2a(plan):  # torch's account: its checkpoint replays the forward's too
        return sum(r["bytes"] for r in expected_collectives(m, plan) if r["kind"] == "all_to_all")
    assert a2a(q) / a2a(p) == pytest.approx((4 + 2 * scale) / 6)
    with pytest.raises(SpecError, match="needs expert parallelism"):
        Plan(64, 4096, 1, dp=16, moe_dispatch_dtype="fp8")
    with pytest.raises(SpecError, match="must be null .* or fp8"):
        dataclasses.replace(p, moe_dispatch_dtype="int8")
    from optimizer.export import export
    with pytest.raises(SpecError, match="plan.moe_dispatch_dtype"):
        export("megatron", q, m, c)


def test_grad_reduce_dtype_reaches_sync_strategies_and_is_refused_where_not_modelled():
    from executor.capabilities import unsupported
    from sim.layout.sync import gradient
    from sim.spec.workload import Layer, Workload

    p16, p32 = _plan(), _plan(grad_reduce_dtype="fp32")
    assert gradient(LLAMA, p32).raw_bytes == 2 * gradient(LLAMA, p16).raw_bytes
    assert unsupported(LLAMA, p32)[0] == "plan.grad_reduce_dtype"
    same = unsupported(LLAMA, _plan(dtype="fp32", grad_reduce_dtype="fp32"))
    assert same is None or same[0] != "plan.grad_reduce_dtype"
    toy = Workload("toy", tuple(Layer(f"l{i}", "Linear", (1024,), forward_flops=1.0,
                                      backward_flops=2.0, boundary_bytes=64)
                                for i in range(2)))
    with pytest.raises(SpecError, match="plan.grad_reduce_dtype: is not modelled for workload"):
        simulate(toy, H100, dataclasses.replace(p32, seq_len=1))


def test_calibrating_a_cpu_run_leaves_overlap_out():
    """cpu collectives share the compute's cores (comm_overlap 0): not a factor there."""
    from optimizer.calibrate import Run, fit

    c = load_cluster("cpu:2")
    p = Plan(4, 128, 1, dp=2)
    m = load_model("tiny")
    t = simulate(m, c, p).iteration_time_s
    cal = fit([Run(m, c, p, 1.1 * t, "cpu")])
    assert "comm_overlap" not in cal["factors"]
    with pytest.raises(SpecError, match="comm_overlap is 0 on cpu"):
        fit([Run(m, c, p, 1.1 * t, "cpu")], factors=("comm_overlap",))


def test_the_exchange_kernels_sms_slow_the_compute_they_hide_behind():
    """DeepEP's 20 of H100's 132 SMs: each hidden second of exchange costs 20/132 s."""
    m, c = load_model("mixtral-8x7b"), load_cluster("dgx-h100:2")
    p = Plan(64, 4096, 1, dp=16, ep=8, zero_stage=1, moe_overlap="a2a",
             moe_dispatcher="deepep", moe_comm_sms=0)
    for fidelity in ("analytic", "des"):
        free = simulate(m, c, p, fidelity=fidelity)
        held = simulate(m, c, dataclasses.replace(p, moe_comm_sms=None), fidelity=fidelity)
        hidden = free.communication["ep"]["overlapped_s"]
        extra = held.iteration_time_s - free.iteration_time_s
        assert hidden > 0 and extra == pytest.approx(hidden * 20 / 132, rel=0.25)
    with pytest.raises(SpecError, match="fewer than the 132 SMs"):
        simulate(m, c, dataclasses.replace(p, moe_comm_sms=132))
    with pytest.raises(SpecError, match="plan.moe_comm_sms: must be null or an integer"):
        dataclasses.replace(p, moe_comm_sms=-1)
    from optimizer.export.megatron import megatron_args
    assert "--moe-deepep-num-sms 24" in megatron_args(dataclasses.replace(p, moe_comm_sms=24), m)
