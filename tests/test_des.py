"""The discrete-event tier: flows, collectives, topologies, schedules, the training step."""

import dataclasses
import json

import pytest
import simpy

from sim import Plan, load_cluster, load_model, simulate
from sim.cost.costmodel import roofline_for
from sim.des.run import simulate_des
from sim.layout.placement import GroupSpan
from sim.layout.schedule import Exchange, stage_ops, stage_program
from sim.network.algorithms import collective_time
from sim.network.alphabeta import fabric_for
from sim.network.engine import CommEngine
from sim.network.flows import Flow, Network, max_min_rates
from sim.network.perturbation import Perturbation
from sim.network.topology import bisection_Bps, build_topology, check_route

H100 = load_cluster("dgx-h100:4")
TOPO = build_topology(H100)


# flows --------------------------------------------------------------------------------
def test_two_flows_on_one_link_take_twice_as_long():
    env = simpy.Environment()
    net = Network(env, [1e9], [0.0])
    log = []

    def watch(name, event):
        yield event
        log.append((name, env.now))

    env.process(watch("a", net.transfer((0,), 1e9)))
    env.process(watch("b", net.transfer((0,), 1e9)))
    env.run()
    assert log == [("a", 2.0), ("b", 2.0)]


def test_max_min_three_links_by_hand():
    # A=10, B=4, C=10; f1 on A+B, f2 on B+C, f3 on A, f4 on C: B splits 2/2, A and C give 8
    flows = [Flow((0, 1), (1, 1), 1, None), Flow((1, 2), (1, 1), 1, None),
             Flow((0,), (1,), 1, None), Flow((2,), (1,), 1, None)]
    max_min_rates(flows, [10.0, 4.0, 10.0])
    assert [f.rate for f in flows] == [2.0, 2.0, 8.0, 8.0]


def test_weighted_flow_uses_its_weight():
    flows = [Flow((0,), (2.0,), 1, None), Flow((0,), (1.0,), 1, None)]
    max_min_rates(flows, [9.0])
    assert [f.rate for f in flows] == [3.0, 3.0]  # 2*3 + 3 = 9


def test_link_statistics():
    env = simpy.Environment()
    net = Network(env, [1e9, 1e9], [0.0, 0.0])
    net.transfer((0, 1), 5e8)
    env.run()
    assert net.stats.bytes.tolist() == [5e8, 5e8] and net.stats.busy_s.tolist() == [0.5, 0.5]


# collectives ----------------------------------------------------------------------------
CASES = [("all_reduce", "ring", 8, 1), ("all_reduce", "tree", 4, 4),
         ("all_reduce", "hierarchical", 16, 2), ("all_reduce", "nvls", 8, 1),
         ("all_reduce", "halving-doubling", 16, 2), ("all_gather", "ring", 16, 2),
         ("reduce_scatter", "ring", 8, 1), ("all_to_all", "direct", 16, 2),
         ("all_to_all", "pairwise", 8, 1), ("broadcast", "ring", 16, 2),
         ("kv_ring", "ring", 8, 1), ("kv_ring", "ring", 16, 2)]


@pytest.mark.parametrize("kind,algo,n,nodes", CASES, ids=[f"{a}-{b}-{c}-{d}" for a, b, c, d in
                                                         CASES])
@pytest.mark.parametrize("size", [2**10, 2**30])
def test_collectives_equal_their_closed_form_on_an_idle_network(kind, algo, n, nodes, size):
    per_node = n // nodes
    devices = [node * 8 + i for node in range(nodes) for i in range(per_node)]
    env = simpy.Environment()
    engine = CommEngine(env, TOPO, Network(env, TOPO.cap, TOPO.lat))
    env.process(engine.run(kind, algo, devices, size))
    env.run()
    closed = collective_time(kind, fabric_for(H100, GroupSpan(n, per_node, nodes, False)),
                             size, algo)
    assert env.now == pytest.approx(closed, rel=1e-3)


# topologies -----------------------------------------------------------------------------
@pytest.mark.parametrize("topology", ["fat-tree", "rail-optimized", "torus2d", "torus3d",
                                      "dragonfly"])
def test_routes_are_shortest_paths(topology):
    c = load_cluster("dgx-a100:8")
    c = dataclasses.replace(c, inter_node=dataclasses.replace(c.inter_node, topology=topology))
    t = build_topology(c)
    assert all(check_route(t, a, b) for a in range(0, 64, 5) for b in range(0, 64, 7) if a != b)


def test_oversubscribed_fat_tree_bisection_by_hand():
    c = load_cluster("dgx-a100:4")
    c = dataclasses.replace(c, inter_node=dataclasses.replace(c.inter_node, pod_gpus=16,
                                                              oversubscription=4.0))
    # two pods of 2 nodes: each pod's uplink is 2 nodes x 8 NICs x 23 GB/s / 4
    assert bisection_Bps(build_topology(c)) == pytest.approx(2 * 8 * 25e9 * 0.92 / 4)


