"""Sites that differ: in size, GPU and fabric. Their pods, placement and WAN exchange in
both tiers, each site's own step, and the batch split by site speed."""

from __future__ import annotations

import itertools

import pytest

from sim import simulate
from sim.errors import SpecError
from sim.layout.placement import group_span
from sim.network.topology import build_topology
from sim.spec.cluster import cluster_from_dict
from sim.spec.plan import Plan
from sim.spec.zoo import load_any
from sim.strategies.sites import (
    SiteSync,
    _wan_allreduce_des,
    _wan_allreduce_s,
    simulate_sites,
    single_site,
    site_replicas,
    site_shares,
    site_steps,
)


def _mixed(gbps: float = 10.0, nodes: tuple[int, int] = (4, 2), **west: object):  # noqa: ANN202
    return cluster_from_dict({
        "gpus_per_node": 8, "gpu": "h100-sxm5-80gb",
        "sites": [{"name": "e", "nodes": nodes[0]}, {"name": "w", "nodes": nodes[1], **west}],
        "wan": [{"a": "e", "b": "w", "Gbps": gbps, "latency_ms": 35.0}]}, "mixed")


PLAN = Plan(global_batch_size=48, seq_len=2048, dp=12, tp=4, micro_batch_size=1)


def test_sites_of_different_sizes_are_pods_of_their_own() -> None:
    c = _mixed(nodes=(3, 1), gpu="a100-sxm4-80gb", inter_node={"nic_Gbps": 100.0})
    assert (c.nodes, c.pods, c.pod_size) == (4, (24,), 24)
    assert [c.site_of_node(n) for n in range(4)] == [0, 0, 0, 1]
    assert [g.gpu.name for g in c.node_groups] == ["h100-sxm5-80gb", "a100-sxm4-80gb"]
    assert c.node_nics(3) == (100.0, 8) and c.node_nics(0) == (400.0, 8)
    assert cluster_from_dict(c.to_dict(), "mixed") == c
    t = build_topology(c)
    assert min(t.cap[i] for i in t.route(0, 31)) == pytest.approx(10e9 / 8)  # the WAN
    assert all(t.cap[i] > 10e9 for i in t.route(0, 16))  # nodes 0 and 2: one site


def test_placement_sees_where_unequal_sites_meet() -> None:
    c = _mixed(nodes=(3, 1))  # 24 + 8 GPUs
    plan = Plan(global_batch_size=16, seq_len=2048, dp=4, tp=8, micro_batch_size=1)
    assert not group_span(plan, c, "tp").cross_pod
    assert group_span(plan, c, "dp").cross_pod
    assert site_replicas(c, plan) == [[0, 1, 2], [3]]
    straddles = Plan(global_batch_size=16, seq_len=2048, dp=2, tp=8, pp=2,
                     micro_batch_size=1)  # replica 1 on nodes 2 and 3: two sites
    assert group_span(straddles, c, "pp").cross_pod
    with pytest.raises(SpecError) as err:
        site_replicas(c, straddles)
    assert err.value.field == "plan.placement" and "replica 1 spans sites e, w" in str(err.value)


def _sites(nodes: tuple[int, ...], gbps: float):  # noqa: ANN202
    return cluster_from_dict({
        "gpus_per_node": 8, "gpu": "h100-sxm5-80gb",
        "sites": [{"name": f"s{i}", "nodes": n} for i, n in enumerate(nodes)],
        "wan": [{"a": f"s{i}", "b": f"s{j}", "Gbps": gbps, "latency_ms": 35.0}
                for i in range(len(nodes)) for j in range(i + 1, len(nodes))]}, "sites")


@pytest.mark.parametrize("gbps", [1.0, 100.0, 1e5])
def test_the_exchange_between_unequal_sites_as_flows_equals_its_closed_form(gbps: float
                                                                           ) -> None:
    """The smaller site's ranks carry larger shards; its NICs may be slower too: whatever
    binds (the WAN, the small site's NICs), the flows and the closed form agree, also
    where one site's rank count does not divide another's (24 and 16: the gradient is cut
    wherever a shard ends, not into equal pieces)."""
    clusters = [(_mixed(gbps), (32, 16)),
                (_mixed(gbps, inter_node={"nic_Gbps": 100.0}), (32, 16)),
                (_sites((3, 2), gbps), (24, 16)), (_sites((5, 3), gbps), (40, 24)),
                (_sites((3, 2, 2), gbps), (24, 16, 16))]
    for c, ranks in clusters:
        assert _wan_allreduce_des(c, 1e10, ranks) == pytest.approx(
            _wan_allreduce_s(c, 1e10, ranks), rel=2e-4)
    latency = 2 * 35e-3  # two ring steps
    fast = _wan_allreduce_s(_mixed(1e5), 1e11, (32, 16)) - latency
    slow = _wan_allreduce_s(_mixed(1e5, inter_node={"nic_Gbps": 100.0}), 1e11, (32, 16))
    assert slow - latency == pytest.approx(4 * fast)  # NIC-bound: a quarter of the rate


