"""Whole TP layers and heads measured over ranks (``tp-layer``/``tp-head`` rows): the cost
model subtracts its own TP collectives from them, so a simulated layer plus its collectives
comes out at the measured whole; without rows, or without a collective fit, nothing moves."""

import dataclasses

import pytest
from helpers.profiles import SHIPPED, profile_copy

from sim import Plan, load_cluster, load_model, simulate
from sim.cost.compute import layer_time, logits_time, ops_logits_time
from sim.cost.profiled import load_cost_model
from sim.layout.stages import edge_tp_collectives
from sim.spec.hardware import get_hardware

HW = dataclasses.replace(get_hardware("cpu"), name="cpu-tp")
TINY = load_model("tiny")
LAYER_VARIANT = ("seq=512;num_heads=8;num_kv_heads=4;head_dim=32;ffn_hidden_size=704;"
                 "gated_mlp=True;norm=rmsnorm;position_embedding=rope;linear_bias=False;"
                 "qkv_bias=False;dropout=False")
# measured: (forward, backward) seconds of one layer and of the head, tokens 2048
LAYER, HEAD = (0.0456, 0.0814), (0.1358, 0.1770)


def _plan(sp=False, tp=2):
    return Plan(global_batch_size=8, seq_len=512, micro_batch_size=4, tp=tp,
                sequence_parallel=sp, dtype="fp32")


def _db(tmp_path, rows=(), comm=True):
    return profile_copy(tmp_path / "cpu-tp", rows, comm)


def _rows(sp=False, tp=2, scale=1.0):
    s = "-sp" if sp else ""
    common = dict(dtype="fp32", grid="model-tiny", m=2048, n=256, repeats=7, threads=1)
    return [dict(op=f"tp-layer{s}", variant=LAYER_VARIANT, k=tp, fwd_median_s=LAYER[0] * scale,
                 bwd_median_s=LAYER[1] * scale, **common),
            dict(op=f"tp-head{s}", variant=f"tp={tp};norm=rmsnorm", k=8192,
                 fwd_median_s=HEAD[0] * scale, bwd_median_s=HEAD[1] * scale, **common)]


def _layer_comm(cm, plan):
    size = plan.local_tokens * TINY.hidden_size * 4
    kinds = ("all_gather", "reduce_scatter") if plan.sequence_parallel else ("all_reduce",)
    return 2 * sum(cm.collective(k, 2, False, size) for k in kinds)  # attention + MLP


@pytest.mark.parametrize("sp", [False, True])
def test_layer_and_head_come_out_at_the_measured_whole(tmp_path, sp):
    cm = load_cost_model(_db(tmp_path, _rows(sp)), HW)
    plan = _plan(sp)
    lt, comm = layer_time(cm, TINY, plan), _layer_comm(cm, plan)
    assert lt.forward + comm == pytest.approx(LAYER[0], rel=1e-9)
    assert lt.backward + comm == pytest.approx(LAYER[1], rel=1e-9)
    edges = sum(cm.collective(kind, 2, False, size)
                for _, kind, size in edge_tp_collectives(TINY, plan, False, True))
    assert logits_time(cm, TINY, plan) + edges == pytest.approx(sum(HEAD), rel=1e-9)
    assert not cm.extrapolated


def test_rows_apply_only_at_their_tp_degree_and_sequence_parallelism(tmp_path):
    plain = load_cost_model(SHIPPED, dataclasses.replace(HW, name="cpu-amd-epyc"))
    cm = load_cost_model(_db(tmp_path, _rows(sp=False)), HW)
    for plan in (_plan(sp=True), _plan(tp=1)):  # no rows for these: the single-process ones
        assert layer_time(cm, TINY, plan) == layer_time(plain, TINY, plan)
        assert logits_time(cm, TINY, plan) == logits_time(plain, TINY, plan)
    assert layer_time(cm, TINY, _plan()) != layer_time(plain, TINY, _plan())


