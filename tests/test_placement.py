import pytest

from sim.layout.placement import GroupSpan, group_span
from sim.layout.stages import pipeline_rank_layers, virtual_stage_layers
from sim.spec.cluster import load_cluster
from sim.spec.model import ModelSpec
from sim.spec.plan import Plan
from sim.spec.zoo import load_zoo

C = load_cluster("dgx-a100:16")  # 128 devices, 8 per node


def plan(**kw):
    return Plan(**{"global_batch_size": 64, "seq_len": 2048, "tp": 8, "pp": 4, "dp": 4, **kw})


def test_default_order_keeps_tp_in_a_node():
    p = plan()
    assert group_span(p, C, "tp") == GroupSpan(8, 8, 1, False)
    assert group_span(p, C, "dp") == GroupSpan(4, 1, 4, False)  # stride 8: one per node
    assert group_span(p, C, "pp") == GroupSpan(4, 1, 4, False)  # stride 32


def test_dp_innermost_splits_tp_across_nodes():
    p = plan(placement="dp-tp-cp-ep-pp")
    assert group_span(p, C, "dp") == GroupSpan(4, 4, 1, False)
    assert group_span(p, C, "tp") == GroupSpan(8, 2, 4, False)  # stride 4: two per node


def test_expert_groups():
    p = Plan(global_batch_size=64, seq_len=2048, dp=16, ep=4, tp=2, pp=4, sequence_parallel=True)
    assert group_span(p, C, "ep") == GroupSpan(4, 4, 1, False)  # stride 2 inside a node
    assert group_span(p, C, "dp").size == 16
    assert group_span(p, C, "edp") == GroupSpan(4, 1, 4, False)  # stride 8


def test_pods():
    import dataclasses

    c = dataclasses.replace(C, inter_node=dataclasses.replace(C.inter_node, pod_gpus=64))
    assert group_span(plan(), c, "pp").cross_pod  # ranks 0, 32, 64, 96
    assert not group_span(plan(), c, "dp").cross_pod  # ranks 0, 8, 16, 24


def test_explicit_rank_table_takes_the_worst_group():
    identity = tuple(range(128))
    assert group_span(plan(placement=identity), C, "tp") == GroupSpan(8, 8, 1, False)
    swapped = list(identity)
    swapped[7], swapped[8] = swapped[8], swapped[7]  # one tp group now straddles two nodes
    assert group_span(plan(placement=tuple(swapped)), C, "tp") == GroupSpan(8, 7, 2, False, 1)


def test_even_and_uneven_stages():
    m = load_zoo("gpt3-175b")
    assert virtual_stage_layers(plan(), m) == [24] * 4
    st = pipeline_rank_layers(plan(layers_per_stage=(20, 26, 26, 24)), m)
    assert [s.total for s in st] == [20, 26, 26, 24]
    assert (st[0].first, st[0].last, st[3].last) == (True, False, True)


def test_interleaved_stages_go_round_robin():
    m = load_zoo("gpt3-175b")
    p = plan(global_batch_size=64, schedule="interleaved-1f1b", vpp=2,
             layers_per_stage=(10, 12, 12, 12, 12, 12, 12, 14))
    assert [s.total for s in pipeline_rank_layers(p, m)] == [10 + 12, 12 + 12, 12 + 12, 12 + 14]


def test_moe_layer_step_and_dense_layers():
    m = ModelSpec("m", 8, 64, 4, 128, 100, num_experts=4, top_k=1, moe_layer_step=2,
                  mlp_only_layers=(7,))
    st = pipeline_rank_layers(Plan(global_batch_size=4, seq_len=16, pp=2), m)
    # MoE layers are 1, 3, 5 (7 is dense-only): stage 0 holds 0-3, stage 1 holds 4-7
    assert [(s.dense, s.moe) for s in st] == [(2, 2), (3, 1)]
    assert m.num_moe_layers == 3


@pytest.mark.parametrize("group", ["tp", "cp", "ep", "dp", "pp", "edp"])
def test_trivial_groups(group):
    p = Plan(global_batch_size=8, seq_len=128)
    assert group_span(p, load_cluster("cpu:1"), group).size == 1


def test_groups_that_do_not_align_with_nodes_are_found():
    # 24 ranks, dp innermost: tp pairs are (r, r+3); the pair (6, 9) straddles nodes 0 and 1
    c = load_cluster("dgx-a100:3")
    p = Plan(global_batch_size=24, seq_len=2048, tp=2, dp=3, pp=4, placement="dp-tp-cp-ep-pp")
    assert group_span(p, c, "tp") == GroupSpan(2, 1, 2, False)
    table = tuple(range(24))  # the same layout as an explicit table agrees
    explicit = Plan(global_batch_size=24, seq_len=2048, tp=2, dp=3, pp=4,
                    placement=tuple(table[(r % 2) * 3 + (r // 2) % 3 + (r // 6) * 6]
                                    for r in range(24)))
    assert group_span(explicit, c, "tp") == GroupSpan(2, 1, 2, False)
