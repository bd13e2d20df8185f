"""Heterogeneous clusters: node groups in a ClusterSpec, both tiers on mixed GPU types,
uneven layers and micro-batches, and the optimizer's balanced plan against the
homogeneous-assumption one.

The mixed cluster is one DGX A100 node and one DGX H100 node: with ``dp=2, tp=8`` each
replica is one node (DP across types), with ``pp=2, tp=8`` each stage is (PP across types).
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from executor.export import torchrun_files
from optimizer.balance import balanced, balanced_variants, proportional, refine
from optimizer.export import export
from optimizer.report import format_report, summary
from optimizer.search import optimize
from sim import load_cluster, load_model, simulate
from sim.cost.profiled import cost_model_for
from sim.cost.scales import gpu_compute_scales
from sim.errors import SpecError
from sim.layout.memory import memory_verdict
from sim.network.topology import build_topology
from sim.spec.plan import Plan
from sim.spec.scenario import apply_cluster_edits, parse_value
from trainsim.cli import main
from trainsim.commands.optimize import run_optimize

MIXED = "dgx-a100:1+dgx-h100:1"
GROUPS_TOML = """
name = "mixed"
gpus_per_node = 8
[inter_node]
nic_Gbps = 200
[[node_groups]]
nodes = 1
gpu = "a100-sxm4-80gb"
[[node_groups]]
nodes = 2
gpu = "h100-sxm5-80gb"
inter_node = { nic_Gbps = 400, nics_per_node = 4 }
intra_node = { bandwidth_GBps = 400 }
"""


@pytest.fixture(scope="module")
def model():
    return load_model("llama3-8b")


def _dp_plan(mbr=None):
    return Plan(32, 1024, 1, dp=2, tp=8, micro_batches_per_replica=mbr)


def _pp_plan(lps=None):
    return Plan(32, 1024, 1, dp=1, tp=8, pp=2, layers_per_stage=lps)


def _time(model, cluster, plan, fidelity):
    return simulate(model, load_cluster(cluster), plan, fidelity).iteration_time_s


# Cluster files --------------------------------------------------------------------------------
def test_toml_groups_parse(tmp_path):
    path = tmp_path / "mixed.toml"
    path.write_text(GROUPS_TOML)
    c = load_cluster(str(path))
    assert (c.nodes, c.world_size, c.gpu.name, c.heterogeneous) == (3, 24, "a100-sxm4-80gb", True)
    assert [c.gpu_of(d).name[:4] for d in (0, 7, 8, 23)] == ["a100", "a100", "h100", "h100"]
    assert c.node_nics(0) == (200, 8) and c.node_nics(2) == (400, 4)
    assert (c.node_intra_GBps(0), c.node_intra_GBps(1)) == (300.0, 400)  # A100 NVLink, own
    assert c.nic_GBps_per_gpu == 25.0  # the slowest group's share: 8 x 200 Gb/s / 8
    again = load_cluster(MIXED)
    assert again.to_dict()["node_groups"][1]["gpu"] == "h100-sxm5-80gb"
    from sim.spec.cluster import cluster_from_dict
    assert cluster_from_dict(c.to_dict(), "x").node_groups == c.node_groups


@pytest.mark.parametrize("edit, field", [
    ('[[node_groups]]\nnodes = 1\n', "node_groups[2].gpu"),
    ('[[node_groups]]\nnodes = 0\ngpu = "b200"\n', "node_groups[2].nodes"),
    ('[[node_groups]]\nnodes = 1\ngpu = "b200"\ncolour = 1\n', "node_groups[2].colour"),
    ('[[node_groups]]\nnodes = 1\ngpu = "b200"\ninter_node = { nic_Gbps = -1 }\n',
     "node_groups[2].inter_node.nic_Gbps"),
    ('[[node_groups]]\nnodes = 1\ngpu = "b200"\ninter_node = { topology = "torus2d" }\n',
     "node_groups[2].inter_node.topology"),
    ('nodes = 5\n', "node_groups"),  # 1 + 2 nodes in the groups
    ('gpu = "h100-sxm5-80gb"\n', "gpu"),  # the first group's is an A100
])
def test_bad_groups_exit_2(tmp_path, capsys, edit, field):
    head, _, rest = GROUPS_TOML.partition("[inter_node]")
    text = head + edit + "[inter_node]" + rest if not edit.startswith("[[") else \
        GROUPS_TOML + edit
    path = tmp_path / "bad.toml"
    path.write_text(text)
    assert main(["cluster", "--cluster", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("trainsim: ") and f"{field}:" in err and "\n" not in err, err


def test_cli_prints_groups(capsys):
    assert main(["cluster", "--cluster", MIXED]) == 0
    out = capsys.readouterr().out
    assert "nodes 0-0: a100-sxm4-80gb" in out and "nodes 1-1: h100-sxm5-80gb" in out


def test_scenario_edit_sets_groups():
    groups = parse_value('[{nodes = 1, gpu = "a100-sxm4-80gb"}, {nodes = 1, '
                         'gpu = "h100-sxm5-80gb", inter_node = {nic_Gbps = 400}}]')
    c = apply_cluster_edits(load_cluster("dgx-a100:2"), [("node_groups", groups)])
    assert c.heterogeneous and c.gpu_of(15).name == "h100-sxm5-80gb" and c.node_nics(1)[0] == 400
    with pytest.raises(SpecError, match="^gpu: must be the first node group's GPU"):
        apply_cluster_edits(c, [("gpu", "h100-sxm5-80gb")])


def test_topology_uses_each_nodes_rates():
    c = load_cluster(MIXED)
    t = build_topology(c)
    nvlink = {d: t.cap[t.lid(d, ("sw", d // 8))] for d in (0, 8)}
    nic = {d: t.cap[t.lid(d, ("nic", d // 8, 0))] for d in (0, 8)}
    a100, h100 = c.gpu_of(0), c.gpu_of(8)
    assert nvlink[0] == pytest.approx(300e9 * a100.comm_eff)  # each node its own GPU's
    assert nvlink[8] == pytest.approx(450e9 * h100.comm_eff)
    assert nic[8] == pytest.approx(2 * nic[0])  # 400 vs 200 Gb/s NICs


# Simulators ------------------------------------------------------------------------------------
def test_compute_scales(model):
    s = gpu_compute_scales(model, load_cluster(MIXED), _dp_plan())
    assert s[:8] == [1.0] * 8 and len(set(s[8:])) == 1 and 0.2 < s[8] < 0.6
    assert gpu_compute_scales(model, load_cluster("dgx-a100:1+dgx-a100:1"), _dp_plan()) is None


@pytest.mark.parametrize("fidelity", ["analytic", "des"])
@pytest.mark.parametrize("plan", [_dp_plan(), _pp_plan()], ids=["dp", "pp"])
def test_mixed_between_all_slow_and_all_fast(model, plan, fidelity):
    slow = _time(model, "dgx-a100:2", plan, fidelity)
    fast = _time(model, "dgx-h100:2", plan, fidelity)
    mixed = _time(model, MIXED, plan, fidelity)
    if plan.dp > 1:  # an even split waits for the A100 replica, over A100-rate NICs
        assert fast < mixed == pytest.approx(slow, rel=1e-9)
    else:  # the H100 stage is faster, the A100 stage as slow as on the A100 cluster
        assert fast < mixed < slow


def test_one_type_in_groups_changes_nothing(model):
    """Node groups of a single GPU type give the homogeneous cluster's results exactly."""
    for plan in (_dp_plan(), _pp_plan()):
        for fidelity in ("analytic", "des"):
            a = simulate(model, load_cluster("dgx-a100:2"), plan, fidelity)
            b = simulate(model, load_cluster("dgx-a100:1+dgx-a100:1"), plan, fidelity)
            assert a.iteration_time_s == b.iteration_time_s
            assert a.peak_memory_gib == b.peak_memory_gib and a.mfu == b.mfu


