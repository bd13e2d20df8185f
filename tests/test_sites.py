"""Sites joined by WAN links: the cluster file's rules, the presets, the WAN in both tiers
(the single-site limit), and the ways sites synchronise."""

from __future__ import annotations

import pytest

from sim import simulate
from sim.errors import SpecError
from sim.network.topology import build_topology
from sim.spec.cluster import cluster_from_dict, load_cluster
from sim.spec.plan import Plan
from sim.spec.zoo import load_any
from sim.strategies.sites import SiteSync, simulate_sites, single_site, wan_sweep


def _two(nodes: int = 2, gbps: float = 100.0, lat: float = 35.0, **extra: object):  # noqa: ANN202
    return cluster_from_dict({"gpus_per_node": 8, "gpu": "h100-sxm5-80gb",
                              "sites": [{"name": "e", "nodes": nodes},
                                        {"name": "w", "nodes": nodes}],
                              "wan": [{"a": "e", "b": "w", "Gbps": gbps, "latency_ms": lat}],
                              **extra}, "two")


@pytest.mark.parametrize(("change", "field"), [
    ({"sites": [{"name": "e", "nodes": 0}, {"name": "w", "nodes": 2}]}, "sites[0].nodes"),
    ({"sites": [{"name": "e", "nodes": 2}, {"name": "e", "nodes": 2}]}, "sites[1].name"),
    ({"sites": [{"name": "e", "nodes": 2, "inter_node": {"nic_Gbps": -1}},
                {"name": "w", "nodes": 3}]}, "sites[0].inter_node.nic_Gbps"),
    ({"sites": [{"name": "e", "nodes": 2}, {"name": "w", "nodes": 3,
                                             "inter_node": {"mtu": 9000}}]},
     "sites[1].inter_node.mtu"),
    ({"sites": [{"name": "e", "nodes": 2, "inter_node": {"nics_per_node": 0.5}},
                {"name": "w", "nodes": 3}]}, "sites[0].inter_node.nics_per_node"),
    ({"sites": [{"name": "e", "nodes": 2, "intra_node": {"bandwidth_GBps": 0}},
                {"name": "w", "nodes": 3}]}, "sites[0].intra_node.bandwidth_GBps"),
    ({"sites": [{"name": "e", "nodes": 2, "gpu": "h9000"},
                {"name": "w", "nodes": 3}]}, "sites[0].gpu"),
    ({"wan": [{"a": "e", "b": "mars", "Gbps": 1, "latency_ms": 1}]}, "wan[0].b"),
    ({"wan": [{"a": "e", "b": "w", "Gbps": -5, "latency_ms": 1}]}, "wan[0].Gbps"),
    ({"wan": [{"a": "e", "b": "w", "Gbps": 5, "latency_ms": -1}]}, "wan[0].latency_ms"),
    ({"wan": [{"a": "e", "b": "w", "Gbps": 5, "latency_ms": 1,
               "bandwidth_by_hour": [1.0] * 23}]}, "wan[0].bandwidth_by_hour"),
    ({"wan": []}, "wan"),
    ({"wan": [{"a": "e", "b": "w", "Gbps": 5}]}, "wan[0].latency_ms"),
    ({"wan": [{"a": "e", "b": "w", "Gbps": 5, "latency_ms": 1, "mtu": 9000}]}, "wan[0].mtu"),
    ({"inter_node": {"topology": "torus2d"}}, "inter_node.topology"),
    ({"node_groups": [{"nodes": 4, "gpu": "h100-sxm5-80gb"}]}, "sites"),
])
def test_bad_sites_name_the_field(change: dict, field: str) -> None:
    data = {"gpus_per_node": 8, "gpu": "h100-sxm5-80gb",
            "sites": [{"name": "e", "nodes": 2}, {"name": "w", "nodes": 2}],
            "wan": [{"a": "e", "b": "w", "Gbps": 100, "latency_ms": 35}]} | change
    with pytest.raises(SpecError) as err:
        cluster_from_dict(data, "x")
    assert err.value.field == field


