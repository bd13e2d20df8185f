import dataclasses

import pytest

from sim import Plan, load_cluster, load_model, simulate
from sim.analytic.iteration import stage_costs
from sim.cost.costmodel import roofline_for
from sim.result import BREAKDOWN_KINDS

GPT3 = load_model("gpt3-175b")
A100_16 = load_cluster("dgx-a100:16")


def plan(**kw):
    base = dict(global_batch_size=256, seq_len=2048, dp=4, tp=8, pp=4, recompute="full",
                sequence_parallel=True)
    return Plan(**{**base, **kw})


def with_nic(cluster, gbps):
    return dataclasses.replace(cluster, inter_node=dataclasses.replace(cluster.inter_node,
                                                                       nic_Gbps=gbps))


def test_breakdown_adds_up_to_iteration_time():
    r = simulate(GPT3, A100_16, plan(zero_stage=1))
    assert set(r.breakdown) == set(BREAKDOWN_KINDS)
    assert sum(r.breakdown.values()) == pytest.approx(r.iteration_time_s, rel=1e-12)


def test_throughput_and_mfu_definitions():
    r = simulate(GPT3, A100_16, plan())
    assert r.tokens_per_s == pytest.approx(256 * 2048 / r.iteration_time_s)
    assert r.mfu == pytest.approx(r.model_tflops_per_gpu / 312)
    assert r.hardware_tflops_per_gpu == pytest.approx(r.model_tflops_per_gpu * 4 / 3, rel=0.02)


def test_1f1b_bubble_is_p_minus_1_over_m_plus_p_minus_1():
    r = simulate(GPT3, A100_16, plan(global_batch_size=32))  # m = 8, pp = 4
    assert r.bubble_fraction == pytest.approx(3 / 11, rel=0.03)


def test_gpipe_has_the_same_bubble_but_more_memory():
    a = simulate(GPT3, A100_16, plan(global_batch_size=32))
    g = simulate(GPT3, A100_16, plan(global_batch_size=32, schedule="gpipe"))
    # the same (pp - 1) stage times; GPipe's end stages make two pipeline calls per
    # micro-batch where 1F1B's make one, so their stage time differs by one send
    assert g.bubble_fraction == pytest.approx(a.bubble_fraction, rel=1e-3)
    assert g.peak_memory_gib > a.peak_memory_gib


def test_interleaving_shrinks_the_bubble():
    a = simulate(GPT3, A100_16, plan(global_batch_size=32))
    v = simulate(GPT3, A100_16, plan(global_batch_size=32, schedule="interleaved-1f1b", vpp=2))
    assert v.breakdown["bubble"] == pytest.approx(a.breakdown["bubble"] / 2, rel=0.03)
    assert v.bubble_fraction == pytest.approx(1.5 / 9.5, rel=0.03)  # (p-1)/v / (m + (p-1)/v)


def test_pipeline_runs_at_the_slowest_stage():
    p = plan(layers_per_stage=(30, 22, 22, 22))
    costs = stage_costs(GPT3, A100_16, p, roofline_for(A100_16.gpu))
    slowest = max(c.per_microbatch_s for c in costs)
    assert costs[0].per_microbatch_s == slowest
    r = simulate(GPT3, A100_16, p)
    m = p.num_microbatches
    assert r.breakdown["bubble"] == pytest.approx(
        sum(c.per_microbatch_s for c in costs) - slowest)
    assert r.iteration_time_s > m * slowest


def test_more_nic_bandwidth_is_never_slower():
    times = [simulate(GPT3, with_nic(A100_16, g), plan(pp=2, dp=8)).iteration_time_s
             for g in (50, 100, 200, 400, 800)]
    assert times == sorted(times, reverse=True) and times[0] > times[-1]


def test_faster_gpu_is_faster():
    a = simulate(GPT3, A100_16, plan())
    h = simulate(GPT3, load_cluster("dgx-h100:16"), plan())
    assert h.iteration_time_s < a.iteration_time_s / 2


def test_grad_reduce_overlap_helps():
    on = simulate(GPT3, A100_16, plan())
    off = simulate(GPT3, A100_16, plan(overlap_grad_reduce=False))
    assert off.breakdown["dp"] > on.breakdown["dp"]
    assert off.communication["dp"]["overlapped_s"] == 0.0


def test_zero3_moves_more_data_than_zero1():
    m = load_model("llama3-8b")
    c = load_cluster("dgx-h100:2")
    p = Plan(global_batch_size=64, seq_len=4096, dp=16)
    z1 = simulate(m, c, dataclasses.replace(p, zero_stage=1)).communication["dp"]
    z3 = simulate(m, c, dataclasses.replace(p, zero_stage=3)).communication["dp"]
    assert sum(z3.values()) > sum(z1.values())


def test_tp_across_nodes_is_slower_than_inside():
    inside = simulate(GPT3, A100_16, plan())
    across = simulate(GPT3, A100_16, plan(placement="dp-tp-cp-ep-pp"))
    assert across.breakdown["tp"] > 3 * inside.breakdown["tp"]