def test_des_says_why_it_runs_unreduced(model):
    r = simulate(model, load_cluster(MIXED), _dp_plan((5, 27)), "des")
    assert r.simulation["not_reduced_because"].startswith(
        "no two data-parallel replicas are alike (compute speed, micro-batches")
    assert r.simulation["units"] == 2


@pytest.mark.parametrize("fidelity", ["analytic", "des"])
def test_uneven_layers_beat_even_on_pp_across_types(model, fidelity):
    c = load_cluster(MIXED)
    h100 = 1 / gpu_compute_scales(model, c, _pp_plan())[8]
    lps = tuple(proportional(32, [1.0, h100]))  # stage 0 on the A100 node
    assert lps[0] < lps[1]
    even = _time(model, MIXED, _pp_plan(), fidelity)
    assert _time(model, MIXED, _pp_plan(lps), fidelity) < 0.95 * even
    tuned = refine(model, c, _pp_plan(lps), cost_model_for(c), lambda q: True)
    assert tuned.layers_per_stage[0] < 16
    assert _time(model, MIXED, tuned, fidelity) < 0.85 * even
    backwards = _time(model, MIXED, _pp_plan(lps[::-1]), fidelity)
    assert backwards > even  # more layers on the slower stage: worse


@pytest.mark.parametrize("fidelity", ["analytic", "des"])
def test_uneven_microbatches_beat_even_on_dp_across_types(model, fidelity):
    c = load_cluster(MIXED)
    [(_, start)] = balanced_variants(model, c, _dp_plan())
    plan = refine(model, c, start, cost_model_for(c), lambda q: True)
    mbr = plan.micro_batches_per_replica
    assert mbr is not None and mbr[0] < mbr[1] and sum(mbr) == 32
    even = _time(model, MIXED, _dp_plan(), fidelity)
    balanced = _time(model, MIXED, plan, fidelity)
    assert balanced < 0.85 * even
    # moving micro-batches either way makes the step wait longer for one replica
    for shift in (-3, 3):
        assert _time(model, MIXED, _dp_plan((mbr[0] + shift, mbr[1] - shift)), fidelity) \
            > balanced