@pytest.mark.parametrize("fidelity", ["analytic", "des"])
def test_unequal_sites_reach_the_single_cluster_as_the_wan_reaches_the_lan(fidelity: str
                                                                          ) -> None:
    model = load_any("llama3-8b")
    lan = cluster_from_dict({**_mixed().to_dict(), "wan": [
        {"a": "e", "b": "w", "Gbps": 1e6, "latency_ms": 0.002}]}, "lan")
    one = simulate(model, single_site(lan), PLAN, fidelity=fidelity).iteration_time_s
    assert simulate(model, lan, PLAN, fidelity=fidelity).iteration_time_s == \
        pytest.approx(one, rel=0.01)


def test_each_site_steps_on_its_own_gpus_and_the_slowest_sets_the_pace() -> None:
    model = load_any("llama3-8b")
    c = _mixed(gpu="a100-sxm4-80gb")
    (east, e_plan), (west, w_plan) = site_shares(c, PLAN)
    assert (east.gpu.name, west.gpu.name, e_plan.dp, w_plan.dp) == \
        ("h100-sxm5-80gb", "a100-sxm4-80gb", 8, 4)
    e, w = (simulate(model, x, p).iteration_time_s for x, p in site_shares(c, PLAN))
    assert w > 1.5 * e  # same micro-batches a replica on slower GPUs
    r = simulate_sites(model, c, PLAN, SiteSync("hierarchical"))
    assert r.site_step_s == {"e": pytest.approx(e), "w": pytest.approx(w)}
    assert r.inner_step_s == pytest.approx(w)
    assert r.step_s == pytest.approx(w + r.wan_s_per_sync)
    assert any(n.startswith("sites wait for w each step: e idle") for n in r.notes)


def test_the_batch_split_by_site_speed_is_the_best_whole_split() -> None:
    from optimizer.sites import balance_sites

    model = load_any("llama3-8b")
    c = _mixed(gpu="a100-sxm4-80gb")
    even = site_steps(model, c, PLAN).inner_s
    plan = balance_sites(model, c, PLAN)
    assert sum(plan.replica_microbatches) == 48
    held = site_replicas(c, plan)
    assert all(len({plan.replica_microbatches[d] for d in reps}) == 1 for reps in held)
    best = site_steps(model, c, plan).inner_s
    assert best < 0.7 * even

    def slowest(ke: int, kw: int) -> float:
        p = Plan(global_batch_size=48, seq_len=2048, dp=12, tp=4, micro_batch_size=1,
                 micro_batches_per_replica=(ke,) * 8 + (kw,) * 4)
        return site_steps(model, c, p).inner_s

    every = [slowest(ke, kw) for ke, kw in itertools.product(range(1, 6), range(1, 9))
             if 8 * ke + 4 * kw == 48]
    assert best == pytest.approx(min(every))
    faster = simulate_sites(model, c, plan, SiteSync("diloco", H=50)).tokens_per_s
    assert faster > 1.2 * simulate_sites(model, c, PLAN, SiteSync("diloco", H=50)).tokens_per_s
    alike = _mixed()  # one GPU type: the even split stays
    assert balance_sites(model, alike, PLAN).micro_batches_per_replica is None