def test_a_slower_whole_raises_the_layer_by_the_difference(tmp_path):
    slow = load_cost_model(_db(tmp_path, _rows(scale=1.5)), HW)
    fast = load_cost_model(_db(tmp_path / "b", _rows()), HW)
    plan = _plan()
    diff = layer_time(slow, TINY, plan).forward - layer_time(fast, TINY, plan).forward
    assert diff == pytest.approx(0.5 * LAYER[0], rel=1e-9)
    ops = ops_logits_time(fast, TINY, plan)
    assert slow.head_factor(TINY, plan) * ops - fast.head_factor(TINY, plan) * ops == \
        pytest.approx(0.5 * sum(HEAD), rel=1e-9)


def test_without_a_collective_fit_the_rows_are_noted_not_used(tmp_path):
    cm = load_cost_model(_db(tmp_path, _rows(), comm=False), HW)
    bare = load_cost_model(_db(tmp_path / "b", comm=False),
                           dataclasses.replace(HW, name="cpu-tp"))
    plan = _plan()
    assert layer_time(cm, TINY, plan) == layer_time(bare, TINY, plan)
    assert cm.head_factor(TINY, plan) == 1.0
    assert any(e.startswith("tp-layer (its collectives") for e in cm.extrapolated)
    assert any(e.startswith("tp-head (its collectives") for e in cm.extrapolated)


def test_both_tiers_move_for_tp_plans_only(tmp_path):
    folder = _db(tmp_path, _rows())
    base = dataclasses.replace(load_cluster("cpu:2"), gpu=dataclasses.replace(
        load_cluster("cpu:2").gpu, name="cpu-tp"))
    with_rows = dataclasses.replace(base, profile=str(folder))
    without = dataclasses.replace(base, profile=str(_db(tmp_path / "b")))
    dp2 = Plan(global_batch_size=8, seq_len=512, micro_batch_size=2, dp=2, dtype="fp32")
    for fidelity in ("analytic", "des"):
        t = {name: [simulate(TINY, c, p, fidelity=fidelity).iteration_time_s
                    for c in (with_rows, without)]
             for name, p in (("tp2", _plan()), ("dp2", dp2))}
        assert t["dp2"][0] == t["dp2"][1]
        assert t["tp2"][0] != pytest.approx(t["tp2"][1], rel=1e-3)
    a, d = (simulate(TINY, with_rows, _plan(), fidelity=f).iteration_time_s
            for f in ("analytic", "des"))
    assert d == pytest.approx(a, rel=0.02)


def test_rows_apply_only_to_the_structure_and_sequence_they_measured(tmp_path):
    cm = load_cost_model(_db(tmp_path, _rows()), HW)
    bare = load_cost_model(_db(tmp_path / "b"), HW)
    other = dataclasses.replace(TINY, ffn_hidden_size=768)  # same width, another layer
    for m, plan in ((other, _plan()), (load_model("llama3-8b"), _plan()),
                    (TINY, dataclasses.replace(_plan(), seq_len=256, global_batch_size=16))):
        assert layer_time(cm, m, plan) == layer_time(bare, m, plan)
    moe = load_model("mixtral-8x7b")
    assert layer_time(cm, moe, _plan(), moe=True) == layer_time(bare, moe, _plan(), moe=True)
    wide = dataclasses.replace(TINY, vocab_size=16384)
    assert cm.head_factor(wide, _plan()) == 1.0


def test_tokens_outside_the_measured_ones_are_held_and_noted(tmp_path):
    cm = load_cost_model(_db(tmp_path, _rows()), HW)
    two = dataclasses.replace(_plan(), micro_batch_size=2, global_batch_size=4)
    assert cm.layer_factor(TINY, two) == cm.layer_factor(TINY, _plan())
    assert any("tp-layer held at its measured tokens" in e for e in cm.extrapolated)
