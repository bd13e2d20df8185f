"""What-if scenarios (``sim/spec/scenario.py``, ``--set``/``--scenario``): values parse as TOML,
edits go through the cluster's and the plan's own validation, derived defaults follow the
edit, and the CLI answers bad edits with one line naming the field, exit 2."""

from __future__ import annotations

import json

import pytest

from sim import Plan, load_cluster, load_model, simulate
from sim.errors import SpecError
from sim.spec.scenario import (
    Scenario,
    apply_cluster_edits,
    apply_plan_edits,
    edit_label,
    flatten_edits,
    load_scenarios,
    parse_assignment,
    parse_value,
    scenarios_from_args,
)
from trainsim.cli import main

PLAN = Plan(global_batch_size=32, seq_len=2048, dp=4, tp=4)  # 16 GPUs


# parsing ------------------------------------------------------------------------------------
@pytest.mark.parametrize("text, value", [
    ("800", 800), ("1.5", 1.5), ("1e3", 1000.0), ("true", True), ('"x"', "x"),
    ("h200-sxm-141gb", "h200-sxm-141gb"), ("rail-optimized", "rail-optimized"),
    ("[1, 2]", [1, 2]), (" full ", "full")])
def test_values_parse_as_toml_scalars_else_text(text, value):
    assert parse_value(text) == value
    assert type(parse_value(text)) is type(value)


def test_assignment_and_its_errors():
    assert parse_assignment("inter_node.nic_Gbps=800") == ("inter_node.nic_Gbps", 800)
    assert parse_assignment("tp = 2") == ("tp", 2)
    for bad in ("nic", "=3", "tp="):
        with pytest.raises(SpecError, match=r"^--set: must be KEY=VALUE"):
            parse_assignment(bad)
    with pytest.raises(SpecError, match=r"^inter_node\.nic_gbps: unknown scenario key"):
        parse_assignment("inter_node.nic_gbps=5")
    with pytest.raises(SpecError, match=r"^name: cannot be edited"):
        parse_assignment("name=x")


def test_flatten_nested_tables():
    assert flatten_edits({"gpu": "b200", "inter_node": {"nic_Gbps": 800, "topology": "x"}}) == [
        ("gpu", "b200"), ("inter_node.nic_Gbps", 800), ("inter_node.topology", "x")]
    assert edit_label([]) == "base"
    assert edit_label([("tp", 2), ("gpu", "b200")]) == "tp=2,gpu=b200"


# applying -----------------------------------------------------------------------------------
def test_cluster_edit_changes_only_that_field():
    base = load_cluster("dgx-h100:2")
    c = apply_cluster_edits(base, [("inter_node.nic_Gbps", 800)])
    assert c.inter_node.nic_Gbps == 800 and c.nic_GBps_per_gpu == 100.0
    assert c.to_dict() | {"name": "", "inter_node": {}} == base.to_dict() | {
        "name": "", "inter_node": {}}
    assert c.name == "dgx-h100:2[inter_node.nic_Gbps=800]"
    assert apply_cluster_edits(base, []) is base
    edited = apply_cluster_edits(base, [("profile", "db"), ("compute_stat", "p10")])
    assert (edited.profile, edited.compute_stat) == ("db", "p10")


def test_gpu_edit_carries_the_derived_nvlink_rate_but_not_an_explicit_one():
    a100 = load_cluster("dgx-a100:2")
    assert a100.intra_GBps == 300
    assert apply_cluster_edits(a100, [("gpu", "h100-sxm5-80gb")]).intra_GBps == 450
    explicit = apply_cluster_edits(a100, [("intra_node.bandwidth_GBps", 200)])
    assert apply_cluster_edits(explicit, [("gpu", "b200")]).intra_GBps == 200
    pcie = apply_cluster_edits(a100, [("intra_node.kind", "pcie")])
    assert pcie.intra_GBps == 32.0


@pytest.mark.parametrize("edit, message", [
    (("inter_node.nic_Gbps", -5), r"^inter_node\.nic_Gbps: must be a positive number, got -5"),
    (("nodes", 2.5), r"^nodes: must be a positive integer, got 2\.5"),
    (("gpu", "h300"), r"^gpu: unknown device 'h300'"),
    (("gpu", 3), r"^gpu: must be a catalog name, got 3"),
    (("inter_node.topology", "ring"), r"^inter_node\.topology: must be one of"),
    (("inter_node.oversubscription", 0.5), r"^inter_node\.oversubscription: must be a number >= 1"),
    (("inter_node.pod_gpus", 12), r"^inter_node\.pod_gpus: must be 0"),
    (("compute_stat", "mean"), r"^compute_stat: must be one of median, p10, got 'mean'"),
    (("compute_stat", "p10"), r"^compute_stat: p10 is a statistic of profiled times"),
])
def test_bad_cluster_edits_fail_like_a_cluster_file(edit, message):
    with pytest.raises(SpecError, match=message):
        apply_cluster_edits(load_cluster("dgx-h100:2"), [edit])


def test_plan_edits_are_validated_by_the_plan():
    assert apply_plan_edits(PLAN, [("tp", 8), ("dp", 2)]).tp == 8
    assert apply_plan_edits(PLAN, [("inter_node.nic_Gbps", 1)]) is PLAN  # not a plan key
    with pytest.raises(SpecError, match=r"^plan\.recompute: must be one of"):
        apply_plan_edits(PLAN, [("recompute", "most")])
    with pytest.raises(SpecError, match=r"^plan\.global_batch_size: must be a multiple"):
        apply_plan_edits(PLAN, [("dp", 3)])