def test_rail_optimized_spreads_over_spines():
    c = load_cluster("dgx-a100:4")
    c = dataclasses.replace(c, inter_node=dataclasses.replace(c.inter_node,
                                                              topology="rail-optimized"))
    t = build_topology(c)
    spines = {t.links[t.route(a, b)[2]][1] for a in range(8) for b in range(8, 16)
              if a % 8 != b % 8}
    assert len(spines) > 1  # ECMP: cross-rail paths use several spines


# schedules ------------------------------------------------------------------------------
@pytest.mark.parametrize("schedule,vpp", [("gpipe", 1), ("1f1b", 1), ("interleaved-1f1b", 2)])
def test_every_op_once_and_1f1b_warmup(schedule, vpp):
    p = Plan(global_batch_size=8, seq_len=128, pp=4, vpp=vpp, schedule=schedule)
    for stage in range(4):
        ops = stage_ops(p, stage)
        assert sorted(ops) == sorted((k, mb, c) for k in "FB" for mb in range(8)
                                     for c in range(vpp))
    ops = stage_ops(Plan(global_batch_size=8, seq_len=128, pp=4), 1)
    # pp - stage - 1 = 2 warm-up forwards, then one forward and one backward in turn
    assert [k for k, _, _ in ops[:6]] == ["F", "F", "F", "B", "F", "B"]


def test_1f1b_program_is_megatrons_by_hand():
    """pp 2, 2 micro-batches: stage 0 sends each forward's output on its own in the warm-up,
    then with receiving the gradient; stage 1 sends a gradient with receiving the next
    input. Messages name the virtual stage they enter."""
    p = Plan(global_batch_size=2, seq_len=128, pp=2)
    assert stage_program(p, 0) == [
        ("F", 0, 0), Exchange((("F", 0, 1),), ()), ("F", 1, 0),
        Exchange((("F", 1, 1),), (("B", 0, 0),)), ("B", 0, 0), Exchange((), (("B", 1, 0),)),
        ("B", 1, 0)]
    assert stage_program(p, 1) == [
        Exchange((), (("F", 0, 1),)), ("F", 0, 0), ("B", 0, 0),
        Exchange((("B", 0, 0),), (("F", 1, 1),)), ("F", 1, 0), ("B", 1, 0),
        Exchange((("B", 1, 0),), ())]


def _runs_to_the_end(p: Plan) -> bool:
    """Every stage's program completes when a transfer needs its sender and receiver to be
    in their calls at once and a call returns when all its transfers are done."""
    progs = [stage_program(p, s) for s in range(p.pp)]
    at, moved, done = [0] * p.pp, True, set()
    while moved:
        moved = False
        calls = [progs[s][at[s]] if at[s] < len(progs[s]) else None for s in range(p.pp)]
        for s, c in enumerate(calls):
            if c is not None and not isinstance(c, Exchange):
                at[s], moved = at[s] + 1, True
        sent = {m for c in calls if isinstance(c, Exchange) for m in c.sends}
        done |= {m for c in calls if isinstance(c, Exchange) for m in c.recvs if m in sent}
        for s, c in enumerate(calls):
            if isinstance(c, Exchange) and set(c.sends + c.recvs) <= done:
                at[s], moved = at[s] + 1, True
    sends = sorted(m for pr in progs for c in pr if isinstance(c, Exchange) for m in c.sends)
    recvs = sorted(m for pr in progs for c in pr if isinstance(c, Exchange) for m in c.recvs)
    return at == [len(pr) for pr in progs] and sends == recvs


@pytest.mark.parametrize("schedule,vpp", [("gpipe", 1), ("1f1b", 1), ("interleaved-1f1b", 2),
                                          ("interleaved-1f1b", 3)])
@pytest.mark.parametrize("pp,m", [(2, 2), (4, 4), (4, 12), (8, 16)])
def test_programs_match_and_never_deadlock(schedule, vpp, pp, m):
    assert _runs_to_the_end(Plan(global_batch_size=m, seq_len=128, pp=pp, vpp=vpp,
                                 schedule=schedule))


# the training step ------------------------------------------------------------------------
STEPS = [
    ("llama3-8b", "dgx-h100:2", dict(global_batch_size=8, seq_len=2048, dp=4, tp=2, pp=2,
                                     vpp=2, schedule="interleaved-1f1b")),
    ("llama3-8b", "dgx-h100:2", dict(global_batch_size=8, seq_len=2048, dp=8, tp=2,
                                     zero_stage=3)),
    ("mixtral-8x7b", "dgx-h100:2", dict(global_batch_size=8, seq_len=2048, dp=8, tp=2, ep=4,
                                        sequence_parallel=True, zero_stage=2)),
    ("llama3-8b", "dgx-h100:2", dict(global_batch_size=8, seq_len=4096, dp=2, tp=4, cp=2,
                                     sequence_parallel=True)),
]


@pytest.mark.parametrize("model,cluster,kw", STEPS, ids=["interleaved", "zero3", "moe-ep",
                                                         "cp"])
