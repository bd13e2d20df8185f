"""Symmetry classes (sim.des.symmetry): every fault and heterogeneity case of the test suite,
reduced and unreduced, gives the same iteration time (1e-6 relative) and the same bytes on
every link; the classes are the ones the refinement should find."""

import dataclasses

import pytest

from sim import Plan, load_cluster, load_model
from sim.cost.profiled import cost_model_for
from sim.cost.scales import combine_scales, gpu_compute_scales
from sim.des.run import simulate_des
from sim.des.symmetry import Classes, refine, replica_groups
from sim.network.failures import fault_inputs
from sim.spec.faults import faults_from_options

DP16 = Plan(global_batch_size=32, seq_len=1024, dp=16)
TINY16 = Plan(global_batch_size=16, seq_len=256, dp=16)
PP_DP = Plan(global_batch_size=32, seq_len=1024, dp=4, tp=2, pp=2)
MOE = Plan(global_batch_size=16, seq_len=512, dp=8, ep=4, pp=2)
CP = Plan(global_batch_size=8, seq_len=4096, dp=2, cp=2, tp=2, pp=2)
Z3 = Plan(global_batch_size=16, seq_len=512, dp=8, pp=2, zero_stage=3)
VPP = Plan(global_batch_size=32, seq_len=1024, dp=2, tp=2, pp=4, vpp=2,
           schedule="interleaved-1f1b")


def _rail(cluster, **kw):
    return dataclasses.replace(cluster, inter_node=dataclasses.replace(
        cluster.inter_node, topology="rail-optimized", **kw))


def _pods(cluster):
    return dataclasses.replace(cluster, inter_node=dataclasses.replace(
        cluster.inter_node, pod_gpus=16, oversubscription=2.0))


# (id, model, cluster, plan, stragglers, distributions, failures)
CASES = [
    ("slow-gpu", "llama3-8b", "dgx-a100:2", DP16, ["gpu:3=1.4"], [], []),
    ("slow-node", "llama3-8b", "dgx-a100:2", DP16, ["node:1=1.5"], [], []),
    ("slow-rank-pp", "llama3-8b", "dgx-h100:2", PP_DP, ["gpu:9=1.5"], [], []),
    ("slow-stage", "llama3-8b", "dgx-h100:2", PP_DP, ["node:1=2"], [], []),
    ("lognormal-gpus", "llama3-8b", "dgx-h100:2", PP_DP, [], ["lognormal:0.1"], []),
    ("node-dist", "llama3-8b", "dgx-a100:4", Plan(32, 1024, dp=4, tp=8), [],
     ["node:uniform:1:1.3"], []),
    ("slow-nic", "llama3-8b", "dgx-a100:2", DP16, ["link:nic1.0=2"], [], []),
    ("slow-gpu-link", "llama3-8b", "dgx-h100:2", PP_DP, ["link:gpu2-sw0=3"], [], []),
    ("failed-nic", "tiny", "dgx-a100:2", TINY16, [], [], ["nic0.0@0"]),
    ("failed-nic-mid-step", "tiny", "dgx-a100:2", TINY16, [], [], ["nic1.3@0.0001"]),
    ("failed-nic-pp", "llama3-8b", "dgx-h100:2", PP_DP, [], [], ["nic1.0@0"]),
    ("straggler-and-failed-nic", "llama3-8b", "dgx-h100:4",
     Plan(32, 1024, dp=4, tp=4, pp=2), ["node:2=1.3"], [], ["nic0.1@0"]),
    ("moe-ep-slow-gpu", "mixtral-8x7b", "dgx-h100:2", MOE, ["gpu:1=1.3"], [], []),
    ("cp-slow-gpu", "llama3-8b", "dgx-h100:2", CP, ["gpu:2=1.5"], [], []),
    ("zero3-slow-node", "llama3-8b", "dgx-h100:2", Z3, ["node:0=1.2"], [], []),
    ("interleaved-slow-gpu", "llama3-8b", "dgx-h100:2", VPP, ["gpu:5=1.2"], [], []),
    ("rail-slow-gpu", "llama3-8b", "rail:dgx-h100:2", PP_DP, ["gpu:9=1.5"], [], []),
    ("pods-slow-node", "llama3-8b", "pods:dgx-a100:4", Plan(64, 1024, dp=32), ["node:2=1.2"],
     [], []),
    ("mixed-gpus-dp", "llama3-8b", "dgx-a100:1+dgx-h100:1", Plan(32, 1024, dp=2, tp=8),
     [], [], []),
    ("mixed-gpus-pp", "llama3-8b", "dgx-a100:1+dgx-h100:1", Plan(32, 1024, dp=1, tp=8, pp=2),
     [], [], []),
    ("mixed-gpus-dp8", "llama3-8b", "dgx-a100:1+dgx-h100:1", Plan(32, 1024, dp=8, tp=2),
     [], [], []),
    ("uneven-microbatches", "llama3-8b", "dgx-a100:1+dgx-h100:1",
     Plan(32, 1024, dp=2, tp=8, micro_batches_per_replica=(5, 27)), [], [], []),
    # node groups with more NICs than the cluster's default (rails beyond its spines)
    ("rail-mixed-nics", "tiny", "rail1:dgx-a100:1+dgx-h100:2", Plan(12, 256, dp=6, cp=2, pp=2),
     ["gpu:8=1.3", "node:1=1.2"], [], []),
    # TP groups laid out differently across nodes (their trees differ): falls back
    ("tp-groups-laid-out-differently", "llama3-8b", "dgx-a100:3",
     Plan(6, 1024, dp=6, tp=4, placement="dp-ep-cp-pp-tp", collectives=(("tp", "tree"),)),
     ["gpu:2=1.2", "gpu:3=1.2"], [], []),
    # a failed NIC's traffic crosses the receiving node's switch on a rail fabric: falls back
    ("rail-failed-nic", "llama3-8b", "rail:dgx-h100:4", Plan(32, 1024, dp=4, tp=4, pp=2),
     [], [], ["nic0.0@0"]),
]