def test_a_cluster_with_sites_round_trips_and_makes_sites_its_pods() -> None:
    c = _two(nodes=3)
    assert (c.nodes, c.pod_size, c.site_of_node(2), c.site_of_node(3)) == (6, 24, 0, 1)
    assert cluster_from_dict(c.to_dict(), "two") == c


def test_region_presets_take_published_round_trips() -> None:
    c = load_cluster("regions3-dgx-h100:2")
    assert [s.name for s in c.sites] == ["us-east", "us-west", "eu-west"]
    lat = {(w.a, w.b): w.latency_ms for w in c.wan}
    assert lat[("us-east", "us-west")] == pytest.approx(86.98 / 2)
    assert c.nodes == 6 and c.gpu.name == "h100-sxm5-80gb"


def test_wan_links_are_edges_of_the_flow_network() -> None:
    t = build_topology(_two(gbps=8.0, lat=20.0))
    path = t.route(0, 16)  # a device of site e to one of site w
    caps = [t.cap[i] for i in path]
    assert min(caps) == pytest.approx(1e9)  # 8 Gb/s
    assert t.path_latency(path) == pytest.approx(20e-3, rel=0.01)
    assert all(t.cap[i] > 1e9 for i in t.route(0, 8))  # inside the site: no WAN


PLAN = Plan(global_batch_size=64, seq_len=2048, dp=8, tp=4, micro_batch_size=1)


@pytest.mark.parametrize("fidelity", ["analytic", "des"])
def test_the_single_site_limit_is_the_single_cluster(fidelity: str) -> None:
    model = load_any("llama3-8b")
    lan = _two(gbps=1e6, lat=0.002)  # the WAN as wide and near as the fabric
    one = simulate(model, single_site(lan), PLAN, fidelity=fidelity).iteration_time_s
    two = simulate(model, lan, PLAN, fidelity=fidelity).iteration_time_s
    assert two == pytest.approx(one, rel=0.01)
    slow = simulate(model, _two(gbps=1.0), PLAN, fidelity=fidelity).iteration_time_s
    assert slow > 3 * one


@pytest.mark.parametrize("gbps", [1.0, 400.0])
def test_both_tiers_pay_the_wan_latency_once_a_bucket(gbps: float) -> None:
    """Flat BSP over a 40 ms WAN: the DES reduces the gradient bucket by bucket, each
    all-reduce paying its ring steps' latency, and the closed form prices the same buckets
    (it priced one all-reduce of everything: 8 times the DES's throughput at 400 Gb/s)."""
    model = load_any("llama3-8b")
    c = _two(gbps=gbps, lat=40.0)
    analytic, des = (simulate(model, c, PLAN, fidelity=f).iteration_time_s
                     for f in ("analytic", "des"))
    assert analytic == pytest.approx(des, rel=0.02)


def test_an_moe_plan_reduces_dense_and_expert_buckets_at_once() -> None:
    """Each bucket's dense and expert reductions run at once in the DES; the closed form
    charges one latency for both (it charged two: 46% above the DES here)."""
    model = load_any("mixtral-8x7b")
    plan = Plan(global_batch_size=32, seq_len=2048, micro_batch_size=1, dp=4, tp=4, pp=2,
                ep=2, sequence_parallel=True)
    c = _two(gbps=400.0, lat=40.0)
    analytic, des = (simulate(model, c, plan, fidelity=f).iteration_time_s
                     for f in ("analytic", "des"))
    assert analytic == pytest.approx(des, rel=0.1)


