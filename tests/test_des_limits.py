"""Progress and wall-clock limits on long DES runs (sim.des.watch, --max-wall-s,
--no-progress)."""

import json

import pytest
from helpers.cli import assert_bad_input, cli

from sim import Plan, load_cluster, load_model, simulate
from sim.des.watch import EVERY, WallLimit, Watch

GPT3 = ("--model", "gpt3-175b", "--cluster", "dgx-a100:128")


@pytest.fixture
def gpt3_plan(tmp_path):
    plan = Plan(global_batch_size=512, seq_len=2048, dp=8, tp=8, pp=16, recompute="full")
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan.to_dict()))
    return str(path)


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf"])
def test_max_wall_s_must_be_positive(capsys, tmp_path, gpt3_plan, value):
    out = tmp_path / "run"
    rc, stdout, err = cli(capsys, "simulate", *GPT3, "--plan", gpt3_plan, "--fidelity", "des",
                          "--max-wall-s", value, "--out", str(out))
    assert_bad_input(rc, stdout, err, "--max-wall-s", "positive number of seconds")
    assert not out.exists()


def test_max_wall_s_needs_the_des(capsys, gpt3_plan):
    rc, stdout, err = cli(capsys, "simulate", *GPT3, "--plan", gpt3_plan, "--max-wall-s", "5")
    assert_bad_input(rc, stdout, err, "--max-wall-s", "need --fidelity des")


def test_a_run_past_its_limit_stops_with_what_it_learned(capsys, tmp_path, gpt3_plan):
    out = tmp_path / "run"
    rc, stdout, err = cli(capsys, "simulate", *GPT3, "--plan", gpt3_plan, "--fidelity", "des",
                          "--no-reduce", "--max-wall-s", "0.3", "--no-progress", "--out",
                          str(out))
    assert rc == 4 and stdout == "" and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1 and err.startswith("trainsim: stopped after ")
    assert "the iteration takes at least" in err and "analytic tier estimates" in err
    assert not out.exists()


def test_watch_reports_progress_and_a_lower_bound():
    m, c = load_model("gpt3-175b"), load_cluster("dgx-a100:128")
    plan = Plan(global_batch_size=512, seq_len=2048, dp=8, tp=8, pp=16, recompute="full")
    seen = []
    r = simulate(m, c, plan, "des", watch=Watch(progress=lambda e, t: seen.append((e, t)),
                                                 show_after_s=0))
    assert len(seen) > 3 and all(e <= t for e, t in seen)
    assert [e for e, _ in seen] == sorted(e for e, _ in seen)
    assert seen[-1][0] <= r.simulation["events"]
    with pytest.raises(WallLimit) as stop:
        simulate(m, c, plan, "des", reduce=False, watch=Watch(max_wall_s=0.2))
    assert 0 < stop.value.learned["simulated_s"] < r.iteration_time_s


def test_progress_bar_on_stderr_and_no_progress(capsys, gpt3_plan, monkeypatch):
    monkeypatch.setenv("TRAINSIM_PROGRESS_AFTER_S", "0")
    rc, stdout, err = cli(capsys, "simulate", *GPT3, "--plan", gpt3_plan, "--fidelity", "des",
                          "--json")
    assert rc == 0 and json.loads(stdout)["iteration_time_s"] > 0
    assert "des:" in err and "event" in err
    rc, stdout, err = cli(capsys, "simulate", *GPT3, "--plan", gpt3_plan, "--fidelity", "des",
                          "--json", "--no-progress")
    assert rc == 0 and err == ""


def test_optimize_stops_its_local_moves_at_the_limit(capsys, tmp_path):
    rc, stdout, err = cli(capsys, "optimize", "--model", "llama3-8b", "--cluster",
                          "dgx-h100:1", "--global-batch-size", "32", "--seq-len", "4096",
                          "--top", "2", "--workers", "1", "--json", "--max-wall-s", "0.001")
    report = json.loads(stdout)
    assert rc == 0 and report["best_iteration_s"] > 0
    assert any("stopped by --max-wall-s" in m for m in report["moves"])
    rc, stdout, err = cli(capsys, "optimize", "--model", "llama3-8b", "--cluster",
                          "dgx-h100:1", "--global-batch-size", "32", "--seq-len", "4096",
                          "--max-wall-s", "0")
    assert_bad_input(rc, stdout, err, "--max-wall-s")


def test_progress_goes_on_across_a_fallback():
    """A reduced step that falls back (a detour across another node on a rail fabric)
    reports events counted from the first run on: never backwards."""
    import dataclasses

    from sim.spec.faults import faults_from_options

    c = load_cluster("dgx-h100:4")
    c = dataclasses.replace(c, inter_node=dataclasses.replace(c.inter_node,
                                                              topology="rail-optimized"))
    plan = Plan(global_batch_size=32, seq_len=1024, dp=4, tp=4, pp=2)
    seen = []
    r = simulate(load_model("llama3-8b"), c, plan, "des",
                 faults=faults_from_options(failures=["nic0.0@0"]),
                 watch=Watch(progress=lambda e, t: seen.append(e), show_after_s=0))
    assert "re-routed flow crosses" in r.simulation["not_reduced_because"]
    # reports every EVERY events of the run, counted on from the first run's: the first
    # lies beyond EVERY by the events the reduced run took before it fell back
    assert seen == sorted(seen) and seen[0] > EVERY
    assert seen[-1] > r.simulation["events"] - EVERY


def test_a_failure_after_the_step_changes_nothing():
    """The step ends with its units: a link failing at 10 s, long after, changes nothing
    and the clock stops at the step's end (a wall-clock stop never reports a lower bound
    past the iteration)."""
    from sim.cost.profiled import cost_model_for
    from sim.des.run import Step, _run
    from sim.layout.stages import pipeline_rank_layers
    from sim.network.failures import fault_inputs
    from sim.network.topology import build_topology
    from sim.spec.faults import faults_from_options

    m, c = load_model("tiny"), load_cluster("dgx-a100:2")
    plan = Plan(global_batch_size=16, seq_len=256, dp=16)
    healthy = simulate(m, c, plan, "des")
    late = simulate(m, c, plan, "des", faults=faults_from_options(failures=["nic0.0@10"]))
    assert late.iteration_time_s == healthy.iteration_time_s
    f = fault_inputs(faults_from_options(failures=["nic0.0@10"]), c, plan, "des", True)
    step = Step(m, c, plan, cost_model_for(c), build_topology(c), True, False)
    stages = pipeline_rank_layers(plan, m)
    procs = [step.x.env.process(step.unit(u, stages[u.stage])) for u in step.units]
    assert _run(step, procs, f.perturbation.link_failures) is None
    assert step.x.env.now == pytest.approx(healthy.iteration_time_s, rel=1e-9)


def test_bad_progress_after_variable_is_one_line(capsys, gpt3_plan, monkeypatch):
    monkeypatch.setenv("TRAINSIM_PROGRESS_AFTER_S", "abc")
    rc, stdout, err = cli(capsys, "simulate", *GPT3, "--plan", gpt3_plan, "--fidelity", "des")
    assert_bad_input(rc, stdout, err, "TRAINSIM_PROGRESS_AFTER_S", ">= 0")