@pytest.mark.parametrize("fidelity", ["analytic", "des"])
def test_dualpipev_balances_the_layers_of_each_ranks_v(model, fidelity):
    """DualPipeV on an A100 node and an H100 node: pipeline rank 0 (the A100s) holds
    virtual stages 0 and 3, so both take fewer layers than stages 1 and 2."""
    c = load_cluster(MIXED)
    even = Plan(32, 1024, 1, tp=8, pp=2, vpp=2, schedule="dualpipev")
    [(name, start)] = balanced_variants(model, c, even)
    lps = start.layers_per_stage
    assert name == "layers" and lps[0] < lps[1] and lps[3] < lps[2]
    tuned = refine(model, c, start, cost_model_for(c), lambda q: True)
    assert _time(model, MIXED, tuned, fidelity) < 0.9 * _time(model, MIXED, even, fidelity)


def test_dualpipev_replicas_keep_two_micro_batches_a_stage(model):
    """Each replica of a DualPipeV plan keeps at least 2 pp micro-batches however slow."""
    c = load_cluster(MIXED)
    even = Plan(32, 1024, 2, dp=2, tp=4, pp=2, vpp=2, schedule="dualpipev",
                placement="tp-cp-ep-pp-dp")
    variants = dict(balanced_variants(model, c, even))
    start = variants["micro-batches"]
    assert start.micro_batches_per_replica[0] < start.micro_batches_per_replica[1]
    tuned = refine(model, c, start, cost_model_for(c), lambda q: True)
    mbr = tuned.micro_batches_per_replica
    assert mbr[0] < mbr[1] and min(mbr) >= 4 and sum(mbr) == 16
    assert _time(model, MIXED, tuned, "analytic") < _time(model, MIXED, even, "analytic")


def test_balancing_shifts_only_as_far_as_memory_allows(model):
    """A proportional split that does not fit is approached from the even one instead."""
    c = load_cluster(MIXED)

    def fits(p):  # a stand-in memory check: at most 18 layers on a stage
        return max(p.layers_per_stage or (16,)) <= 18

    [(name, plan)] = balanced(model, c, _pp_plan(), cost_model_for(c), fits)
    assert name == "layers, memory-bound" and plan.layers_per_stage == (14, 18)
    [(name, plan)] = balanced(model, c, _pp_plan(), cost_model_for(c), lambda p: True)
    assert name == "layers" and plan.layers_per_stage[0] < 14


def test_memory_against_each_stages_own_gpu(model):
    mixed = apply_cluster_edits(load_cluster("dgx-a100:2"), [("node_groups", [
        {"nodes": 1, "gpu": "h200-sxm-141gb"}, {"nodes": 1, "gpu": "a100-sxm4-80gb"}])])
    plan = Plan(32, 8192, 8, dp=1, tp=8, pp=2, layers_per_stage=(4, 28))
    peak, capacity = memory_verdict(model, mixed, plan)
    assert capacity == 80.0  # the A100 stage (28 layers) is the tight one
    swapped = Plan(32, 8192, 8, dp=1, tp=8, pp=2, layers_per_stage=(28, 4))
    peak2, capacity2 = memory_verdict(model, mixed, swapped)
    assert capacity2 > 140 and peak2 > peak
    r = simulate(model, mixed, plan)
    assert r.fits_in_memory == (peak <= capacity) and r.memory_capacity_gib == capacity


# Plans and exporters --------------------------------------------------------------------------
@pytest.mark.parametrize("kw, rule", [
    ({"micro_batches_per_replica": (16,)}, "must list dp = 2 counts"),
    ({"micro_batches_per_replica": (16, 15)}, r"sum 16\+15 = 31"),
    ({"micro_batches_per_replica": (16, 0)}, "integers >= 1"),
    ({"micro_batches_per_replica": (16, 16), "zero_stage": 2}, "zero_stage <= 1"),
])
def test_uneven_microbatches_validated(kw, rule):
    with pytest.raises(SpecError, match=rule) as info:
        Plan(32, 1024, 1, dp=2, tp=8, **kw)
    assert info.value.field == "plan.micro_batches_per_replica"