def test_the_buckets_hold_every_parameter_once() -> None:
    """A rank's gradient buckets add up to its parameters (multi-token prediction's
    projections included: the last chunk's bucket used to leave them out)."""
    from sim.layout.inventory import layer_buckets
    from sim.layout.memory import rank_params
    from sim.layout.stages import pipeline_rank_layers
    model = load_any("deepseek-v3")
    plan = Plan(global_batch_size=64, seq_len=4096, dp=8, ep=8, pp=4, micro_batch_size=1)
    for rank, st in enumerate(pipeline_rank_layers(plan, model)):
        dense, expert = rank_params(model, plan, st)
        buckets = layer_buckets(model, plan, rank)
        assert sum(d for d, _ in buckets) == pytest.approx(dense, rel=1e-12)
        assert sum(e for _, e in buckets) == pytest.approx(expert, rel=1e-12)
    assert model.num_mtp_layers > 0


def test_ways_to_synchronise_order_as_they_should() -> None:
    model = load_any("llama3-8b")
    c = _two(gbps=10.0)
    got = {s.label(): simulate_sites(model, c, PLAN, s).of_single_site for s in (
        SiteSync("flat"), SiteSync("hierarchical"), SiteSync("diloco", H=50),
        SiteSync("diloco", H=500), SiteSync("diloco", H=50, dtype="int8"),
        SiteSync("streaming-diloco", H=50, fragments=5, overlap=5))}
    assert got["flat"] < got["hierarchical"] < got["diloco H=50, fp32"] \
        < got["diloco H=500, fp32"] <= 1.0
    assert got["diloco H=50, int8"] > got["diloco H=50, fp32"]
    assert got["streaming-diloco H=50, 5 fragments, overlap 5, fp32"] >= got["diloco H=50, fp32"]
    wide = simulate_sites(model, wan_sweep(c, 400.0), PLAN, SiteSync("hierarchical"))
    assert wide.of_single_site > got["hierarchical"]


def test_site_sync_rules() -> None:
    with pytest.raises(SpecError, match="sync.kind"):
        SiteSync("gossip")
    with pytest.raises(SpecError, match="sync.fragments"):
        SiteSync("streaming-diloco", H=4, fragments=8)
    with pytest.raises(SpecError, match="plan.dp"):
        simulate_sites(load_any("llama3-8b"), _two(), Plan(global_batch_size=64,
                                                            seq_len=2048, dp=1, tp=8),
                       SiteSync("hierarchical"))


def test_a_day_of_wan_bandwidth() -> None:
    from sim.strategies.sites import over_a_day

    hours = [100.0] * 12 + [10.0] * 12
    c = _two(gbps=100.0)
    c = cluster_from_dict(c.to_dict() | {"wan": [{"a": "e", "b": "w", "Gbps": 100.0,
                                                  "latency_ms": 35.0,
                                                  "bandwidth_by_hour": hours}]}, "x")
    model = load_any("llama3-8b")
    day = over_a_day(model, c, PLAN, SiteSync("hierarchical"))
    fast = simulate_sites(model, wan_sweep(c, 100.0), PLAN, SiteSync("hierarchical"))
    slow = simulate_sites(model, wan_sweep(c, 10.0), PLAN, SiteSync("hierarchical"))
    assert day["tokens_per_s"] == pytest.approx((fast.tokens_per_s + slow.tokens_per_s) / 2)
    assert day["worst_hour"] == 12


def test_cli_sites(tmp_path, capsys) -> None:  # noqa: ANN001
    from trainsim.cli import main

    plan = tmp_path / "p.json"
    plan.write_text(PLAN.to_json() if hasattr(PLAN, "to_json") else __import__("json").dumps(
        PLAN.to_dict()))
    out = tmp_path / "run"
    assert main(["sites", "--model", "llama3-8b", "--cluster", "regions2-dgx-h100:2",
                 "--plan", str(plan), "--wan-gbps", "1,100", "--choose", "--out",
                 str(out)]) == 0
    text = capsys.readouterr().out
    assert "hierarchical" in text and "<- chosen" in text
    assert {p.name for p in out.iterdir()} == {"inputs.json", "sites.csv", "sites.png"}
    assert main(["sites", "--model", "llama3-8b", "--cluster", "dgx-h100:4", "--plan",
                 str(plan)]) == 2
    assert "cluster.sites" in capsys.readouterr().err
    assert main(["sites", "--model", "llama3-8b", "--cluster", "regions2-dgx-h100:2",
                 "--plan", str(plan), "--wan-gbps", "-1"]) == 2
    assert main(["sites", "--model", "llama3-8b", "--cluster", "regions2-dgx-h100:2",
                 "--plan", str(plan), "--sync", "diloco:H=x"]) == 2