def test_context_parallel_cuts_activation_memory():
    m = load_model("llama3-8b")
    c = load_cluster("dgx-h100:2")
    base = dict(global_batch_size=16, seq_len=32768, tp=8)
    no_cp = simulate(m, c, Plan(dp=2, **base))
    cp = simulate(m, c, Plan(dp=1, cp=2, **base))
    assert cp.peak_memory_gib < no_cp.peak_memory_gib
    assert cp.communication["cp"]["exposed_s"] + cp.communication["cp"]["overlapped_s"] > 0


def test_expert_parallel_all_to_all():
    m = load_model("mixtral-8x7b")
    r = simulate(m, load_cluster("dgx-h100:2"), Plan(global_batch_size=64, seq_len=4096,
                                                       dp=16, ep=8))
    assert r.breakdown["ep"] > 0


def test_deterministic():
    assert simulate(GPT3, A100_16, plan()).to_dict() == simulate(GPT3, A100_16, plan()).to_dict()


def test_megatron_table1_validation_targets():
    """Mean |error| <= 10% and worst <= 20% against SC'21 Table 1 (experiments/)."""
    from validate_megatron import validation_table

    err = validation_table()["error_pct"].abs()
    assert err.mean() <= 10 and err.max() <= 20


# Megatron-LM's pipeline-specific communication ---------------------------------------------
# dgx-a100: 25 GB/s NIC per GPU at 92%, 2 us across the network + 3 us in the node
A100_NIC_Bps, A100_ALPHA_S = 25e9 * 0.92, 5e-6


def test_embedding_allreduce_by_hand():
    """Tied embeddings, pp > 1: the first and last stage all-reduce the word embedding's
    gradient (50257 x 12288 / tp8, fp16) over a 2-rank group across two nodes: a ring of
    two is 2 alpha + S / beta."""
    costs = stage_costs(GPT3, A100_16, plan(), roofline_for(A100_16.gpu))
    size = 50257 * 12288 / 8 * 2
    by_hand = 2 * A100_ALPHA_S + size / A100_NIC_Bps
    assert [c.embedding_s for c in costs] == pytest.approx([by_hand, 0, 0, by_hand], rel=1e-12)
    untied = dataclasses.replace(GPT3, tied_embeddings=False)
    assert {c.embedding_s for c in stage_costs(untied, A100_16, plan(),
                                              roofline_for(A100_16.gpu))} == {0.0}
    r = simulate(GPT3, A100_16, plan())
    assert r.breakdown["pp"] >= by_hand


def test_1f1b_end_stages_make_one_pipeline_call_per_microbatch():
    """1F1B with sequence parallelism (no gather): a middle stage sends an activation and
    a gradient per micro-batch (two calls), an end stage one; each TP rank sends 1/8."""
    costs = stage_costs(GPT3, A100_16, plan(), roofline_for(A100_16.gpu))
    send = A100_ALPHA_S + 2048 * 12288 * 2 / 8 / A100_NIC_Bps
    assert [c.pp_s for c in costs] == pytest.approx([send, 2 * send, 2 * send, send],
                                                   rel=1e-12)


def test_interleaved_calls_carry_two_messages():
    """Interleaved (vpp 2): two calls per micro-batch, each an activation and a gradient
    through the NIC (alpha + 2 S / beta); the end stages one message fewer."""
    p = plan(schedule="interleaved-1f1b", vpp=2)
    costs = stage_costs(GPT3, A100_16, p, roofline_for(A100_16.gpu))
    s = 2048 * 12288 * 2 / 8 / A100_NIC_Bps
    middle, end = 2 * (A100_ALPHA_S + 2 * s), 2 * (A100_ALPHA_S + 1.5 * s)
    assert [c.pp_s for c in costs] == pytest.approx([end, middle, middle, end], rel=1e-12)


def test_embedding_and_output_layer_tp_collectives():
    """The first stage all-reduces the embedding output (no SP), the last stage the output
    layer's input gradient plus three fp32 values per token for the loss."""
    from sim.layout.stages import edge_tp_collectives

    p = plan(sequence_parallel=False)
    full = 2048 * 12288 * 2
    assert edge_tp_collectives(GPT3, p, True, False) == [("F", "all_reduce", full)]
    assert edge_tp_collectives(GPT3, p, False, True) == [("F", "all_reduce", 4 * 2048)] * 3 + [
        ("B", "all_reduce", full)]
    assert edge_tp_collectives(GPT3, plan(), True, True) == [
        ("F", "reduce_scatter", full), ("B", "all_gather", full), ("F", "all_gather", full)] + [
        ("F", "all_reduce", 4 * 2048)] * 3 + [("B", "reduce_scatter", full)]
    assert edge_tp_collectives(GPT3, plan(tp=1, dp=32, sequence_parallel=False), True,
                               True) == []
    costs = stage_costs(GPT3, A100_16, p, roofline_for(A100_16.gpu))
    assert costs[0].tp_s > costs[1].tp_s == costs[2].tp_s < costs[3].tp_s