def test_cli_sites_balance(tmp_path, capsys) -> None:  # noqa: ANN001
    import json

    from trainsim.cli import main

    (tmp_path / "c.toml").write_text(
        'gpus_per_node = 8\ngpu = "h100-sxm5-80gb"\n'
        '[[sites]]\nname = "e"\nnodes = 4\n'
        '[[sites]]\nname = "w"\nnodes = 2\ngpu = "a100-sxm4-80gb"\n'
        '[[wan]]\na = "e"\nb = "w"\nGbps = 10\nlatency_ms = 35\n')
    (tmp_path / "p.json").write_text(json.dumps(PLAN.to_dict()))
    args = ["sites", "--model", "llama3-8b", "--cluster", str(tmp_path / "c.toml"),
            "--plan", str(tmp_path / "p.json"), "--sync", "hierarchical"]
    assert main(args) == 0
    assert "note: sites wait for w each step: e idle" in capsys.readouterr().out
    assert main([*args, "--balance"]) == 0
    out = capsys.readouterr().out
    assert "batch over the sites: e 5, w 2 micro-batches a replica" in out
    bad = tmp_path / "bad.toml"
    bad.write_text((tmp_path / "c.toml").read_text().replace(
        'a100-sxm4-80gb"\n', 'a100-sxm4-80gb"\n[sites.inter_node]\nnic_Gbps = -4\n'))
    assert main([*args[:3], "--cluster", str(bad), *args[5:]]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "sites[1].inter_node.nic_Gbps" in err[0]
    assert main([*args[:3], "--cluster", "dgx-h100:6", *args[5:], "--balance"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cluster.sites" in err[0]
    assert main([*args, "--balance", "--wan-gbps", "10,100", "--out",
                 str(tmp_path / "o")]) == 0
    import pandas as pd

    df = pd.read_csv(tmp_path / "o" / "sites.csv")
    assert {"step_s_e", "step_s_w"} <= set(df.columns) and "site_step_s" not in df.columns


def test_the_split_by_speed_moves_whole_units_of_a_schedule() -> None:
    """Interleaved 1F1B moves ``pp`` micro-batches at a time; DualPipeV keeps at least
    ``2 pp`` a replica (here every replica is at that floor: nothing moves)."""
    from optimizer.sites import balance_sites

    model = load_any("llama3-8b")
    c = _mixed(nodes=(4, 4), gpu="a100-sxm4-80gb")
    inter = Plan(global_batch_size=64, seq_len=2048, dp=16, tp=2, pp=2, micro_batch_size=1,
                 schedule="interleaved-1f1b", vpp=2)
    split = balance_sites(model, c, inter).micro_batches_per_replica
    assert split is not None and sum(split) == 64 and all(m % 2 == 0 for m in split)
    assert split[0] > split[-1]  # the H100 site's replicas carry more
    dualpipev = Plan(global_batch_size=64, seq_len=2048, dp=16, tp=2, pp=2, vpp=2,
                     micro_batch_size=1, schedule="dualpipev")
    assert balance_sites(model, c, dualpipev).micro_batches_per_replica is None


def test_the_mixed_example_loads_as_two_sites_of_their_own_gpus() -> None:
    from pathlib import Path

    from sim.spec.cluster import load_cluster

    c = load_cluster(str(Path(__file__).parents[1] / "examples" / "two-regions-mixed.toml"))
    assert [(g.nodes, g.gpu.name, g.nic_Gbps) for g in c.node_groups] == [
        (8, "h100-sxm5-80gb", 400.0), (8, "a100-sxm4-80gb", 200.0)]
    assert c.pods == 64 and len(c.wan) == 1


def test_what_the_local_ways_and_the_split_refuse() -> None:
    """Expert-parallel groups across sites, plans an uneven split cannot express, a
    cluster without sites, a first site on another device than the cluster's."""
    from optimizer.sites import balance_sites

    model, c = load_any("mixtral-8x7b"), _mixed(nodes=(4, 2), gpu="a100-sxm4-80gb")
    moe = Plan(global_batch_size=96, seq_len=4096, dp=24, tp=2, ep=8, sequence_parallel=True)
    with pytest.raises(SpecError) as err:
        balance_sites(model, c, moe)
    assert err.value.field == "--balance" and "ep=8" in str(err.value)
    hint = simulate_sites(model, c, moe, SiteSync("hierarchical")).notes
    assert not any("--balance" in n for n in hint)  # (not suggested where it cannot run)
    table = list(range(48))  # replicas 0-5 at e in order, but swap two EP peers across
    table[8:16], table[40:48] = table[40:48], table[8:16]
    crossing = Plan(global_batch_size=96, seq_len=4096, dp=24, tp=2, ep=8,
                    sequence_parallel=True, placement=tuple(table))
    with pytest.raises(SpecError) as err:
        site_replicas(c, crossing)
    assert err.value.field == "plan.placement" and "ep groups span sites" in str(err.value)
    with pytest.raises(SpecError) as err:
        site_replicas(single_site(c), PLAN)
    assert err.value.field == "cluster.sites"
    with pytest.raises(SpecError) as err:
        cluster_from_dict({**_mixed().to_dict(), "sites": [
            {"name": "e", "nodes": 4, "gpu": "a100-sxm4-80gb"}, {"name": "w", "nodes": 2}]},
            "x")
    assert err.value.field == "sites[0].gpu"
    with pytest.raises(SpecError) as err:
        cluster_from_dict({**_mixed().to_dict(), "sites": [
            {"name": "e", "nodes": 4}, {"name": "w", "nodes": 2, "gpu": ""}]}, "x")
    assert err.value.field == "sites[1].gpu"


def test_a_loss_model_of_two_replicas_says_so_across_three_sites() -> None:
    from optimizer.sites import choose_site_sync
    from sim.spec.cluster import load_cluster
    from sim.strategies.accuracy import replicas_note

    assert replicas_note("text-cpu", 2) == [] and replicas_note("my-runs.csv", 5) == []
    plan = Plan(global_batch_size=48, seq_len=2048, dp=12, tp=4, micro_batch_size=1)
    notes = choose_site_sync(load_any("llama3-8b"), load_cluster("regions3-dgx-h100:2"), plan,
                             convergence="text-cpu").notes
    assert any("fitted to 2 replicas, here 3 sites" in n for n in notes)
