"""Progress and wall-clock limits on long DES runs (sim.des.watch, --max-wall-s,
--no-progress)."""

import json

import pytest
from helpers.cli import assert_bad_input, cli

from sim import Plan, load_cluster, load_model, simulate
from sim.des.watch import WallLimit, Watch

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
