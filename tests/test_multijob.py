"""Jobs sharing one cluster's network (``sim.des.multijob``, ``trainsim cosim``) and the link
heat map (``trainsim plot links``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.cli import cli

from sim import Plan, SpecError, load_cluster, load_model, simulate
from sim.cost.profiled import cost_model_for
from sim.des.multijob import Job, cosimulate, job_cluster, job_devices, run_jobs
from sim.des.run import simulate_des
from sim.spec.scenario import apply_cluster_edits

LLAMA = load_model("llama3-8b")
TP8 = Plan.from_dict({"global_batch_size": 8, "seq_len": 2048, "tp": 8})  # one node
DP2 = Plan.from_dict({"global_batch_size": 16, "seq_len": 2048, "dp": 2, "tp": 8})  # two
DP2_SMALL = Plan.from_dict({"global_batch_size": 2, "seq_len": 1024, "dp": 2, "tp": 8})


def _cluster(nodes: int, oversubscription: float = 1.0, pod_nodes: int = 0) -> object:
    return apply_cluster_edits(load_cluster(f"dgx-h100:{nodes}"), [
        ("inter_node.oversubscription", oversubscription),
        ("inter_node.pod_gpus", 8 * pod_nodes)])


NON_BLOCKING = _cluster(4)
SPINE_4TO1 = _cluster(4, 4.0, pod_nodes=2)  # pods {0, 1} and {2, 3}, 1:4 to the core


def test_job_devices_are_its_nodes_devices_in_order():
    assert job_devices(NON_BLOCKING, (2, 0)) == [*range(16, 24), *range(0, 8)]


def test_intra_node_jobs_on_a_non_blocking_fat_tree_do_not_slow_down():
    r = cosimulate(NON_BLOCKING, [Job("a", LLAMA, TP8, (0,)), Job("b", LLAMA, TP8, (3,))])
    assert [round(j.slowdown_pct, 9) for j in r.jobs] == [0.0, 0.0]
    assert all(len(j.iterations_s) >= 3 for j in r.jobs)


def test_data_parallel_jobs_on_a_non_blocking_fat_tree_do_not_slow_down():
    r = cosimulate(NON_BLOCKING, [Job("a", LLAMA, DP2, (0, 2)), Job("b", LLAMA, DP2, (1, 3))])
    assert [round(j.slowdown_pct, 9) for j in r.jobs] == [0.0, 0.0]


def test_data_parallel_jobs_across_an_oversubscribed_spine_both_slow_down():
    jobs = [Job("a", LLAMA, DP2, (0, 2)), Job("b", LLAMA, DP2, (1, 3))]
    r = cosimulate(SPINE_4TO1, jobs)
    assert all(j.slowdown_pct > 5 for j in r.jobs), [j.slowdown_pct for j in r.jobs]
    assert r.jobs[0].together_s == pytest.approx(r.jobs[1].together_s)  # symmetric
    assert r.links[0]["link"] in {"core->pod0", "core->pod1", "pod0->core", "pod1->core"}
    # the same jobs each inside one pod never cross the core: no slowdown
    apart = cosimulate(SPINE_4TO1, [Job("a", LLAMA, DP2, (0, 1)), Job("b", LLAMA, DP2, (2, 3))])
    assert [round(j.slowdown_pct, 9) for j in apart.jobs] == [0.0, 0.0]


def test_reduced_and_full_agree_when_jobs_share_links():
    jobs = [Job("a", LLAMA, DP2, (0, 2)), Job("b", LLAMA, DP2_SMALL, (1, 3))]
    reduced = cosimulate(SPINE_4TO1, jobs, 2)
    full = cosimulate(SPINE_4TO1, jobs, 2, reduce=False)
    for r, f in zip(reduced.jobs, full.jobs, strict=True):
        assert r.iterations_s == pytest.approx(f.iterations_s, rel=1e-9)
        assert r.alone_s == pytest.approx(f.alone_s, rel=1e-9)


def test_jobs_at_different_rates_run_until_each_has_k_iterations():
    jobs = [Job("big", LLAMA, DP2, (0, 2)), Job("small", LLAMA, DP2_SMALL, (1, 3))]
    r = cosimulate(SPINE_4TO1, jobs, 2)
    big, small = r.jobs
    assert len(big.iterations_s) == 2 and len(small.iterations_s) > 2
    assert r.window_s == pytest.approx(sum(big.iterations_s))  # the slow job ends it
    assert sum(small.iterations_s) <= r.window_s
    assert big.slowdown_pct > 0 and small.slowdown_pct > 0


@pytest.mark.parametrize("plan", [DP2, Plan.from_dict({
    "global_batch_size": 16, "seq_len": 2048, "tp": 8, "pp": 2, "schedule": "1f1b"})])
def test_one_job_alone_equals_simulate_des_exactly(plan):
    cluster = _cluster(2, 4.0, pod_nodes=1)
    alone = run_jobs(cluster, [Job("a", LLAMA, plan, (0, 1))]).iterations_s[0]
    assert alone == [simulate_des(LLAMA, cluster, plan, cost_model_for(cluster)).iteration_s]


def test_a_job_on_other_nodes_of_a_symmetric_cluster_takes_the_same_time():
    whole = simulate_des(LLAMA, _cluster(2), DP2, cost_model_for(_cluster(2))).iteration_s
    alone = run_jobs(NON_BLOCKING, [Job("a", LLAMA, DP2, (3, 1))]).iterations_s[0][0]
    assert alone == pytest.approx(whole, rel=1e-12)


def test_jobs_on_the_gpu_types_of_a_mixed_cluster():
    mixed = load_cluster("dgx-a100:2+dgx-h100:2")
    on_a100, on_h100, across = (Job("a", LLAMA, DP2, (0, 1)), Job("h", LLAMA, DP2, (2, 3)),
                                Job("x", LLAMA, DP2, (1, 2)))
    for job in (on_a100, on_h100, across):  # the slice alone: its own GPUs, NICs, fabric
        got = run_jobs(mixed, [job]).iterations_s[0][0]
        want = simulate(LLAMA, job_cluster(mixed, job), DP2, "des").iteration_time_s
        assert got == pytest.approx(want, rel=1e-12), job.name
    r = cosimulate(mixed, [on_a100, on_h100], 2)
    assert r.jobs[0].alone_s > 1.5 * r.jobs[1].alone_s  # A100s are slower


@pytest.mark.parametrize("jobs, field", [
    ([], "jobs"),
    ([Job("a", LLAMA, TP8, (0,)), Job("b", LLAMA, TP8, (0,))], "job[1].nodes"),
    ([Job("a", LLAMA, TP8, (4,))], "job[0].nodes"),
    ([Job("a", LLAMA, TP8, (0,)), Job("a", LLAMA, TP8, (1,))], "job[1].name"),
    ([Job("a", LLAMA, DP2, (0,))], "job[0].plan.dp*tp*pp*cp"),
])
def test_bad_jobs_name_the_field(jobs, field):
    with pytest.raises(SpecError) as exc:
        cosimulate(NON_BLOCKING, jobs)
    assert exc.value.field == field


# CLI ----------------------------------------------------------------------------------------


@pytest.fixture
def plans(tmp_path: Path) -> Path:
    (tmp_path / "dp2.json").write_text(json.dumps(DP2.to_dict()))
    (tmp_path / "dp4.json").write_text(json.dumps({**DP2.to_dict(), "dp": 4}))
    return tmp_path


def test_cosim_cli_json(capsys, plans):
    rc, out, err = cli(capsys, "cosim", "--cluster", "dgx-h100:4", "--set",
                        "inter_node.pod_gpus=16", "--set", "inter_node.oversubscription=4",
                        "--job", f"model=llama3-8b,plan={plans / 'dp2.json'},nodes=0+2,name=a",
                        "--job", f"model=llama3-8b,plan={plans / 'dp2.json'},nodes=1+3",
                        "--iterations", "2", "--json")
    assert (rc, err) == (0, "")
    data = json.loads(out)
    assert [j["name"] for j in data["jobs"]] == ["a", "job1"]
    assert all(j["slowdown_pct"] > 5 and j["iterations"] >= 2 for j in data["jobs"])


@pytest.mark.parametrize("job, expected", [
    ("model=llama3-8b,plan=dp2.json", "--job[0].nodes: is required"),
    ("model=llama3-8b,plan=dp2.json,nodes=3-1", "--job[0].nodes: range '3-1'"),
    ("model=llama3-8b,plan=dp2.json,nodes=a", "--job[0].nodes: must be node numbers"),
    ("model=llama3-8b,plan=dp2.json,nodes=\u00b3", "--job[0].nodes: must be node numbers"),
    ("model=llama3-8b,plan=dp2.json,nodes=0-1,gpu=x", "--job[0].gpu: unknown field"),
    ("model=llama3-8b,plan", "--job[0]: expected KEY=VALUE"),
    ("model=nope,plan=dp2.json,nodes=0-1", "--job[0].model"),
    ("model=llama3-8b,plan=missing.json,nodes=0-1", "--job[0]"),
    ("model=llama3-8b,plan=dp4.json,nodes=0-1", "job[0].plan.dp*tp*pp*cp"),
    ("model=llama3-8b,plan=dp2.json,nodes=0-1+1", "--job[0].nodes: names a node twice"),
])
def test_cosim_cli_bad_input_is_one_line_exit_2(capsys, plans, monkeypatch, job, expected):
    monkeypatch.chdir(plans)
    rc, out, err = cli(capsys, "cosim", "--cluster", "dgx-h100:4", "--job", job)
    assert "Traceback" not in err, err
    assert (rc, out) == (2, "") and err.count("\n") == 1, err
    assert err.startswith("trainsim: error: ") and expected in err, err


def test_cosim_cli_overlapping_nodes_and_bad_set(capsys, plans, monkeypatch):
    monkeypatch.chdir(plans)
    job = "model=llama3-8b,plan=dp2.json,nodes=0-1"
    rc, _, err = cli(capsys, "cosim", "--cluster", "dgx-h100:4", "--job", job, "--job", job)
    assert rc == 2 and "job[1].nodes: node 0 is already used by job 'job0'" in err
    rc, _, err = cli(capsys, "cosim", "--cluster", "dgx-h100:4", "--job", job,
                      "--set", "tp=2")
    assert rc == 2 and err.startswith("trainsim: error: tp: is not a cluster field"), err
    rc, _, err = cli(capsys, "cosim", "--cluster", "dgx-h100:4", "--job", job,
                      "--iterations", "0")
    assert rc == 2 and "iterations: must be an integer >= 1" in err, err


# plot links ---------------------------------------------------------------------------------
def test_plot_links_from_a_des_run_and_from_a_saved_result(capsys, plans, tmp_path):
    rc, out, err = cli(capsys, "plot", "links", "--model", "llama3-8b", "--cluster",
                        "dgx-h100:2", "--plan", str(plans / "dp2.json"), "--set",
                        "inter_node.oversubscription=2", "--set", "inter_node.pod_gpus=8",
                        "--out", str(tmp_path / "l.png"), "--out", str(tmp_path / "l.svg"))
    assert (rc, err) == (0, "")
    assert (tmp_path / "l.png").read_bytes()[:4] == b"\x89PNG"
    assert "<svg" in (tmp_path / "l.svg").read_text()
    rc, out, err = cli(capsys, "simulate", "--model", "llama3-8b", "--cluster", "dgx-h100:2",
                        "--plan", str(plans / "dp2.json"), "--fidelity", "des", "--json")
    (tmp_path / "r.json").write_text(out)
    rc, out, err = cli(capsys, "plot", "links", str(tmp_path / "r.json"), "--cluster",
                        "dgx-h100:2", "--out", str(tmp_path / "r.png"))
    assert (rc, err) == (0, "") and (tmp_path / "r.png").exists()


def test_plot_links_of_a_shared_fabric_window(capsys, plans, tmp_path):
    edits = ["--set", "inter_node.pod_gpus=16", "--set", "inter_node.oversubscription=4"]
    rc, out, err = cli(capsys, "cosim", "--cluster", "dgx-h100:4", *edits, "--job",
                        f"model=llama3-8b,plan={plans / 'dp2.json'},nodes=0+2", "--job",
                        f"model=llama3-8b,plan={plans / 'dp2.json'},nodes=1+3",
                        "--iterations", "1", "--json", "--all-links")
    assert (rc, err) == (0, "") and len(json.loads(out)["links"]) > 10
    (tmp_path / "co.json").write_text(out)
    rc, out, err = cli(capsys, "plot", "links", str(tmp_path / "co.json"), "--cluster",
                        "dgx-h100:4", *edits, "--out", str(tmp_path / "co.svg"))
    assert (rc, err) == (0, "") and "<svg" in (tmp_path / "co.svg").read_text()


@pytest.mark.parametrize("args, expected", [
    (["--cluster", "dgx-h100:2"], "--model: is required"),
    (["--model", "tiny", "--cluster", "dgx-h100:2", "--plan", "x.json", "--out", "a.pdf"],
     "--out: must end in .png or .svg"),
    (["RESULT"], "--cluster: is required with a saved RESULT"),
    (["RESULT", "--cluster", "dgx-h100:2"], "is not a link of cluster 'dgx-h100:2'"),
    (["BADJSON", "--cluster", "dgx-h100:2"], "result: "),
])
def test_plot_links_bad_input(capsys, tmp_path, monkeypatch, args, expected):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "r.json").write_text(json.dumps({"links": [  # a link of 3 nodes or more
        {"link": "gpu16->sw2", "utilization": 0.5}]}))
    (tmp_path / "bad.json").write_text("[1, 2]")
    args = [str(tmp_path / "r.json") if a == "RESULT" else
            str(tmp_path / "bad.json") if a == "BADJSON" else a for a in args]
    rc, out, err = cli(capsys, "plot", "links", *args)
    assert "Traceback" not in err, err
    assert (rc, out) == (2, "") and err.count("\n") == 1 and expected in err, err


@pytest.mark.parametrize("util", ["x", None, -0.5, "NaN"])
def test_plot_links_bad_utilization_is_one_line(capsys, tmp_path, util):
    (tmp_path / "r.json").write_text(json.dumps({"links": [
        {"link": "gpu0->sw0", "utilization": float(util) if util == "NaN" else util}]}))
    rc, out, err = cli(capsys, "plot", "links", str(tmp_path / "r.json"), "--cluster",
                        "dgx-h100:2", "--out", str(tmp_path / "r.png"))
    assert "Traceback" not in err, err
    assert (rc, out) == (2, "") and err.count("\n") == 1, err
    assert "links: 'gpu0->sw0': utilization must be a number >= 0" in err, err
