"""FSDP2's cost around ZeRO-3's collectives (``fsdp-units``/``fsdp-plain`` rows): the cost
model takes what the rows measure beyond the plain modules and the collectives it charges
itself, splits it into a unit's cost and the root's, and adds them to a ZeRO-3 plan's
layers and output head; nothing moves for other plans, or without a collective fit."""

import dataclasses

import pytest
from helpers.profiles import profile_copy

from sim import Plan, load_cluster, load_model, simulate
from sim.cost.compute import layer_time, logits_time, logits_weight_time
from sim.cost.profiled import load_cost_model
from sim.layout.memory import chunk_edge_params, layer_rank_params
from sim.spec.hardware import get_hardware

HW = dataclasses.replace(get_hardware("cpu"), name="cpu-fsdp")
TINY = load_model("tiny")
SIZES = (1 << 18, 1 << 20, 1 << 22)
PLAIN = (0.001, 0.002)
ROOT = (0.003, 0.004)


def unit(params):
    """The unit cost the rows are built from: (forward, backward) seconds."""
    return 0.0005 + params * 2e-9, 0.001 + params * 5e-9


def _plan(**kw):
    return Plan(**{"global_batch_size": 8, "seq_len": 512, "micro_batch_size": 2, "dp": 2,
                   "zero_stage": 3, "dtype": "fp32", **kw})


def _rows(cm, extra=(0.0, 0.0)):
    """Rows as a run would measure them, timed by ``cm``'s own collective fit."""
    rows = []
    for p in SIZES:
        gather = cm.collective("all_gather", 2, False, 4 * p)
        reduce = cm.collective("reduce_scatter", 2, False, 4 * p)
        for n in (1, 3):
            u, count = unit(p), n + 1
            common = dict(variant="reshard=True;tensors=8", dtype="fp32", grid="fsdp", m=p,
                          n=n, k=2, repeats=25, threads=1)
            rows.append(dict(op="fsdp-plain", fwd_median_s=PLAIN[0], bwd_median_s=PLAIN[1],
                             **common))
            rows.append(dict(op="fsdp-units", **common,
                             fwd_median_s=PLAIN[0] + ROOT[0] + extra[0]
                             + count * (gather + u[0]),
                             bwd_median_s=PLAIN[1] + ROOT[1] + extra[1]
                             + count * (gather + reduce + u[1])))
    return rows


def _db(tmp_path, rows=(), comm=True):
    return profile_copy(tmp_path / "cpu-fsdp", rows, comm)


@pytest.fixture
def pair(tmp_path):
    """(cost model with the rows, the same without)."""
    bare = load_cost_model(_db(tmp_path / "bare"), HW)
    return load_cost_model(_db(tmp_path / "rows", _rows(bare)), HW), bare


def test_the_fit_recovers_the_unit_and_the_root(pair):
    cm, _ = pair
    plan = _plan()
    for p in SIZES:
        assert cm.fsdp_unit(plan, p) == pytest.approx(unit(p), rel=1e-9)
    assert cm.fsdp_root(plan) == pytest.approx(ROOT, rel=1e-9)
    mid = (SIZES[0] + SIZES[1]) / 2  # linear between measured sizes
    assert cm.fsdp_unit(plan, mid) == pytest.approx(unit(mid), rel=1e-9)
    assert not cm.extrapolated


def test_sizes_outside_the_measured_ones_are_held_and_noted(pair):
    cm, _ = pair
    assert cm.fsdp_unit(_plan(), 1 << 24) == pytest.approx(unit(SIZES[-1]), rel=1e-9)
    assert any("fsdp-units held at its measured sizes" in e for e in cm.extrapolated)


def test_layers_and_head_of_a_zero3_plan_carry_it(pair):
    cm, bare = pair
    plan = _plan()
    u = unit(sum(layer_rank_params(TINY, plan, False)))
    with_rows, without = layer_time(cm, TINY, plan), layer_time(bare, TINY, plan)
    assert with_rows.forward - without.forward == pytest.approx(u[0], rel=1e-9)
    assert with_rows.backward - without.backward == pytest.approx(u[1], rel=1e-9)
    assert with_rows.recompute_forward == without.recompute_forward
    assert with_rows.weight_grad == pytest.approx(without.weight_grad, rel=1e-12)  # not dW
    assert with_rows.replay("full", False) == pytest.approx(  # not replayed
        without.replay("full", False), rel=1e-12)
    for m in (TINY, dataclasses.replace(TINY, num_mtp_layers=1)):  # the root's once
        edge = unit(chunk_edge_params(m, plan, 0))  # embedding, tied head, MTP's projection
        assert logits_time(cm, m, plan) - logits_time(bare, m, plan) == pytest.approx(
            sum(edge) + sum(ROOT), rel=1e-9)
        assert logits_weight_time(cm, m, plan) == pytest.approx(
            logits_weight_time(bare, m, plan), rel=1e-12)


@pytest.mark.parametrize("plan", [
    _plan(zero_stage=0), _plan(zero_stage=2), _plan(reshard_after_forward=False),
    _plan(dp=1, global_batch_size=4)])
def test_other_plans_do_not_move(pair, plan):
    cm, bare = pair
    assert layer_time(cm, TINY, plan) == layer_time(bare, TINY, plan)
    assert logits_time(cm, TINY, plan) == logits_time(bare, TINY, plan)


def test_without_a_collective_fit_nothing_moves(tmp_path, pair):
    _, bare = pair
    cm = load_cost_model(_db(tmp_path / "nocomm", _rows(bare), comm=False), HW)
    assert cm.fsdp_unit(_plan(), SIZES[0]) == (0.0, 0.0)
    assert cm.fsdp_root(_plan()) == (0.0, 0.0)


def test_a_faster_run_than_its_collectives_costs_nothing(tmp_path, pair):
    _, bare = pair
    cm = load_cost_model(_db(tmp_path / "fast", _rows(bare, extra=(-1.0, -1.0))), HW)
    assert cm.fsdp_root(_plan()) == (0.0, 0.0)  # a negative root is no cost
    assert cm.fsdp_unit(_plan(), SIZES[1]) == pytest.approx(unit(SIZES[1]), rel=1e-9)


@pytest.mark.parametrize("recompute", ["none", "full"])
def test_both_tiers_add_it_per_micro_batch(tmp_path, pair, recompute):
    base = load_cluster("cpu:2")
    base = dataclasses.replace(base, gpu=dataclasses.replace(base.gpu, name="cpu-fsdp"))
    with_rows = dataclasses.replace(base, profile=str(tmp_path / "rows" / "cpu-fsdp"))
    without = dataclasses.replace(base, profile=str(tmp_path / "bare" / "cpu-fsdp"))
    plan = _plan(recompute=recompute)
    per_mb = (TINY.num_layers * sum(unit(sum(layer_rank_params(TINY, plan, False))))
              + sum(unit(chunk_edge_params(TINY, plan, 0))) + sum(ROOT))
    micro_batches = plan.global_batch_size // (plan.micro_batch_size * plan.dp)
    for fidelity in ("analytic", "des"):
        t = [simulate(TINY, c, plan, fidelity=fidelity).iteration_time_s
             for c in (with_rows, without)]
        assert t[0] - t[1] == pytest.approx(micro_batches * per_mb, rel=0.02)
        dp = Plan(global_batch_size=8, seq_len=512, micro_batch_size=2, dp=2, dtype="fp32")
        assert (simulate(TINY, with_rows, dp, fidelity=fidelity).iteration_time_s
                == simulate(TINY, without, dp, fidelity=fidelity).iteration_time_s)