def test_jitter_slows_the_wan_steps_and_two_stage_hides_the_rest() -> None:
    from sim.network.wan import jitter_s

    model = load_any("llama3-8b")
    calm = _two(gbps=10.0)
    shaky = cluster_from_dict(calm.to_dict() | {"wan": [{
        "a": "e", "b": "w", "Gbps": 10.0, "latency_ms": 35.0,
        "jitter": {"dist": "lognormal", "median": 2.0, "sigma": 1.0}}]}, "x")
    assert jitter_s(calm, 64) == 0.0
    assert jitter_s(shaky, 64) > jitter_s(shaky, 1) > 1e-3  # the largest of more draws
    for sync in (SiteSync("flat"), SiteSync("hierarchical")):
        assert simulate_sites(model, shaky, PLAN, sync).tokens_per_s < simulate_sites(
            model, calm, PLAN, sync).tokens_per_s
    hier = simulate_sites(model, calm, PLAN, SiteSync("hierarchical")).tokens_per_s
    two = simulate_sites(model, calm, PLAN, SiteSync("two-stage", fraction=0.1)).tokens_per_s
    assert two > hier
    assert simulate_sites(model, calm, PLAN, SiteSync("two-stage", fraction=1.0)).step_s \
        == pytest.approx(1 / hier * PLAN.global_batch_size * PLAN.seq_len)
    with pytest.raises(SpecError, match="wan\\[0\\].jitter.median"):
        cluster_from_dict(calm.to_dict() | {"wan": [{
            "a": "e", "b": "w", "Gbps": 10.0, "latency_ms": 35.0,
            "jitter": {"dist": "lognormal", "median": -2.0, "sigma": 1.0}}]}, "x")


def test_the_flow_network_draws_the_wan_jitter() -> None:
    """Both tiers charge a ring step the slowest jitter of the group's crossing flows: the
    closed form its expectation (over the empirical distribution), the DES a draw a step
    and flow (seeded: a run repeats)."""
    import numpy as np

    from sim.network.wan import jitter_s

    model = load_any("llama3-8b")
    calm = _two(gbps=10.0)
    shaky = cluster_from_dict(calm.to_dict() | {"wan": [{
        "a": "e", "b": "w", "Gbps": 10.0, "latency_ms": 35.0,
        "jitter": {"dist": "lognormal", "median": 2.0, "sigma": 1.0}}]}, "x")
    draws = 2e-3 * np.exp(np.random.default_rng(7).standard_normal((40_000, 4)))
    assert jitter_s(shaky, 4) == pytest.approx(draws.max(axis=1).mean(), rel=0.03)
    assert jitter_s(shaky, 1) == pytest.approx(2e-3 * np.exp(0.5), rel=0.03)  # the mean
    t = {(name, f): simulate(model, c, PLAN, fidelity=f).iteration_time_s
         for name, c in (("calm", calm), ("shaky", shaky)) for f in ("analytic", "des")}
    for f in ("analytic", "des"):
        assert t["shaky", f] > t["calm", f] + 1.0  # 33 buckets x 6 WAN steps x ~7 ms
    # the DES waits for the slowest of a unit's 4 TP ranks' groups bucket by bucket
    assert t["shaky", "analytic"] < t["shaky", "des"] < t["shaky", "analytic"] * 1.03
    assert simulate(model, shaky, PLAN, fidelity="des").iteration_time_s == t["shaky", "des"]