def test_edited_cluster_simulates_faster_with_a_faster_nic():
    model, base = load_model("llama3-8b"), load_cluster("dgx-h100:2")
    slow = simulate(model, apply_cluster_edits(base, [("inter_node.nic_Gbps", 50)]), PLAN)
    fast = simulate(model, apply_cluster_edits(base, [("inter_node.nic_Gbps", 800)]), PLAN)
    assert fast.iteration_time_s < slow.iteration_time_s
    assert fast.breakdown["compute"] == pytest.approx(slow.breakdown["compute"])


# files --------------------------------------------------------------------------------------
def test_scenario_file_single_and_named(tmp_path):
    one = tmp_path / "fast.toml"
    one.write_text('gpu = "h200-sxm-141gb"\n[inter_node]\nnic_Gbps = 800\n')
    assert load_scenarios(one) == [Scenario("fast", (("gpu", "h200-sxm-141gb"),
                                                      ("inter_node.nic_Gbps", 800)))]
    many = tmp_path / "many.toml"
    many.write_text('gpu = "b200"\n[scenario.a]\nnodes = 4\n'
                    '[scenario.b]\ninter_node = { topology = "rail-optimized" }\n')
    got = load_scenarios(many)
    assert [s.name for s in got] == ["a", "b"]
    assert got[1].edits == (("gpu", "b200"), ("inter_node.topology", "rail-optimized"))
    both = scenarios_from_args(["nodes=8"], str(many))
    assert both[0].edits[-1] == ("nodes", 8) and both[0].cluster_edits == both[0].edits


@pytest.mark.parametrize("text, message", [
    ("[scenario.a]\nnic = 3\n", r"^bad\.toml:scenario\.a\.nic: unknown scenario key"),
    ('gpu = "h300"\n', r"^bad\.toml:gpu: unknown device"),
    ("[scenario.base]\nnodes = 2\n", r"^bad\.toml:scenario\.base: a scenario name"),
    ('[scenario."a/b"]\nnodes = 2\n', r"^bad\.toml:scenario\.'a/b': a scenario name"),
    ("scenario = 3\n", r"^bad\.toml:scenario: must be tables"),
    ("nodes = \n", r"^scenario\[bad\.toml\]: not valid TOML"),
])
def test_bad_scenario_files(tmp_path, text, message):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(SpecError, match=message):
        load_scenarios(path)


# the command line ---------------------------------------------------------------------------
@pytest.fixture
def plan_file(tmp_path):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(PLAN.to_dict()))
    return str(path)


def _sim(plan_file, *extra):
    return ["simulate", "--model", "llama3-8b", "--cluster", "dgx-h100:2", "--plan", plan_file,
            *extra]


def test_cli_set_changes_the_cluster(capsys, plan_file):
    assert main(_sim(plan_file, "--json")) == 0
    base = json.loads(capsys.readouterr().out)
    assert main(_sim(plan_file, "--json", "--set", "inter_node.nic_Gbps=50")) == 0
    slow = json.loads(capsys.readouterr().out)
    assert slow["cluster"] == "dgx-h100:2[inter_node.nic_Gbps=50]"
    assert slow["iteration_time_s"] > base["iteration_time_s"]


@pytest.mark.parametrize("edit, message", [
    ("inter_node.nic_Gbps=-1", "trainsim: error: inter_node.nic_Gbps: must be a positive"),
    ("gpu=h300", "trainsim: error: gpu: unknown device 'h300'"),
    ("nodes=4", "trainsim: error: plan.dp*tp*pp*cp: 4*4*1*1 = 16 != 32 GPUs"),
    ("warp=9", "trainsim: error: warp: unknown scenario key"),
])
def test_cli_bad_edit_is_one_line_exit_2(capsys, plan_file, edit, message):
    assert main(_sim(plan_file, "--set", edit)) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith(message) and err.count("\n") == 1


def test_cli_scenario_file_compares_with_the_base(capsys, tmp_path, plan_file):
    path = tmp_path / "whatif.toml"
    path.write_text("[scenario.slow]\ninter_node.nic_Gbps = 50\n"
                    "[scenario.big]\nnodes = 4\n")
    out_dir = tmp_path / "runs"
    assert main(_sim(plan_file, "--scenario", str(path), "--out", str(out_dir))) == 0
    table = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in table] == ["scenario", "base", "slow", "big"]
    assert "not run: plan.dp*tp*pp*cp" in table[3]
    saved = json.loads((out_dir / "scenarios.json").read_text())
    assert [s["name"] for s in saved["scenarios"]] == ["base", "slow", "big"]
    assert "error" in saved["scenarios"][2]
    assert (out_dir / "slow" / "result.json").is_file()
    assert not (out_dir / "big").exists()


def test_cli_optimize_refuses_plan_edits(capsys):
    rc = main(["optimize", "--model", "tiny", "--cluster", "cpu:2", "--global-batch-size", "8",
               "--seq-len", "256", "--set", "tp=2"])
    assert rc == 2
    assert capsys.readouterr().err.startswith("trainsim: error: tp: is a plan field")


def test_cli_optimize_on_an_edited_cluster(capsys):
    rc = main(["optimize", "--model", "tiny", "--cluster", "cpu:2", "--global-batch-size", "8",
               "--seq-len", "256", "--workers", "1", "--top", "2", "--json",
               "--set", "gpus_per_node=4"])
    assert rc == 0
    report = json.loads(capsys.readouterr().out)
    assert report["cluster"] == "cpu:2[gpus_per_node=4]"
    plan = report["best_plan"]
    assert plan["dp"] * plan["tp"] * plan["pp"] * plan["cp"] == 4