# Cases where no two replicas are alike (every replica its own class: unreduced)
ALL_DIFFERENT = {"lognormal-gpus", "node-dist", "slow-gpu-link", "failed-nic-pp",
                 "interleaved-slow-gpu", "mixed-gpus-dp", "uneven-microbatches"}
# Cases the reduction cannot prove while it runs (it reruns unreduced, saying why)
FALLS_BACK = {"tp-groups-laid-out-differently": "laid out differently across nodes",
              "rail-failed-nic": "a re-routed flow crosses"}


def _cluster(name):
    if name.startswith("rail:"):
        return _rail(load_cluster(name[5:]))
    if name.startswith("rail1:"):  # one NIC per node, but the node groups' own eight
        return _rail(load_cluster(name[6:]), nics_per_node=1)
    if name.startswith("pods:"):
        return _pods(load_cluster(name[5:]))
    return load_cluster(name)


def _run(model, cluster, plan, stragglers, dists, failures, reduce):
    faults = faults_from_options(stragglers, dists, 0, failures)
    f = fault_inputs(faults, cluster, plan, "des", reduce)
    scales = combine_scales(gpu_compute_scales(model, cluster, plan),
                            f.perturbation.compute_scale)
    return simulate_des(model, cluster, plan, cost_model_for(cluster), reduce=reduce,
                        perturbation=f.perturbation.with_scale(scales), top_links=None)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_reduced_equals_unreduced(case):
    name, model, cluster, plan, stragglers, dists, failures = case
    m, c = load_model(model), _cluster(cluster)
    reduced = _run(m, c, plan, stragglers, dists, failures, True)
    assert reduced.simulation["reduced"] == (name not in ALL_DIFFERENT | set(FALLS_BACK))
    why = reduced.simulation.get("not_reduced_because", "")
    assert (FALLS_BACK[name] in why) if name in FALLS_BACK else "exact" not in why
    full = _run(m, c, plan, stragglers, dists, failures, False)
    assert reduced.iteration_s == pytest.approx(full.iteration_s, rel=1e-6)
    got = {row["link"]: row["bytes"] for row in reduced.links}
    want = {row["link"]: row["bytes"] for row in full.links}
    assert got.keys() == want.keys()
    assert all(got[k] == pytest.approx(want[k], rel=1e-9) for k in want)
    assert not full.simulation["reduced"]