def test_reduced_equals_full(model, cluster, kw):
    m, c, p = load_model(model), load_cluster(cluster), Plan(**kw)
    cost = roofline_for(c.gpu)
    reduced = simulate_des(m, c, p, cost)
    full = simulate_des(m, c, p, cost, reduce=False)
    assert reduced.simulation["units"] < full.simulation["units"]
    assert reduced.iteration_s == pytest.approx(full.iteration_s, rel=1e-9)


def test_des_result_is_complete_and_adds_up(tmp_path):
    m, c = load_model("llama3-8b"), load_cluster("dgx-h100:2")
    p = Plan(global_batch_size=8, seq_len=2048, dp=4, tp=2, pp=2)
    r = simulate(m, c, p, "des", trace=str(tmp_path / "t.json"))
    assert sum(r.breakdown.values()) == pytest.approx(r.iteration_time_s, rel=1e-12)
    assert r.links and 0 < r.links[0]["utilization"] <= 1
    assert r.simulation["events"] > 0 and r.simulation["reduced"]
    events = json.loads((tmp_path / "t.json").read_text())["traceEvents"]
    assert {e["ph"] for e in events} >= {"X", "M", "s", "f"}
    again = simulate(m, c, p, "des")
    assert again.to_dict() | {"simulation": {}} == r.to_dict() | {"simulation": {}}


def test_des_agrees_with_analytic_when_compute_bound():
    m, c = load_model("gpt3-175b"), load_cluster("dgx-a100:16")
    p = Plan(global_batch_size=64, seq_len=2048, dp=4, tp=8, pp=4, recompute="full")
    a, d = simulate(m, c, p), simulate(m, c, p, "des")
    assert d.iteration_time_s == pytest.approx(a.iteration_time_s, rel=0.03)


def test_rings_stay_on_their_rail():
    """Across nodes each ring joins ranks of the same local index, so on a rail-optimized
    network a DP ring costs what the closed form says (it used to cross the spines)."""
    c = load_cluster("dgx-h100:4")
    c = dataclasses.replace(c, inter_node=dataclasses.replace(c.inter_node,
                                                              topology="rail-optimized"))
    m = load_model("llama3-8b")
    p = Plan(global_batch_size=32, seq_len=4096, dp=8, tp=2, pp=2,
             collectives=(("dp", "ring"),))
    a, d = simulate(m, c, p), simulate(m, c, p, "des")
    assert d.iteration_time_s == pytest.approx(a.iteration_time_s, rel=0.03)


def test_des_embedding_allreduce_by_hand():
    """The tied embedding's gradient all-reduce between the first and last stage, alone on
    the network after the data-parallel reduction: 2 alpha + S / beta, as the analytic
    tier's (50257 x 12288 / tp8 in fp16; 25 GB/s NICs at 92%, 5 us)."""
    m, c = load_model("gpt3-175b"), load_cluster("dgx-a100:16")
    p = Plan(global_batch_size=16, seq_len=2048, dp=4, tp=8, pp=4, recompute="full")
    t = simulate_des(m, c, p, roofline_for(c.gpu), record=True)
    by_hand = 2 * 5e-6 + 50257 * 12288 / 8 * 2 / (25e9 * 0.92)
    spans = [e["end"] - e["start"] for e in t.timeline if e["name"] == "embedding all-reduce"]
    assert spans == pytest.approx([by_hand, by_hand], rel=1e-9)
    assert t.breakdown["pp"] > by_hand


def test_compute_scale_uniform_is_exact_and_a_slow_rank_gets_its_own_class():
    m, c = load_model("llama3-8b"), load_cluster("dgx-h100:2")
    p = Plan(global_batch_size=8, seq_len=2048, dp=4, tp=2, pp=2)
    cost = roofline_for(c.gpu)
    base = simulate_des(m, c, p, cost)
    ones = Perturbation(compute_scale=[1.0] * c.world_size)
    same = simulate_des(m, c, p, cost, perturbation=ones)
    assert same.iteration_s == base.iteration_s and same.simulation["reduced"]
    # a whole stage twice as slow is still one unit per stage
    stage1 = [1.0] * 8 + [2.0] * 8  # default placement: stage 1 holds ranks 8..15
    slow_stage = simulate_des(m, c, p, cost, perturbation=Perturbation(compute_scale=stage1))
    assert slow_stage.simulation["reduced"] and slow_stage.iteration_s > base.iteration_s
    one = [1.0] * c.world_size
    one[9] = 1.5
    slow = simulate_des(m, c, p, cost, perturbation=Perturbation(compute_scale=one))
    # rank 9 is replica 0's stage 1: that replica is a class, the other three another
    assert slow.simulation["reduced"] and slow.simulation["classes"] == 2
    assert slow.simulation["units"] == 4 and "not_reduced_because" not in slow.simulation
    full = simulate_des(m, c, p, cost, reduce=False, perturbation=Perturbation(compute_scale=one))
    assert slow.iteration_s == pytest.approx(full.iteration_s, rel=1e-9)
    assert base.iteration_s < slow.iteration_s < slow_stage.iteration_s
    with pytest.raises(ValueError, match="entries"):
        simulate_des(m, c, p, cost, perturbation=Perturbation(compute_scale=[1.0]))