@pytest.mark.parametrize("preset", ["regions2-dgx-h100:2", "regions3-dgx-h100:2"])
def test_the_wan_exchange_as_flows_equals_its_closed_form(preset: str) -> None:
    """Hierarchical BSP's and DiLoCo's exchange over the WAN, run as flows on the topology
    (every rank of a site with its peers at the other sites, at once) against the closed
    form: equal on an idle network whatever binds (WAN rate, NICs, latency)."""
    from sim.strategies.sites import _wan_allreduce_des, _wan_allreduce_s

    for gbps in (1.0, 100.0, 1e4):
        c = wan_sweep(load_cluster(preset), gbps)
        ranks = (16,) * len(c.sites)
        assert _wan_allreduce_des(c, 1e9, ranks) == pytest.approx(
            _wan_allreduce_s(c, 1e9, ranks), rel=2e-3)
    model, c = load_any("llama3-8b"), _two(gbps=10.0)
    for sync in (SiteSync("hierarchical"), SiteSync("diloco", H=50)):
        a, d = (simulate_sites(model, c, PLAN, sync, f).tokens_per_s
                for f in ("analytic", "des"))
        assert d == pytest.approx(a, rel=0.01)


def test_placement_keeps_whole_replicas_at_each_site() -> None:
    from sim.layout.placement import SITE_PLACEMENT, group_span, site_aware

    c = _two(nodes=4)  # 2 x 32 GPUs
    plan = Plan(global_batch_size=64, seq_len=2048, dp=4, tp=8, pp=2, micro_batch_size=1)
    placed = site_aware(plan, c)
    assert placed.placement == SITE_PLACEMENT
    assert not group_span(placed, c, "pp").cross_pod  # stages inside a site
    assert group_span(placed, c, "dp").cross_pod  # replicas across the sites
    assert group_span(plan, c, "pp").cross_pod  # the default order would cross with PP
    mine = Plan(global_batch_size=64, seq_len=2048, dp=4, tp=8, pp=2, micro_batch_size=1,
                placement="tp-cp-dp-ep-pp")
    assert site_aware(mine, c) is mine  # a user's order is kept
    assert site_aware(plan, single_site(c)) is plan


def test_groups_that_leave_a_site_are_named_in_the_result() -> None:
    c = _two(nodes=4)
    mine = Plan(global_batch_size=64, seq_len=2048, dp=4, tp=8, pp=2, micro_batch_size=1,
                placement="tp-cp-dp-ep-pp")  # stages outermost: a pipeline across the WAN
    warns = simulate(load_any("llama3-8b"), c, mine).warnings
    assert any(w.startswith("pp groups span sites") for w in warns)
    fine = simulate(load_any("llama3-8b"), c, Plan(global_batch_size=64, seq_len=2048, dp=4,
                                                   tp=8, pp=2, micro_batch_size=1)).warnings
    assert not any("span sites" in w for w in fine)


def test_choose_with_hourly_wan_rates(tmp_path, capsys) -> None:  # noqa: ANN001
    import json

    from trainsim.cli import main

    plan = tmp_path / "p.json"
    plan.write_text(json.dumps(PLAN.to_dict()))
    hours = [100.0] * 12 + [10.0] * 12
    cl = tmp_path / "c.toml"
    cl.write_text('gpus_per_node = 8\ngpu = "h100-sxm5-80gb"\n[[sites]]\nname = "e"\n'
                  'nodes = 2\n[[sites]]\nname = "w"\nnodes = 2\n[[wan]]\na = "e"\nb = "w"\n'
                  f'Gbps = 100.0\nlatency_ms = 35.0\nbandwidth_by_hour = {hours}\n')
    assert main(["sites", "--model", "llama3-8b", "--cluster", str(cl), "--plan", str(plan),
                 "--choose"]) == 0
    out = capsys.readouterr().out
    assert "by hour" in out and "hour 12" in out and "<- chosen" in out