def test_a_straggler_splits_only_its_replica():
    """One slow GPU in replica 3 of 16: two classes, two units instead of sixteen."""
    m, c = load_model("llama3-8b"), load_cluster("dgx-a100:2")
    r = _run(m, c, DP16, ["gpu:3=1.4"], [], [], True)
    assert r.simulation["reduced"] and r.simulation["classes"] == 2
    assert r.simulation["units"] == 2 and "not_reduced_because" not in r.simulation


def test_refinement_splits_the_expert_partners_of_a_straggler():
    """ep = 4, dp = 8: expert-parallel groups are replicas {0..3} and {4..7}, expert
    data-parallel ones {0, 4}, {1, 5}, ...; a slow replica 1 splits the others by who they
    meet: its expert-parallel partners 0, 2, 3 (their all-to-alls wait for it), its expert
    data-parallel partner 5, and 4, 6, 7 (whose expert data-parallel partners are 0, 2, 3)."""
    plan = Plan(global_batch_size=16, seq_len=512, dp=8, ep=4)
    assert sorted(map(sorted, replica_groups(plan)["edp"])) == \
        [[(0, 0), (4, 0)], [(1, 0), (5, 0)], [(2, 0), (6, 0)], [(3, 0), (7, 0)]]
    classes = refine(plan, lambda q: q == (1, 0))
    assert classes.members == (((0, 0), (2, 0), (3, 0)), ((1, 0),), ((4, 0), (6, 0), (7, 0)),
                               ((5, 0),))


def test_classes_one_and_each():
    plan = Plan(global_batch_size=8, seq_len=512, dp=2, cp=2)
    assert Classes.one(plan).reps == [(0, 0)] and not Classes.one(plan).singletons
    assert len(Classes.each(plan).members) == 4 and Classes.each(plan).singletons


def _a2a_end(copies, klass, reduce: bool) -> float:
    """When an all-to-all of 1 MB on each group of ``copies`` ends on dgx-a100:2: one
    process carrying every copy (reduced), or one process per copy."""
    import simpy

    from sim.network.engine import CommEngine
    from sim.network.flows import Network
    from sim.network.topology import build_topology

    topo = build_topology(load_cluster("dgx-a100:2"))
    env = simpy.Environment()
    engine = CommEngine(env, topo, Network(env, topo.cap, topo.lat))
    if reduce:
        env.process(engine.run("all_to_all", "direct", copies[0], 1e6, copies, klass))
    else:
        for group in copies:
            env.process(engine.run("all_to_all", "direct", group, 1e6))
    env.run()
    return env.now


def test_all_to_all_copies_whose_classes_sit_in_another_order_aggregate_exactly():
    """Flow 0 joins classes (0, 1) in one copy and (1, 0) in the other: the group's flows
    aggregate by the classes they join, each copy with one member in each aggregate, and
    the copies end when they would unreduced."""
    klass = {0: 0, 8: 1, 1: 1, 9: 0}.__getitem__
    copies = [[0, 8], [1, 9]]
    assert _a2a_end(copies, klass, True) == pytest.approx(_a2a_end(copies, klass, False),
                                                          rel=1e-12)


def test_copies_whose_flows_differ_are_not_aggregated():
    """One copy's flows join classes (0, 1) and (1, 0), the other's (0, 0) twice: no
    aggregate holds each copy alike, so the copies may end at different times: refused."""
    from sim.network.flows import AsymmetricFlows

    klass = {0: 0, 8: 1, 1: 0, 9: 0}.__getitem__
    with pytest.raises(AsymmetricFlows, match="all_to_all flow"):
        _a2a_end([[0, 8], [1, 9]], klass, True)


def test_trace_of_a_reduced_faulted_run_says_what_it_shows(tmp_path):
    import json

    from sim import simulate

    m, c = load_model("llama3-8b"), load_cluster("dgx-a100:2")
    path = tmp_path / "trace.json"
    simulate(m, c, DP16, "des", faults=faults_from_options(["gpu:3=1.4"]), trace=str(path))
    note = json.loads(path.read_text())["otherData"]["note"]
    assert note.startswith("showing 2 of 16 GPUs: one data-parallel replica per symmetry "
                           "class (2 simulated)")
