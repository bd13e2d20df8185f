"""Stragglers and failures: slow-down factors, failed links, restart-from-checkpoint goodput."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import simpy

from sim import Plan, SpecError, load_cluster, load_model, simulate
from sim.analytic.goodput import (
    GoodputInputs,
    expected_time_s,
    goodput_report,
    monte_carlo,
    optimal_interval_s,
    segment_time_s,
    young_interval_s,
)
from sim.cost.profiled import cost_model_for
from sim.des.run import simulate_des
from sim.network.failures import fault_inputs, link_ids, resolve, stage_scales
from sim.network.flows import Network
from sim.network.topology import build_topology
from sim.spec.faults import Faults, faults_from_options, parse_dist, parse_failure, parse_straggler
from sim.spec.scenario import apply_cluster_edits
from trainsim.cli import main

DP16 = Plan(global_batch_size=32, seq_len=1024, dp=16)


# parsing and resolving ----------------------------------------------------------------------
def test_parse_options():
    assert parse_straggler("gpu:5=1.3") == ("gpu", "5", 1.3)
    assert parse_straggler("link:nic3.0-pod0=2") == ("link", "nic3.0-pod0", 2.0)
    assert parse_dist("lognormal:0.1").scope == "gpu"
    assert parse_dist("node:uniform:1:1.3").params == (1.0, 1.3)
    assert parse_failure("nic3.0-pod0@0.5") == ("nic3.0-pod0", 0.5)


@pytest.mark.parametrize(("call", "text", "rule"), [
    (parse_straggler, "gpu:5", "SCOPE:NAME=FACTOR"),
    (parse_straggler, "node:x=2", "non-negative integer"),
    (parse_straggler, "gpu:1=0", "factor > 0"),
    (parse_dist, "normal:0.1", "lognormal:SIGMA"),
    (parse_dist, "uniform:2:1", "LO <= HI"),
    (parse_failure, "nic0.0", "LINK@SECONDS"),
    (parse_failure, "nic0.0@-1", "seconds >= 0"),
])
def test_parse_errors_name_the_option(call, text, rule):
    with pytest.raises(SpecError, match=rule) as exc:
        call(text)
    assert exc.value.field.startswith("--")


def test_resolve_multiplies_fixed_factors_and_checks_names():
    cluster = load_cluster("dgx-a100:2")
    topo = build_topology(cluster)
    r = resolve(faults_from_options(["node:1=1.5", "gpu:9=2"]), cluster, topo)
    assert r.compute_scale is not None
    assert r.compute_scale[:8] == [1.0] * 8 and r.compute_scale[8] == 1.5
    assert r.compute_scale[9] == 3.0
    assert len(link_ids(topo, "nic0.0-pod0", "x")) == 2
    assert len(link_ids(topo, "nic0.0", "x")) == 4  # gpu0 <-> nic, nic <-> pod
    for bad in (["node:2=1.5"], ["link:nic9.0=2"], ["link:gpu0-gpu9=2"]):
        with pytest.raises(SpecError, match="--straggler"):
            resolve(faults_from_options(bad), cluster, topo)


def test_seeded_draws_are_reproducible():
    cluster = load_cluster("dgx-a100:2")
    topo = build_topology(cluster)

    def draw(seed: int, dist: str = "lognormal:0.1") -> list[float] | None:
        return resolve(faults_from_options(dists=[dist], seed=seed), cluster, topo).compute_scale

    assert draw(7) == draw(7) and draw(7) != draw(8)
    nodes = draw(3, "node:uniform:1:1.3")
    assert nodes is not None and len(set(nodes[:8])) == 1 and 1 <= min(nodes) <= max(nodes) <= 1.3
    links = resolve(faults_from_options(dists=["link:uniform:1:2"], seed=1), cluster, topo)
    assert all(links.link_scale[2 * i] == links.link_scale[2 * i + 1]
               for i in range(len(topo.links) // 2))  # both directions of a cable alike


def test_stage_scale_is_the_slowest_rank_of_each_stage():
    plan = Plan(global_batch_size=8, seq_len=256, dp=4, pp=2)
    scale = [1.0] * 8
    scale[6] = 1.3  # rank 6: stage 1 (pp is the outermost dimension)
    assert stage_scales(plan, scale) == [1.0, 1.3]
    assert stage_scales(plan, None) is None


# stragglers in both tiers -------------------------------------------------------------------
def test_slow_node_adds_its_compute_share():
    """pp = 1, dp = 16: the step waits for the slow replica. The analytic tier adds half of
    compute + optimizer exactly; the DES a little less (the slow replica's longer backward
    hides more of its gradient reduction), reduced to two symmetry classes (the slow node's
    eight replicas and the rest)."""
    model, cluster = load_model("llama3-8b"), load_cluster("dgx-a100:2")
    slow = faults_from_options(["node:1=1.5"])
    for fidelity in ("analytic", "des"):
        base = simulate(model, cluster, DP16, fidelity)
        hit = simulate(model, cluster, DP16, fidelity, faults=slow)
        share = 0.5 * (base.breakdown["compute"] + base.breakdown["optimizer"])
        added = hit.iteration_time_s - base.iteration_time_s
        if fidelity == "analytic":
            assert added == pytest.approx(share, rel=1e-9)
        else:
            assert 0.8 * share < added <= share * (1 + 1e-9)
            assert hit.simulation["classes"] == 2 and hit.simulation["units"] == 2
    assert hit.simulation["faults"]["slowest_gpu_scale"] == 1.5


def test_slow_link_slows_the_des_and_is_a_note_in_the_analytic_tier():
    model, cluster = load_model("tiny"), load_cluster("dgx-a100:2")
    plan = Plan(global_batch_size=16, seq_len=256, dp=16)
    slow = faults_from_options(["link:nic0.0=4"])
    base = simulate(model, cluster, plan, "des")
    hit = simulate(model, cluster, plan, "des", faults=slow)
    assert hit.iteration_time_s > base.iteration_time_s * 1.05
    assert hit.breakdown["compute"] == pytest.approx(base.breakdown["compute"])
    analytic = simulate(model, cluster, plan, faults=slow)
    assert any("ignores link" in w for w in analytic.warnings)


# failed links -------------------------------------------------------------------------------
def test_network_reroute_exact_timeline():
    """4 bytes on a 1 B/s link; at t = 1 it fails and the flow moves to a 2 B/s link:
    3 bytes left at 2 B/s, done at 2.5 s."""
    env = simpy.Environment()
    net = Network(env, [1.0, 2.0], [0.0, 0.0])
    log = []
    done = net.transfer([0], 4.0)
    done.callbacks.append(lambda _e: log.append(("done", env.now)))

    def detour(flow):
        if 0 in flow.lid:
            flow.links, flow.lid, flow.w = (1,), np.array([1]), np.array([1.0])

    def fail():
        yield env.timeout(1.0)
        net.reroute(detour)
        log.append(("failed", env.now))

    env.process(fail())
    env.run()
    assert log == [("failed", 1.0), ("done", 2.5)]


def _tiny_step(cluster, failure: str):
    plan = Plan(global_batch_size=16, seq_len=256, dp=16)
    return simulate(load_model("tiny"), cluster, plan, "des",
                    faults=faults_from_options(failures=[failure]))


def test_failed_nic_on_a_fat_tree_reroutes():
    """gpu0's NIC fails: its traffic goes over NVSwitch to a neighbour's NIC — slower than
    healthy, but it completes; a failure after the step ends changes nothing."""
    cluster = load_cluster("dgx-a100:2")
    plan = Plan(global_batch_size=16, seq_len=256, dp=16)
    healthy = simulate(load_model("tiny"), cluster, plan, "des").iteration_time_s
    rerouted = _tiny_step(cluster, "nic0.0@0")
    assert healthy < rerouted.iteration_time_s < 2 * healthy
    assert "cannot_complete" not in rerouted.simulation
    assert _tiny_step(cluster, "nic0.0@10").iteration_time_s == pytest.approx(healthy,
                                                                             rel=1e-12)


def test_a_failed_nic_is_its_replicas_own_class():
    """gpu0's NIC fails: gpu0's replica is a class of its own, re-routed flows are re-routed
    member by member, and the reduced step equals the unreduced one (an earlier reduced
    run ignored the detour of gpu0's traffic and gave the healthy time)."""
    cluster = load_cluster("dgx-a100:2")
    plan = Plan(global_batch_size=16, seq_len=256, dp=16)
    f = fault_inputs(faults_from_options(failures=["nic0.0@0"]), cluster, plan, "des", True)
    assert f.reduce
    args = (load_model("tiny"), cluster, plan, cost_model_for(cluster))
    asked = simulate_des(*args, reduce=True, perturbation=f.perturbation)
    full = simulate_des(*args, reduce=False, perturbation=f.perturbation)
    assert asked.simulation["reduced"] and asked.simulation["classes"] < 16
    assert "not_reduced_because" not in asked.simulation
    assert asked.iteration_s == pytest.approx(full.iteration_s, rel=1e-9)
    assert full.iteration_s > simulate_des(*args).iteration_s


def test_failed_only_path_cannot_complete():
    cluster = apply_cluster_edits(load_cluster("dgx-a100:2"), [("inter_node.nics_per_node", 1)])
    r = _tiny_step(cluster, "nic0.0-pod0@0")
    assert math.isinf(r.iteration_time_s) and r.tokens_per_s == 0.0
    assert "no path from gpu" in r.simulation["cannot_complete"]
    assert any(w.startswith("step cannot complete") for w in r.warnings)
    data = json.loads(json.dumps(r.to_dict(), allow_nan=False))
    assert data["iteration_time_s"] is None


# goodput ------------------------------------------------------------------------------------
def test_goodput_closed_form_by_hand():
    # no failures to speak of: work plus one write per segment (3 segments of 4, 4, 2)
    x = GoodputInputs(1.0, 10, 1, 1e15, 4, 0.5, 100.0)
    assert expected_time_s(x) == pytest.approx(10 + 3 * 0.5, rel=1e-9)
    # Daly: M e^(R/M) (e^(w/M) - 1) with M = 100, R = 10, w = 50
    assert segment_time_s(50.0, 10.0, 100.0) == pytest.approx(
        100 * math.exp(0.1) * (math.exp(0.5) - 1), rel=1e-12)
    assert young_interval_s(2.0, 100.0) == pytest.approx(20.0)
    assert optimal_interval_s(300.0, 100.0) == 100.0


def test_monte_carlo_agrees_with_the_closed_form():
    """A 1,024-GPU job, MTBF 2,000 h per GPU (about a failure every 2 h), 10 s iterations,
    checkpoints every 5 min: the seeded Monte Carlo's mean is within 3 standard errors and
    1% of the closed form."""
    x = GoodputInputs(10.0, 5000, 1024, 2000 * 3600.0, 30, 20.0, 120.0)
    mean, err = monte_carlo(x, trials=300, seed=1)
    closed = expected_time_s(x)
    assert abs(mean - closed) < 3 * err and abs(mean / closed - 1) < 0.01
    assert monte_carlo(x, trials=20, seed=5) == monte_carlo(x, trials=20, seed=5)


def test_optimal_interval_beats_its_neighbours():
    x = GoodputInputs(10.0, 5000, 1024, 2000 * 3600.0, 30, 20.0, 120.0)
    r = goodput_report(x)
    k = int(r["optimal_checkpoint_every"])

    def at(every: int) -> float:
        return expected_time_s(GoodputInputs(10.0, 5000, 1024, 2000 * 3600.0, every, 20.0,
                                             120.0))

    assert at(k) <= min(at(k // 2), at(2 * k))
    assert 0 < r["goodput"] < r["goodput_at_optimum"] < 1


# the command line ---------------------------------------------------------------------------
@pytest.fixture()
def plan_file(tmp_path):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(Plan(global_batch_size=16, seq_len=256, dp=16).to_dict()))
    return str(path)


@pytest.mark.parametrize(("extra", "field"), [
    (["--straggler", "gpu:16=2"], "--straggler: gpu 16"),
    (["--straggler-dist", "lognormal"], "--straggler-dist:"),
    (["--fail-link", "nic0.0@1"], "--fail-link: needs --fidelity des"),
    (["--fidelity", "des", "--fail-link", "nic7.9@1"], "--fail-link: 'nic7.9'"),
    (["--straggler", "gpu:\u00b3=2"], "--straggler: a gpu is a non-negative integer"),
    (["--straggler-dist", "lognormal:0.1", "--seed", "-1"], "--seed: must be an integer >= 0"),
    (["--set", "faults.seed=-5"], "faults.seed: must be an integer >= 0"),
    # factors that draw or multiply to infinity or 0: no time to simulate
    (["--straggler-dist", "lognormal:1000"], "--straggler-dist: the slow-down factors come out"),
    (["--fidelity", "des", "--straggler-dist", "lognormal:1000"], "--straggler-dist: the slow"),
    (["--straggler", "gpu:1=1e308", "--straggler", "gpu:1=10"], "--straggler: the slow-down"),
    (["--fidelity", "des", "--straggler", "gpu:1=1e-300", "--straggler", "gpu:1=1e-300"],
     "--straggler: the slow-down factors come out at 0"),
    (["--straggler", "link:nic0.0=1e308", "--straggler", "link:nic0.0=10"], "--straggler: the"),
])
def test_simulate_bad_fault_options_exit_2(capsys, plan_file, extra, field):
    rc = main(["simulate", "--model", "tiny", "--cluster", "dgx-a100:2", "--plan", plan_file,
               *extra])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith(f"trainsim: error: {field}") and err.count("\n") == 1


def test_simulate_straggler_and_cannot_complete_output(capsys, plan_file):
    args = ["simulate", "--model", "tiny", "--cluster", "dgx-a100:2", "--plan", plan_file]
    assert main([*args, "--straggler", "node:1=1.5", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["simulation"]["faults"]["stragglers"] == ["node:1=1.5"]
    assert main([*args, "--fidelity", "des", "--fail-link", "nic0.0@0",
                 "--set", "inter_node.nics_per_node=1"]) == 0
    assert "STEP CANNOT COMPLETE: no path" in capsys.readouterr().out


def test_goodput_command(capsys, plan_file):
    base = ["goodput", "--gpus", "1024", "--mtbf-hours", "2000", "--iterations", "5000",
            "--ckpt-write-s", "20", "--restart-s", "120", "--monte-carlo", "50"]
    assert main([*base, "--iteration-s", "10", "--checkpoint-every", "5m", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["inputs"]["checkpoint_every"] == 30
    assert out["goodput"] == pytest.approx(5000 * 10 / expected_time_s(
        GoodputInputs(10.0, 5000, 1024, 2000 * 3600.0, 30, 20.0, 120.0)))
    assert main([*base, "--iteration-s", "10", "--checkpoint-every", "-3"]) == 2
    assert "--checkpoint-every:" in capsys.readouterr().err
    assert main(["goodput", "--model", "tiny", "--cluster", "dgx-a100:2", "--plan", plan_file,
                 "--mtbf-node-hours", "1000", "--iterations", "100", "--checkpoint-every",
                 "10", "--ckpt-write-s", "1", "--restart-s", "1"]) == 0
    assert "on 16 GPUs" in capsys.readouterr().out


_GOODPUT = ["goodput", "--iterations", "1000", "--ckpt-write-s", "10", "--restart-s", "60",
            "--gpus", "8", "--mtbf-hours", "1000", "--iteration-s", "1", "--checkpoint-every",
            "10"]


@pytest.mark.parametrize(("edits", "expected"), [
    ({"--iteration-s": "0", "--checkpoint-every": "30m"}, "--iteration-s: must be a positive"),
    ({"--iteration-s": "nan", "--checkpoint-every": "30m"}, "--iteration-s: must be a positive"),
    ({"--checkpoint-every": "infs"}, "--checkpoint-every: must be a positive number"),
    ({"--mtbf-hours": None, "--mtbf-node-hours": "-1"},
     "--mtbf-node-hours: must be a positive number, got -1\n"),
    ({"--seed": "-1"}, "--seed: must be an integer >= 0, got -1"),
    # a failure every 0.036 s: a 110 s segment needs e^3000 tries, beyond a float
    ({"--gpus": "100000", "--mtbf-hours": "1", "--checkpoint-every": "100"},
     "--checkpoint-every: the expected time overflows"),
    ({"--iteration-s": "1e300"}, "--checkpoint-every: the expected time overflows"),
    # e^305 tries: finite, but the Monte Carlo would never end
    ({"--gpus": "100000", "--mtbf-hours": "10", "--checkpoint-every": "100"},
     "--monte-carlo: 200 runs would draw about"),
])
def test_goodput_bad_input_is_one_line_exit_2(capsys, edits, expected):
    args = list(_GOODPUT)
    for option, value in edits.items():
        if option in args:
            i = args.index(option)
            del args[i:i + 2]
        if value is not None:
            args += [option, value]
    rc = main(args)
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("trainsim: error: ") and err.count("\n") == 1, err
    assert expected in err, err


def test_faults_empty():
    assert Faults().empty and not faults_from_options(["gpu:0=1.1"]).empty


def test_sweep_varies_a_straggler():
    from optimizer.sweep.grid import SweepSpec, check_spec, evaluate_point

    spec = SweepSpec("tiny", "dgx-a100:2", fixed=(("global_batch_size", 16), ("seq_len", 256)),
                     axes=(("straggler", ("none", "node:1=1.5")),))
    check_spec(spec)
    rows = [evaluate_point(spec, {"straggler": v}) for v in ("none", "node:1=1.5")]
    assert rows[1]["iteration_time_s"] > rows[0]["iteration_time_s"]
    bad = SweepSpec("tiny", "dgx-a100:2", fixed=spec.fixed, axes=(("straggler", ("node:1",)),))
    with pytest.raises(SpecError, match="^straggler: must be SCOPE:NAME=FACTOR"):
        check_spec(bad)


def test_scenario_file_faults(capsys, tmp_path, plan_file):
    toml = tmp_path / "whatif.toml"
    toml.write_text('[scenario.slow]\nfaults.straggler = "node:1=1.5"\n'
                    '[scenario.spread]\nfaults = { straggler_dist = "lognormal:0.1", seed = 3 }\n')
    args = ["simulate", "--model", "tiny", "--cluster", "dgx-a100:2", "--plan", plan_file]
    assert main([*args, "--scenario", str(toml), "--json"]) == 0
    runs = {s["name"]: s["result"] for s in json.loads(capsys.readouterr().out)["scenarios"]}
    assert runs["slow"]["iteration_time_s"] > runs["base"]["iteration_time_s"]
    assert runs["spread"]["simulation"]["faults"]["seed"] == 3
    assert main([*args, "--set", "faults.seed=x"]) == 2
    assert capsys.readouterr().err == \
        "trainsim: error: faults.seed: must be an integer >= 0, got 'x'\n"


def test_a_link_named_in_a_result_table_can_be_slowed():
    """The busiest-links table and --straggler link: / --fail-link use the same names."""
    from sim.network.links import link_name

    topo = build_topology(load_cluster("dgx-h100:2"))
    for lid in (0, len(topo.links) // 2, len(topo.links) - 1):
        name = link_name(topo, lid)
        assert lid in link_ids(topo, name, "--straggler")
        assert lid in link_ids(topo, name.replace("->", "-"), "--straggler")