def test_plan_round_trip_and_exporters_refuse(model):
    plan = _dp_plan((10, 22))
    assert Plan.from_dict(json.loads(json.dumps(plan.to_dict()))) == plan
    assert plan.num_microbatches == 22 and plan.replica_microbatches == (10, 22)
    for fmt in ("megatron", "torchtitan", "deepspeed"):
        with pytest.raises(SpecError, match="micro_batches_per_replica .* not expressible"):
            export(fmt, plan, model, load_cluster(MIXED))
    with pytest.raises(SpecError, match="micro_batches_per_replica is not run"):
        torchrun_files(plan, model, load_cluster(MIXED))


# Optimizer ------------------------------------------------------------------------------------
def test_optimizer_reports_balanced_plan_and_gain(model, tmp_path, capsys):
    rc = run_optimize("llama3-8b", MIXED, 32, 1024, 1, tmp_path, True, 1)
    assert rc == 0
    s = json.loads(capsys.readouterr().out)
    assert s == json.loads((tmp_path / "report.json").read_text())
    h = s["heterogeneous"]
    assert h["gain_pct"] >= 0
    assert h["gain_pct"] == pytest.approx(100 * (h["homogeneous_assumption"]["iteration_s"]
                                                 / h["balanced"]["iteration_s"] - 1))
    even = h["homogeneous_assumption"]["plan_json"]
    assert even["layers_per_stage"] is None and even["micro_batches_per_replica"] is None
    assert h["balanced"]["tier"] == h["homogeneous_assumption"]["tier"] == "des"
    assert s["best_iteration_s"] <= h["balanced"]["iteration_s"]
    assert any(r["origin"].startswith("balanced") for r in s["ranked"])
    assert "gain of balancing" in format_report(s)
    # the Megatron-LM arguments are those of the best plan it can express
    assert (tmp_path / "megatron_args.sh").read_text().count("pretrain_gpt.py") == 1
    homog = optimize(load_model("tiny"), load_cluster("dgx-h100:1"), 32, 1024, top_k=1,
                     workers=1, progress=False)
    assert "heterogeneous" not in summary(homog, 1) and homog.balanced is None


def test_doctests():
    import doctest

    import optimizer.balance
    import sim.cost.scales

    for module in (sim.cost.scales, optimizer.balance):  # the device-scale example
        result = doctest.testmod(module)
        assert result.failed == 0 and result.attempted > 0, module


@pytest.mark.parametrize("fidelity", ["analytic", "des"])
def test_stragglers_multiply_gpu_type_scales(model, fidelity):
    """A straggler on an H100 slows the H100 replica that the balanced split loads most."""
    from sim.spec.faults import faults_from_options

    c, plan = load_cluster(MIXED), _dp_plan((12, 20))
    base = simulate(model, c, plan, fidelity).iteration_time_s
    slow = simulate(model, c, plan, fidelity, faults=faults_from_options(["gpu:9=1.5"]))
    assert slow.iteration_time_s > 1.05 * base
    a100 = simulate(model, c, plan, fidelity, faults=faults_from_options(["gpu:1=1.05"]))
    assert a100.iteration_time_s < slow.iteration_time_s


def test_each_replica_runs_its_own_groups_on_its_own_node_fabric() -> None:
    """With more micro-batches on the H100 replicas, an H100 replica sets the step: the
    closed form times its tensor parallelism on the H100s' NVLink (it took the slowest
    group's, the A100s', for every replica: 6.8% above the DES here, now 0.3%), as the
    DES does; replicas on the A100s keep theirs."""
    from sim.analytic.replicas import fabrics_differ

    model, c = load_model("llama3-8b"), load_cluster("dgx-a100:2+dgx-h100:2")
    assert fabrics_differ(c) and not fabrics_differ(load_cluster("dgx-h100:2"))
    fast = Plan(global_batch_size=96, seq_len=8192, dp=8, tp=4, micro_batch_size=1,
                micro_batches_per_replica=(6, 6, 6, 6, 18, 18, 18, 18))
    a, d = (simulate(model, c, fast, fidelity=f) for f in ("analytic", "des"))
    assert a.iteration_time_s == pytest.approx(d.iteration_time_s, rel=0.01)
    alike = dataclasses.replace(fast, micro_batches_per_replica=(6,) * 8, global_batch_size=48)
    a100 = simulate(model, c, alike)  # the A100 replicas set the step: as before
    assert a100.breakdown["tp"] / 6 == pytest.approx(
        simulate(model, c, alike, fidelity="des").breakdown["tp"] / 6, rel=0.01)
    assert a.breakdown["tp"] / 18 < 0.75 * a100.breakdown["tp"] / 6  # H100s: 450 against 300