def test_diloco_steps_to_a_loss_come_from_the_measured_text_runs() -> None:
    """`text-cpu`: DiLoCo against BSP run for real on a small language model
    (experiments/diloco_text_cpu.py); H = 1 is BSP, and DiLoCo needs more inner steps to the
    same loss as its period grows, as measured."""
    from sim.strategies.accuracy import steps_over_bsp

    assert steps_over_bsp(1)["ratio"] == 1.0
    r10, r50 = steps_over_bsp(10), steps_over_bsp(50)
    assert 1.0 < r10["ratio"] < r50["ratio"]
    assert r10["low"] < r10["ratio"] < r10["high"] and "text" in r10["task"]
    with pytest.raises(SpecError, match="H"):
        steps_over_bsp(0)
    with pytest.raises(SpecError, match="convergence"):
        steps_over_bsp(10, "no-such-model")
    with pytest.raises(SpecError, match="lr"):
        steps_over_bsp(10, lr=-1.0)


def test_cli_sites_time_to_loss(tmp_path, capsys) -> None:  # noqa: ANN001
    import json

    from sim.cost.convergence import BUNDLED
    from trainsim.cli import main

    plan = tmp_path / "p.json"
    plan.write_text(json.dumps(PLAN.to_dict()))
    assert main(["sites", "--model", "llama3-8b", "--cluster", "regions2-dgx-h100:2",
                 "--plan", str(plan), "--wan-gbps", "10", "--convergence", "text-cpu",
                 "--json"]) == 0
    rows = {r["sync"]: r for r in json.loads(capsys.readouterr().out)}
    flat, dil = rows["flat"], rows["diloco H=50, fp32"]
    assert flat["steps_over_bsp"] == 1.0
    assert flat["time_to_loss_x"] == pytest.approx(1 / flat["of_single_site"])
    assert dil["time_to_loss_x"] == pytest.approx(dil["steps_over_bsp"] / dil["of_single_site"])
    assert rows["streaming-diloco H=50, 5 fragments, overlap 5, fp32"]["time_to_loss_x"] is None
    binary = tmp_path / "runs.csv"
    binary.write_bytes(b"kind,lr\n\xff\xfe,1\n")
    base = ["sites", "--model", "llama3-8b", "--cluster", "regions2-dgx-h100:2", "--plan",
            str(plan), "--sync", "hierarchical"]
    for bad, field in ((["--convergence", "nowhere.csv"], "convergence"),
                       (["--convergence", "text-cpu", "--lr", "-1"], "lr"),
                       (["--convergence", str(BUNDLED / "digits_cpu.csv")],
                        "convergence"),  # runs to an accuracy, not a loss
                       (["--convergence", str(binary)], "convergence")):
        assert main(base + bad) == 2
        err = capsys.readouterr().err
        assert field in err and len(err.strip().splitlines()) == 1


def test_choose_by_time_to_loss() -> None:
    """With a loss model the optimizer picks the least time to BSP's loss among the ways
    the model covers: DiLoCo when the WAN is slow, BSP when it is fast."""
    from optimizer.sites import choose_site_sync

    model = load_any("llama3-8b")
    picks = {}
    for gbps in (1.0, 1e4):
        ch = choose_site_sync(model, _two(gbps=gbps), PLAN, convergence="text-cpu")
        times = ch.time_to_loss_x
        assert times is not None and ch.chosen.sync.label() == min(times, key=times.get)
        assert all(k.startswith(("flat", "hierarchical", "diloco")) and "bf16" not in k
                   for k in times)
        assert "diloco H=1000, fp32" not in times  # beyond the measured periods
        picks[gbps] = ch.chosen.sync.kind
        assert ch.to_dict()["by"] == "time to loss" and "--floor" in ch.notes[0]
    assert picks[1.0] == "diloco" and picks[1e4] in ("flat", "hierarchical")
