"""Invariants of the simulator over random scenarios (hypothesis, derandomized so that CI
sees the same examples every run):

* scaling every duration — compute (a scaled cost model), latencies and inverse bandwidths
  (a scaled cluster) — by ``k`` scales the iteration time by ``k``, on both tiers;
* the analytic tier never gets slower with a faster link or a faster GPU;
* no tier finishes an iteration before its busiest pipeline rank has done its compute.

Scenarios are random cluster edits of a preset (``sim.spec.scenario``) and a random plan from the
optimizer's valid space (every parallel degree, schedule, ZeRO stage, recompute mode,
placement).
"""

from __future__ import annotations

import functools

import pytest
from helpers.scaled import ScaledCost, scale_cluster
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from optimizer.space import SearchSpace
from sim.analytic.iteration import analytic_iteration, stage_costs
from sim.cost.profiled import cost_model_for
from sim.des.run import simulate_des
from sim.spec.cluster import ClusterSpec, load_cluster
from sim.spec.plan import Plan
from sim.spec.scenario import apply_cluster_edits
from sim.spec.zoo import load_model

FAST = settings(max_examples=40, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow])
DES = settings(max_examples=12, deadline=None, derandomize=True,
               suppress_health_check=[HealthCheck.too_slow])


@functools.cache
def _plans(model: str, preset: str, gpus_per_node: int, batch: int, seq: int) -> list[Plan]:
    cluster = apply_cluster_edits(load_cluster(preset), [("gpus_per_node", gpus_per_node)])
    return list(SearchSpace(load_model(model), cluster, batch, seq))


@st.composite
def scenarios(draw: st.DrawFn, models: tuple[str, ...], nodes: tuple[int, ...],
              batches: tuple[int, ...]) -> tuple[str, ClusterSpec, Plan]:
    model = draw(st.sampled_from(models))
    preset = f"{draw(st.sampled_from(('dgx-a100', 'dgx-h100', 'hgx-h200')))}:" \
             f"{draw(st.sampled_from(nodes))}"
    per_node = draw(st.sampled_from((4, 8)))
    batch, seq = draw(st.sampled_from(batches)), draw(st.sampled_from((1024, 2048)))
    plans = _plans(model, preset, per_node, batch, seq)
    plan = plans[draw(st.integers(0, len(plans) - 1))]
    edits = [("gpus_per_node", per_node),
             ("inter_node.nic_Gbps", draw(st.floats(25, 1600))),
             ("intra_node.bandwidth_GBps", draw(st.floats(20, 900))),
             ("inter_node.latency_us", draw(st.floats(0.5, 20))),
             ("intra_node.latency_us", draw(st.floats(0.2, 10))),
             ("inter_node.oversubscription", draw(st.sampled_from((1.0, 2.0, 7.0)))),
             ("inter_node.pod_gpus", draw(st.sampled_from((0, per_node))))]
    return model, apply_cluster_edits(load_cluster(preset), edits), plan


ANALYTIC = scenarios(("tiny", "llama3-8b", "mixtral-8x7b"), (1, 2, 4), (16, 64))
SMALL = scenarios(("tiny", "llama3-8b"), (1, 2), (8, 16))
FACTORS = st.sampled_from((0.125, 0.5, 3.0, 10.0))


def _analytic(model: str, cluster: ClusterSpec, plan: Plan, k: float = 1.0) -> float:
    cost = ScaledCost(cost_model_for(cluster), k)
    return analytic_iteration(load_model(model), cluster, plan, cost).iteration_s


def _des(model: str, cluster: ClusterSpec, plan: Plan, k: float = 1.0) -> float:
    cost = ScaledCost(cost_model_for(cluster), k)
    return simulate_des(load_model(model), cluster, plan, cost).iteration_s


def _busiest_compute_s(model: str, cluster: ClusterSpec, plan: Plan) -> float:
    stages = stage_costs(load_model(model), cluster, plan, cost_model_for(cluster))
    return plan.num_microbatches * max(s.compute_s for s in stages)


# scaling ------------------------------------------------------------------------------------
@FAST
@given(ANALYTIC, FACTORS)
def test_analytic_scales_with_every_duration(scenario, k):
    model, cluster, plan = scenario
    base = _analytic(model, cluster, plan)
    assert _analytic(model, scale_cluster(cluster, k), plan, k) == pytest.approx(k * base,
                                                                                 rel=1e-9)


@DES
@given(SMALL, FACTORS)
def test_des_scales_with_every_duration(scenario, k):
    model, cluster, plan = scenario
    base = _des(model, cluster, plan)
    assert _des(model, scale_cluster(cluster, k), plan, k) == pytest.approx(k * base, rel=1e-9)


def test_scaling_only_the_links_or_only_the_gpu_is_not_enough():
    """The scaled inputs are what moves the time: each half alone gives less than k."""
    model, cluster = "llama3-8b", load_cluster("dgx-h100:2")
    plan = Plan(global_batch_size=16, seq_len=2048, dp=4, tp=4)
    base = _analytic(model, cluster, plan)
    links = _analytic(model, scale_cluster(cluster, 2.0), plan)
    gpu = _analytic(model, cluster, plan, 2.0)
    assert base < links < 2 * base and base < gpu < 2 * base


# monotonicity -------------------------------------------------------------------------------
BETTER = st.sampled_from(("intra_node.bandwidth_GBps", "inter_node.nic_Gbps",
                          "inter_node.oversubscription", "gpu_speed"))


def _better(cluster: ClusterSpec, what: str, f: float) -> tuple[ClusterSpec, float]:
    """(cluster, cost factor) with ``what`` ``f`` times better."""
    if what == "gpu_speed":
        return cluster, 1 / f
    if what == "inter_node.oversubscription":
        value = max(1.0, cluster.inter_node.oversubscription / f)
    elif what == "intra_node.bandwidth_GBps":
        value = cluster.intra_GBps * f
    else:
        value = cluster.inter_node.nic_Gbps * f
    return apply_cluster_edits(cluster, [(what, value)]), 1.0


@FAST
@given(ANALYTIC, BETTER, st.floats(1.01, 16))
def test_analytic_never_slower_on_better_hardware(scenario, what, f):
    model, cluster, plan = scenario
    better, k = _better(cluster, what, f)
    assert _analytic(model, better, plan, k) <= _analytic(model, cluster, plan) * (1 + 1e-12)


# the compute floor --------------------------------------------------------------------------
@FAST
@given(ANALYTIC)
def test_analytic_never_below_the_busiest_ranks_compute(scenario):
    model, cluster, plan = scenario
    floor = _busiest_compute_s(model, cluster, plan)
    assert floor > 0 and _analytic(model, cluster, plan) >= floor * (1 - 1e-12)


@DES
@given(SMALL)
def test_des_never_below_the_busiest_ranks_compute(scenario):
    model, cluster, plan = scenario
    assert _des(model, cluster, plan) >= _busiest_compute_s(model, cluster, plan) * (1 - 1e-9)
