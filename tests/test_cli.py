"""The ``trainsim`` CLI: bad input gets one line naming the field and the rule, exit code 2,
no traceback, and nothing already written is lost; good input works; every ``--help`` is
complete.

The bulk runs ``trainsim.cli.main`` in-process (fast); a few cases run the real program in a
subprocess to check what a user actually sees.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import traceback
from pathlib import Path
from typing import Any

import pytest

from trainsim import __version__
from trainsim.cli import build_parser, main

# Megatron-LM SC'21 PTD-P plan for GPT-3 175B on 1024 A100s (128 DGX nodes).
GOOD_PLAN: dict[str, Any] = {
    "schema_version": 1, "global_batch_size": 1536, "seq_len": 2048, "dp": 16, "tp": 8,
    "pp": 8, "vpp": 4, "schedule": "interleaved-1f1b", "recompute": "full", "dtype": "fp16",
    "attention": "standard",
}
GPT3 = ["--model", "gpt3-175b", "--cluster", "dgx-a100:128"]
RESULT_KEYS = {"iteration_time_s", "tokens_per_s", "model_tflops_per_gpu",
               "hardware_tflops_per_gpu", "mfu", "peak_memory_gib", "fits_in_memory",
               "bubble_fraction", "breakdown"}
BREAKDOWN_KEYS = {"compute", "tp", "pp", "dp", "cp", "ep", "optimizer"}
H100 = 'nodes = 2\ngpus_per_node = 8\ngpu = "h100-sxm5-80gb"\n'


# helpers ----------------------------------------------------------------------------------
def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """Run ``trainsim ARGS`` in-process: (exit code, stdout, stderr).

    An uncaught exception becomes exit code 1 with its traceback on stderr, as it would
    for the real program, so the bad-input assertions below catch it.
    """
    try:
        rc = main(list(args))
    except SystemExit as exc:  # argparse: --help, --version, usage errors
        rc = exc.code if isinstance(exc.code, int) else 1
    except Exception:
        out, err = capsys.readouterr()
        return 1, out, err + traceback.format_exc()
    out, err = capsys.readouterr()
    return rc, out, err


def run_trainsim(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "trainsim", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=60)


def assert_bad_input(rc: int, out: str, err: str, *expected: str) -> None:
    """Exit 2, nothing on stdout, one ``trainsim: error:`` line naming field and rule."""
    assert "Traceback" not in out + err, err
    assert rc == 2, (rc, err)
    assert out == ""
    assert err.startswith("trainsim: error: "), err
    assert err.endswith("\n") and err.count("\n") == 1, err
    for text in expected:
        assert text in err, (text, err)


_DELETE = object()  # an override that removes the field


def write_plan(tmp_path: Path, name: str = "plan.json", **overrides: Any) -> Path:
    data = {**GOOD_PLAN, **overrides}
    for key, value in overrides.items():
        if value is _DELETE:
            del data[key]
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


# bad plans --------------------------------------------------------------------------------
# (overrides of GOOD_PLAN, extra `plan check` args, texts the error line must contain)
BAD_PLANS = {
    "dp-string": ({"dp": "16"}, [], ["plan.dp", "must be an integer >= 1", "'16'"]),
    "tp-bool": ({"tp": True}, [], ["plan.tp", "must be an integer >= 1", "True"]),
    "seq_len-float": ({"seq_len": 2048.0}, [], ["plan.seq_len", "must be an integer"]),
    "dp-negative": ({"dp": -16}, [], ["plan.dp", "must be an integer >= 1", "-16"]),
    "dp-null": ({"dp": None}, [], ["plan.dp", "must be an integer >= 1", "None"]),
    "micro_batch-zero": ({"micro_batch_size": 0}, [], ["plan.micro_batch_size", ">= 1"]),
    "zero_stage-4": ({"zero_stage": 4}, [], ["plan.zero_stage", "0, 1, 2 or 3"]),
    "unknown-field": ({"foo": 1}, [], ["plan.foo", "unknown field", "global_batch_size"]),
    "schema_version": ({"schema_version": 2}, [], ["plan.schema_version", "version 1", "2"]),
    "missing-gbs": ({"global_batch_size": _DELETE}, [], ["plan.global_batch_size",
                                                         "is required"]),
    "schedule-choice": ({"schedule": "zigzag"}, [], ["plan.schedule", "must be one of",
                                                     "'zigzag'"]),
    "dtype-choice": ({"dtype": "int4"}, [], ["plan.dtype", "must be one of"]),
    "sequence_parallel-string": ({"sequence_parallel": "yes"}, [],
                                 ["plan.sequence_parallel", "true or false"]),
    "sequence_parallel-tp1": ({"sequence_parallel": True, "tp": 1, "dp": 128}, [],
                              ["plan.sequence_parallel", "tp > 1"]),
    "placement": ({"placement": "tp-dp"}, [], ["plan.placement", "exactly once"]),
    "placement-table": ({"placement": [0, 1]}, [], ["plan.placement", "permutation"]),
    "collectives-string": ({"collectives": "ring"}, [], ["plan.collectives", "object"]),
    "collectives-algorithm": ({"collectives": {"tp": "warp"}}, [],
                              ["plan.collectives.tp", "not an algorithm", "'warp'"]),
    "gbs-not-multiple": ({"global_batch_size": 1000}, [],
                         ["plan.global_batch_size", "dp*micro_batch_size = 16*1 = 16"]),
    "ep-not-dividing-dp": ({"ep": 3}, [], ["plan.ep", "must divide dp", "16 % 3"]),
    "interleaved-without-vpp": ({"vpp": 1}, [], ["plan.vpp", "interleaved-1f1b", "vpp >= 2"]),
    "vpp-without-interleaved": ({"schedule": "1f1b"}, [], ["plan.vpp", "must be 1"]),
    "world-size": ({"dp": 8, "pp": 16, "vpp": 1, "schedule": "1f1b"},
                   ["--cluster", "dgx-a100:192"],
                   ["plan.dp*tp*pp*cp", "8*8*16*1 = 1024 != 1536", "dgx-a100:192"]),
    "tp-not-dividing-heads": ({"tp": 7, "dp": 1, "pp": 1, "vpp": 1, "schedule": "1f1b",
                               "global_batch_size": 8}, ["--model", "gpt3-175b"],
                              ["plan.tp", "model.num_heads", "96 % 7"]),
    "layers-not-divisible-by-pp": ({"pp": 7, "vpp": 1, "schedule": "1f1b"},
                                   ["--model", "gpt3-175b"],
                                   ["plan.pp", "7*1 = 7", "num_layers = 96"]),
    "ep-on-dense-model": ({"ep": 2}, ["--model", "gpt3-175b"],
                          ["plan.ep", "dense", "gpt3-175b"]),
    "seq_len-over-learned-positions": ({"seq_len": 4096}, ["--model", "gpt3-175b"],
                                       ["plan.seq_len", "2048"]),
    "layers_per_stage-sum": ({"layers_per_stage": [1] * 32}, ["--model", "gpt3-175b"],
                             ["plan.layers_per_stage", "!= model.num_layers = 96"]),
    "dtype-unsupported-on-device": ({"dtype": "fp8"}, ["--cluster", "dgx-a100:128"],
                                    ["plan.dtype", "fp8", "a100"]),
}


@pytest.mark.parametrize(("overrides", "extra", "expected"), BAD_PLANS.values(),
                         ids=BAD_PLANS.keys())
def test_plan_check_rejects_bad_plan(capsys, tmp_path, overrides, extra, expected):
    path = write_plan(tmp_path, **overrides)
    assert_bad_input(*cli(capsys, "plan", "check", str(path), *extra), *expected)


@pytest.mark.parametrize(("overrides", "extra", "expected"), [
    BAD_PLANS["dp-string"], BAD_PLANS["unknown-field"], BAD_PLANS["ep-on-dense-model"],
    BAD_PLANS["tp-not-dividing-heads"], BAD_PLANS["layers-not-divisible-by-pp"],
], ids=["dp-string", "unknown-field", "ep-on-dense", "tp-heads", "pp-layers"])
def test_simulate_rejects_bad_plan(capsys, tmp_path, overrides, extra, expected):
    path = write_plan(tmp_path, **overrides)
    assert_bad_input(*cli(capsys, "simulate", *GPT3, "--plan", str(path)), *expected)


def test_simulate_shows_world_size_arithmetic(capsys, tmp_path):
    path = write_plan(tmp_path, dp=8, pp=16, vpp=1, schedule="1f1b")
    rc, out, err = cli(capsys, "simulate", "--model", "gpt3-175b", "--cluster", "dgx-a100:192",
                       "--plan", str(path))
    assert_bad_input(rc, out, err, "plan.dp*tp*pp*cp: 8*8*16*1 = 1024 != 1536")


def test_simulate_rejects_layers_per_stage_not_a_list(capsys, tmp_path):
    path = write_plan(tmp_path, layers_per_stage=5)
    assert_bad_input(*cli(capsys, "simulate", *GPT3, "--plan", str(path)),
                     "plan.layers_per_stage")


def test_plan_check_names_collectives_when_null(capsys, tmp_path):
    path = write_plan(tmp_path, collectives=None)
    assert_bad_input(*cli(capsys, "plan", "check", str(path)), "plan.collectives")


def test_unknown_field_with_newline_stays_one_line(capsys, tmp_path):
    path = write_plan(tmp_path, **{"a\nb": 1})
    assert_bad_input(*cli(capsys, "plan", "check", str(path)), "unknown field")


# bad plan files ---------------------------------------------------------------------------
def test_missing_plan_file(capsys, tmp_path):
    missing = tmp_path / "missing.json"
    assert_bad_input(*cli(capsys, "simulate", *GPT3, "--plan", str(missing)),
                     "plan", "no such file", "missing.json")


@pytest.mark.parametrize(("text", "expected"), [
    ("{bad", ["plan[plan.json]", "not valid JSON"]),
    ("", ["plan[plan.json]", "not valid JSON"]),
    ("[1, 2]", ["plan", "must be a JSON object"]),
    ("null", ["plan", "must be a JSON object"]),
], ids=["truncated", "empty", "list", "null"])
def test_invalid_plan_json(capsys, tmp_path, text, expected):
    path = tmp_path / "plan.json"
    path.write_text(text)
    assert_bad_input(*cli(capsys, "plan", "check", str(path)), *expected)


def test_non_utf8_plan_file(capsys, tmp_path):
    path = tmp_path / "plan.json"
    path.write_bytes(b"\xff\xfe{")
    assert_bad_input(*cli(capsys, "plan", "check", str(path)), "plan")


# bad clusters -----------------------------------------------------------------------------
@pytest.mark.parametrize(("ref", "expected"), [
    ("dgx-h100", ["cluster", "positive count", "dgx-h100:16"]),
    ("dgx-h100:0", ["cluster", "positive count"]),
    ("dgx-h100:-1", ["cluster", "positive count"]),
    ("dgx-h100:x", ["cluster", "positive count"]),
    ("cpu:", ["cluster", "positive count", "cpu:2"]),
    ("foo:2", ["cluster", "unknown preset", "'foo:2'", "dgx-h100:NODES"]),
    pytest.param("dgx-h100:\u00b2", ["cluster", "positive count"], id="dgx-h100:superscript-2"),
])
def test_bad_cluster_preset(capsys, ref, expected):
    assert_bad_input(*cli(capsys, "cluster", "--cluster", ref), *expected)


BAD_CLUSTER_TOML = [
    pytest.param(H100.replace("nodes = 2", 'nodes = "2"'), ["nodes", "positive integer", "'2'"],
                 id="nodes-string"),
    pytest.param(H100.replace("gpus_per_node = 8", "gpus_per_node = 0"),
                 ["gpus_per_node", "positive integer"], id="gpus_per_node-zero"),
    pytest.param(H100 + "color = 1\n", ["color", "unknown field", "gpus_per_node"],
                 id="unknown-key"),
    pytest.param(H100 + "[inter_node]\nspeed = 1\n", ["inter_node.speed", "unknown field"],
                 id="unknown-inner-key"),
    pytest.param(H100 + '[inter_node]\ntopology = "mesh"\n',
                 ["inter_node.topology", "must be one of", "'mesh'"], id="bad-topology"),
    pytest.param(H100 + '[intra_node]\nkind = "wifi"\n', ["intra_node.kind", "must be one of"],
                 id="bad-intra-kind"),
    pytest.param(H100 + '[intra_node]\nbandwidth_GBps = "fast"\n',
                 ["intra_node.bandwidth_GBps", "positive number"], id="bandwidth-string"),
    pytest.param(H100 + "[inter_node]\nnics_per_node = 1.5\n",
                 ["inter_node.nics_per_node", "positive integer"], id="nics-float"),
    pytest.param(H100 + "[inter_node]\npod_gpus = 3\n", ["inter_node.pod_gpus", "multiple"],
                 id="pod_gpus"),
    pytest.param(H100 + "intra_node = 5\n", ["intra_node", "TOML table"], id="table-not-table"),
    pytest.param("nodes = = 2\n", ["cluster[c.toml]", "not valid TOML"], id="invalid-toml"),
    pytest.param("nodes = 2\ngpus_per_node = 8\n", ["gpu", "is required"], id="missing-gpu"),
    pytest.param(H100.replace("h100-sxm5-80gb", "z100"), ["gpu", "unknown device", "'z100'"],
                 id="unknown-gpu"),
    pytest.param(H100.replace('"h100-sxm5-80gb"', "5"), ["gpu", "catalog name"], id="gpu-int"),
    pytest.param(H100 + "profile = 3\n", ["profile", "path string"], id="profile-int"),
    pytest.param(H100 + 'compute_stat = "mean"\n', ["compute_stat", "median, p10", "'mean'"],
                 id="compute-stat"),
    pytest.param(H100 + "[inter_node]\noversubscription = true\n",
                 ["inter_node.oversubscription"], id="oversubscription-bool"),
    pytest.param(H100 + "[inter_node]\noversubscription = inf\n",
                 ["inter_node.oversubscription"], id="oversubscription-inf"),
]


@pytest.mark.parametrize(("toml", "expected"), BAD_CLUSTER_TOML)
def test_bad_cluster_toml(capsys, tmp_path, toml, expected):
    path = tmp_path / "c.toml"
    path.write_text(toml)
    assert_bad_input(*cli(capsys, "cluster", "--cluster", str(path)), *expected)


def test_bad_cluster_toml_through_simulate(capsys, tmp_path):
    path = tmp_path / "c.toml"
    path.write_text(H100 + '[inter_node]\ntopology = "mesh"\n')
    plan = write_plan(tmp_path)
    assert_bad_input(*cli(capsys, "simulate", "--model", "gpt3-175b", "--cluster", str(path),
                          "--plan", str(plan)), "inter_node.topology")


def test_missing_cluster_toml(capsys, tmp_path):
    missing = tmp_path / "none.toml"
    assert_bad_input(*cli(capsys, "cluster", "--cluster", str(missing)),
                     "cluster", "no such file")


def test_non_utf8_cluster_toml(capsys, tmp_path):
    path = tmp_path / "c.toml"
    path.write_bytes(b"\xff")
    assert_bad_input(*cli(capsys, "cluster", "--cluster", str(path)), "cluster")


# bad models -------------------------------------------------------------------------------
MODEL_TOML = ("num_layers = 2\nhidden_size = 64\nnum_heads = 4\nffn_hidden_size = 256\n"
              "vocab_size = 100\n")


@pytest.mark.parametrize(("name", "text", "expected"), [
    pytest.param("config.json", '{"model_type": "bert", "hidden_size": 8}',
                 ["config.json model_type", "unsupported 'bert'", "llama"], id="hf-model_type"),
    pytest.param("config.json", '{"hidden_size": 8}', ["config.json model_type", "required"],
                 id="hf-no-model_type"),
    pytest.param("config.json", '{"model_type": "llama"}',
                 ["config.json num_attention_heads", "is required"], id="hf-missing-size"),
    pytest.param("config.json", '{"model_type": "llama", "num_hidden_layers": "32"}',
                 ["config.json", "required"], id="hf-partial"),
    pytest.param("config.json", "[1]", ["config.json", "JSON object"], id="hf-list"),
    pytest.param("config.json", "{", ["config.json", "not valid JSON"], id="hf-invalid-json"),
    pytest.param("m.toml", MODEL_TOML + "color = 5\n", ["model[m.toml].color", "unknown field"],
                 id="toml-unknown-field"),
    pytest.param("m.toml", MODEL_TOML.replace("= 2\n", '= "2"\n', 1),
                 ["model.num_layers", "positive integer"], id="toml-layers-string"),
    pytest.param("m.toml", "x = = 1\n", ["model[", "not valid TOML"], id="toml-invalid"),
    pytest.param("m.toml", MODEL_TOML + 'norm = "batchnorm"\n', ["model.norm", "one of"],
                 id="toml-norm"),
    pytest.param("m.toml", MODEL_TOML + "mlp_only_layers = 5\n", ["model", "mlp_only_layers"],
                 id="toml-mlp_only_layers-int"),
    pytest.param("m.toml", MODEL_TOML + 'tied_embeddings = "no"\n', ["model.tied_embeddings"],
                 id="toml-bool-flag-string"),
    pytest.param("m.toml", MODEL_TOML + "name = 5\n", ["model.name"],
                 id="toml-name-int"),
])
def test_bad_model_file(capsys, tmp_path, name, text, expected):
    path = tmp_path / name
    path.write_text(text)
    assert_bad_input(*cli(capsys, "models", "--model", str(path)), *expected)


def test_hf_config_folder_with_unknown_model_type(capsys, tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "bert"}')
    assert_bad_input(*cli(capsys, "models", "--model", str(tmp_path)),
                     "config.json model_type", "'bert'")


def test_unknown_model_name(capsys, tmp_path):
    plan = write_plan(tmp_path)
    assert_bad_input(*cli(capsys, "simulate", "--model", "gpt5", "--cluster", "dgx-a100:128",
                          "--plan", str(plan)), "model", "unknown zoo preset 'gpt5'", "tiny")


# usage errors -----------------------------------------------------------------------------
USAGE_ERRORS = [
    ([], ["required: command", "trainsim --help"]),
    (["bogus"], ["invalid choice: 'bogus'"]),
    (["simulate", *GPT3, "--plan", "p.json", "--bogus"], ["unrecognized arguments: --bogus"]),
    (["simulate", *GPT3], ["required: --plan", "trainsim simulate --help"]),
    (["simulate", "--model", "tiny", "--plan", "p.json"], ["required: --cluster"]),
    (["simulate", *GPT3, "--plan", "p.json", "--fidelity", "exact"],
     ["--fidelity", "invalid choice: 'exact'"]),
    (["plan"], ["required: plan_cmd", "trainsim plan --help"]),
    (["plan", "check"], ["required: plan"]),
    (["plan", "new"], ["required: --global-batch-size, --seq-len"]),
    (["plan", "new", "--global-batch-size", "8", "--seq-len", "256", "--schedule", "zigzag"],
     ["--schedule", "invalid choice: 'zigzag'", "trainsim plan new --help"]),
    (["plan", "new", "--global-batch-size", "8", "--seq-len", "256", "--dtype", "int4"],
     ["--dtype", "invalid choice: 'int4'"]),
    (["plan", "new", "--global-batch-size", "8", "--seq-len", "256", "--recompute", "some"],
     ["--recompute", "invalid choice"]),
    (["plan", "new", "--global-batch-size", "8", "--seq-len", "256", "--attention", "sparse"],
     ["--attention", "invalid choice"]),
    (["plan", "new", "--global-batch-size", "8", "--seq-len", "256", "--dp", "x"],
     ["--dp", "invalid int value: 'x'"]),
    (["plan", "new", "--global-batch-size", "8", "--seq-len", "2.5"], ["--seq-len", "int"]),
    (["models", "--bogus"], ["unrecognized arguments: --bogus"]),
    (["hardware", "--sources", "x"], ["unrecognized arguments: x"]),
]


@pytest.mark.parametrize(("args", "expected"), USAGE_ERRORS,
                         ids=[" ".join(args) or "no-args" for args, _ in USAGE_ERRORS])
def test_usage_error(capsys, args, expected):
    assert_bad_input(*cli(capsys, *args), *expected)


# plan new: values argparse accepts but the plan rules reject ------------------------------
NEW = ["plan", "new", "--global-batch-size", "8", "--seq-len", "256"]


@pytest.mark.parametrize(("extra", "expected"), [
    (["--dp", "0"], ["plan.dp", ">= 1, got 0"]),
    (["--dp", "3"], ["plan.global_batch_size", "3*1 = 3"]),
    (["--sequence-parallel"], ["plan.sequence_parallel", "tp > 1"]),
    (["--placement", "foo"], ["plan.placement", "'foo'"]),
    (["--zero-stage", "5"], ["plan.zero_stage", "0, 1, 2 or 3"]),
    (["--dp", "2", "--model", "tiny", "--cluster", "cpu:3"],
     ["plan.dp*tp*pp*cp", "2*1*1*1 = 2 != 3"]),
    (["--tp", "3", "--model", "tiny"], ["plan.tp", "model.num_heads"]),
    (["--model", "nope"], ["model", "unknown zoo preset 'nope'"]),
    (["--cluster", "foo:2"], ["cluster", "unknown preset"]),
], ids=["dp0", "batch", "sp-tp1", "placement", "zero5", "world", "tp-heads", "model",
        "cluster"])
def test_plan_new_rejects(capsys, tmp_path, extra, expected):
    out_file = tmp_path / "p.json"
    assert_bad_input(*cli(capsys, *NEW, *extra, "--out", str(out_file)), *expected)
    assert not out_file.exists()
    assert list(tmp_path.iterdir()) == []  # no temporary file left behind either


def test_plan_new_keeps_existing_file_when_invalid(capsys, tmp_path):
    out_file = tmp_path / "p.json"
    out_file.write_text("precious\n")
    assert_bad_input(*cli(capsys, *NEW, "--dp", "0", "--out", str(out_file)), "plan.dp")
    assert out_file.read_text() == "precious\n"


# --out ------------------------------------------------------------------------------------
def test_simulate_out_under_regular_file(capsys, tmp_path):
    blocker = tmp_path / "afile"
    blocker.write_text("keep me\n")
    plan = write_plan(tmp_path)
    rc, out, err = cli(capsys, "simulate", *GPT3, "--plan", str(plan),
                       "--out", str(blocker / "run"))
    assert_bad_input(rc, out, err, "afile")
    assert blocker.read_text() == "keep me\n"


def test_plan_new_out_under_regular_file(capsys, tmp_path):
    blocker = tmp_path / "afile"
    blocker.write_text("keep me\n")
    assert_bad_input(*cli(capsys, *NEW, "--out", str(blocker / "p.json")), "afile")
    assert blocker.read_text() == "keep me\n"


def test_plan_new_out_is_directory_names_the_users_path(capsys, tmp_path):
    target = tmp_path / "adir"
    target.mkdir()
    rc, out, err = cli(capsys, *NEW, "--out", str(target))
    assert_bad_input(rc, out, err, str(target))
    assert ".adir." not in err
    assert list(target.iterdir()) == []


def test_simulate_out_keeps_previous_run_when_validation_fails(capsys, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    old = b'{"iteration_time_s": 1.0}\n'
    (run / "result.json").write_bytes(old)
    plan = write_plan(tmp_path, tp=7)
    rc, out, err = cli(capsys, "simulate", *GPT3, "--plan", str(plan), "--out", str(run))
    assert_bad_input(rc, out, err, "plan.tp")
    assert (run / "result.json").read_bytes() == old
    assert sorted(p.name for p in run.iterdir()) == ["result.json"]


def test_simulate_out_failure_midway_keeps_previous_run(capsys, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "inputs.json").write_text('{"old": 1}\n')
    (run / "result.json").mkdir()  # makes the second write fail
    plan = write_plan(tmp_path)
    rc, out, err = cli(capsys, "simulate", *GPT3, "--plan", str(plan), "--out", str(run))
    assert_bad_input(rc, out, err)
    assert (run / "inputs.json").read_text() == '{"old": 1}\n'


def test_demo_bad_out_prints_nothing(capsys, tmp_path):
    blocker = tmp_path / "afile"
    blocker.write_text("x")
    assert_bad_input(*cli(capsys, "demo", "--out", str(blocker / "demo")), "afile")


# good input -------------------------------------------------------------------------------
def test_simulate_json(capsys, tmp_path):
    plan = write_plan(tmp_path)
    rc, out, err = cli(capsys, "simulate", *GPT3, "--plan", str(plan), "--json")
    assert (rc, err) == (0, "")
    result = json.loads(out)  # exactly one JSON document
    assert isinstance(result, dict)
    assert set(result) >= RESULT_KEYS
    breakdown = result["breakdown"]
    assert set(breakdown) >= BREAKDOWN_KEYS
    assert all(isinstance(v, float) and v >= 0 for v in breakdown.values())
    total = sum(breakdown.values())
    assert total == pytest.approx(result["iteration_time_s"], rel=1e-9)
    assert result["iteration_time_s"] > 0 and 0 < result["mfu"] < 1
    assert result["fits_in_memory"] is True
    assert 0 < result["bubble_fraction"] < 1


def test_simulate_table(capsys, tmp_path):
    plan = write_plan(tmp_path)
    rc, out, err = cli(capsys, "simulate", *GPT3, "--plan", str(plan))
    assert (rc, err) == (0, "")
    assert "iteration time" in out
    assert "gpt3-175b on dgx-a100:128 (1024 devices)" in out
    assert "MFU" in out


def test_simulate_out_writes_run_folder(capsys, tmp_path):
    run = tmp_path / "runs" / "a"
    (tmp_path / "runs").mkdir()
    plan = write_plan(tmp_path)
    rc, out, err = cli(capsys, "simulate", *GPT3, "--plan", str(plan), "--json",
                       "--out", str(run))
    assert (rc, err) == (0, "")
    assert sorted(p.name for p in run.iterdir()) == ["inputs.json", "result.json",
                                                     "summary.txt"]
    inputs = json.loads((run / "inputs.json").read_text())
    assert set(inputs) == {"model", "cluster", "plan"}
    assert inputs["plan"]["dp"] == 16 and inputs["cluster"]["name"] == "dgx-a100:128"
    result = json.loads((run / "result.json").read_text())
    assert set(result) >= RESULT_KEYS and set(result["breakdown"]) >= BREAKDOWN_KEYS
    assert result == json.loads(out)
    assert "iteration time" in (run / "summary.txt").read_text()


def test_simulate_out_replaces_previous_run(capsys, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "result.json").write_text("stale")
    plan = write_plan(tmp_path)
    assert cli(capsys, "simulate", *GPT3, "--plan", str(plan), "--out", str(run))[0] == 0
    assert "iteration_time_s" in json.loads((run / "result.json").read_text())


def test_plan_new_then_check_round_trips(capsys, tmp_path):
    path = tmp_path / "f.json"
    rc, out, err = cli(capsys, "plan", "new", "--global-batch-size", "1536", "--seq-len",
                       "2048", "--dp", "16", "--tp", "8", "--pp", "8", "--vpp", "4",
                       "--schedule", "interleaved-1f1b", "--recompute", "full",
                       "--dtype", "fp16", "--model", "gpt3-175b", "--cluster", "dgx-a100:128",
                       "--out", str(path))
    assert (rc, err) == (0, "")
    written = json.loads(path.read_text())
    assert written == json.loads(out)
    assert written["schema_version"] == 1 and written["vpp"] == 4 and written["dtype"] == "fp16"
    rc, out, err = cli(capsys, "plan", "check", str(path), "--model", "gpt3-175b",
                       "--cluster", "dgx-a100:128")
    assert (rc, err) == (0, "")
    assert out == f"{path}: valid (1024 ranks, 96 micro-batches)\n"


def test_plan_new_defaults(capsys):
    rc, out, err = cli(capsys, *NEW)
    assert (rc, err) == (0, "")
    plan = json.loads(out)
    assert plan["dp"] == plan["tp"] == plan["pp"] == 1
    assert plan["schedule"] == "1f1b" and plan["sequence_parallel"] is False


def test_models_lists_zoo(capsys):
    rc, out, err = cli(capsys, "models")
    assert (rc, err) == (0, "")
    for name in ("gpt3-175b", "llama3-8b", "llama3-70b", "mixtral-8x7b", "tiny"):
        assert name in out


def test_models_one_as_json(capsys):
    rc, out, err = cli(capsys, "models", "--model", "llama3-8b", "--json")
    assert (rc, err) == (0, "")
    model = json.loads(out)
    assert model["name"] == "llama3-8b" and model["num_layers"] == 32


def test_hardware_sources(capsys):
    rc, plain, err = cli(capsys, "hardware")
    assert (rc, err) == (0, "")
    rc, out, err = cli(capsys, "hardware", "--sources")
    assert (rc, err) == (0, "")
    assert "a100-sxm4-80gb" in out and "h100-sxm5-80gb" in out
    assert len(out.splitlines()) > len(plain.splitlines())
    assert "bf16_tflops" in out


def test_cluster_json(capsys):
    rc, out, err = cli(capsys, "cluster", "--cluster", "dgx-h100:2", "--json")
    assert (rc, err) == (0, "")
    cluster = json.loads(out)
    assert cluster["name"] == "dgx-h100:2"
    assert (cluster["nodes"], cluster["gpus_per_node"]) == (2, 8)
    assert cluster["gpu"] == "h100-sxm5-80gb"


def test_cluster_toml_and_presets(capsys, tmp_path):
    path = tmp_path / "mine.toml"
    path.write_text(H100)
    rc, out, err = cli(capsys, "cluster", "--cluster", str(path))
    assert (rc, err) == (0, "")
    assert out.startswith("mine: 2 nodes x 8 h100-sxm5-80gb = 16 devices")
    rc, out, err = cli(capsys, "cluster")
    assert (rc, err) == (0, "")
    assert "dgx-h100:NODES" in out and "cpu:RANKS" in out


def test_version(capsys):
    rc, out, err = cli(capsys, "--version")
    assert (rc, out, err) == (0, f"trainsim {__version__}\n", "")


# --help -----------------------------------------------------------------------------------
# Every option each (sub)command must document; kept by hand so that dropping or hiding an
# option fails here, and checked against the parser so that a new one must be added.
HELP_OPTIONS: dict[tuple[str, ...], list[str]] = {
    (): ["--version", "simulate", "plan", "models", "hardware", "cluster", "topology", "plot",
         "demo", "optimize", "export", "profile", "sweep", "execute", "compare", "goodput",
         "cosim"],
    ("optimize",): ["--model", "--cluster", "--global-batch-size", "--seq-len", "--top",
                    "--workers", "--json", "--out", "--set", "--scenario"],
    ("export",): ["--plan", "--model", "--cluster", "--format", "--out"],
    ("simulate",): ["--model", "--cluster", "--plan", "--fidelity", "--profile",
                    "--compute-stat", "--trace",
                    "--no-reduce", "--json", "--out", "--set", "--scenario", "--straggler",
                    "--straggler-dist", "--seed", "--fail-link"],
    ("goodput",): ["--iteration-s", "--model", "--cluster", "--plan", "--fidelity", "--gpus",
                   "--mtbf-hours", "--mtbf-node-hours", "--iterations", "--checkpoint-every",
                   "--ckpt-write-s", "--restart-s", "--monte-carlo", "--seed", "--json"],
    ("topology",): ["--cluster", "--png", "--no-bisection"],
    ("plot",): ["timeline", "sweep", "sensitivity", "breakdown", "links"],
    ("plot", "links"): ["result", "--model", "--cluster", "--plan", "--set", "--out"],
    ("cosim",): ["--cluster", "--job", "--set", "--iterations", "--no-reduce", "--json",
                 "--all-links"],
    ("plot", "timeline"): ["trace", "--out"],
    ("plot", "breakdown"): ["results", "--share", "--out"],
    ("plot", "sweep"): ["results", "--x", "--y", "--hue", "--where", "--out"],
    ("plot", "sensitivity"): ["results", "--y", "--out"],
    ("sweep",): ["--model", "--cluster", "--grid", "--vary", "--set", "--plan",
                 "--global-batch-size", "--seq-len", "--fidelity", "--optimize", "--top",
                 "--workers", "--ray", "--out", "--json", "--no-progress"],
    ("plan",): ["new", "check"],
    ("plan", "new"): ["--global-batch-size", "--seq-len", "--micro-batch-size", "--dp", "--tp",
                      "--pp", "--cp", "--ep", "--vpp", "--zero-stage", "--schedule",
                      "--recompute", "--dtype", "--attention", "--placement",
                      "--sequence-parallel", "--model", "--cluster", "--out"],
    ("plan", "check"): ["plan", "--model", "--cluster"],
    ("models",): ["--model", "--json"],
    ("hardware",): ["--sources"],
    ("cluster",): ["--cluster", "--json"],
    ("demo",): ["--out"],
    ("profile",): ["compute", "comm", "show", "import-trace"],
    ("profile", "compute"): ["--model", "--device", "--threads", "--dtype", "--tp",
                             "--micro-batch", "--seq-len", "--db", "--force", "--passes",
                             "--busy"],
    ("profile", "comm"): ["--nproc", "--collectives", "--min-bytes", "--max-bytes", "--rounds",
                          "--no-insitu", "--timeout", "--db"],
    ("profile", "show"): ["--db"],
    ("profile", "import-trace"): ["trace", "--top", "--json"],
    ("execute",): ["--model", "--plan", "--nproc", "--steps", "--warmup", "--device",
                   "--threads", "--timeout", "--scale-layers", "--scale-hidden",
                   "--inject-fault", "--json"],
    ("compare",): ["--model", "--plan", "--nproc", "--steps", "--warmup", "--device",
                   "--threads", "--timeout", "--scale-layers", "--scale-hidden",
                   "--inject-fault", "--json", "--cluster", "--profile", "--compute-stat",
                   "--fidelity", "--calibrate"],
}


def _parsers() -> dict[tuple[str, ...], argparse.ArgumentParser]:
    found: dict[tuple[str, ...], argparse.ArgumentParser] = {}

    def walk(parser: argparse.ArgumentParser, path: tuple[str, ...]) -> None:
        found[path] = parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(sub, (*path, name))

    walk(build_parser(), ())
    return found


def _documented(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    out: dict[str, argparse.Action] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            out.update({name: action for name in action.choices})
        elif isinstance(action, argparse._HelpAction):
            continue
        elif action.option_strings:
            out[max(action.option_strings, key=len)] = action
        else:
            out[action.dest] = action
    return out


def test_help_table_matches_parser():
    parsers = _parsers()
    assert set(parsers) == set(HELP_OPTIONS)
    for path, parser in parsers.items():
        assert set(_documented(parser)) == set(HELP_OPTIONS[path]), path


@pytest.mark.parametrize("path", HELP_OPTIONS, ids=lambda p: " ".join(p) or "trainsim")
def test_help_mentions_every_option(capsys, path):
    rc, out, err = cli(capsys, *path, "--help")
    assert (rc, err) == (0, "")
    assert out.startswith(f"usage: trainsim {' '.join(path)}".rstrip())
    for option in ["--help", *HELP_OPTIONS[path]]:
        assert option in out, (path, option)


def test_every_option_has_help_text():
    missing = []
    for path, parser in _parsers().items():
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                items = [(choice.dest, choice.help) for choice in action._choices_actions]
            else:
                items = [(max(action.option_strings, key=len, default=action.dest), action.help)]
            missing += [(" ".join(path), name) for name, text in items if not text]
    assert missing == []


# the real program -------------------------------------------------------------------------
def test_subprocess_version_and_help(tmp_path):
    proc = run_trainsim("--version", cwd=tmp_path)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, f"trainsim {__version__}\n", "")
    proc = run_trainsim("plan", "new", "--help", cwd=tmp_path)
    assert proc.returncode == 0 and "--global-batch-size" in proc.stdout


def test_subprocess_simulate_json(tmp_path):
    plan = write_plan(tmp_path)
    proc = run_trainsim("simulate", *GPT3, "--plan", str(plan), "--json", cwd=tmp_path)
    assert (proc.returncode, proc.stderr) == (0, "")
    result = json.loads(proc.stdout)
    assert set(result) >= RESULT_KEYS
    assert sum(result["breakdown"].values()) == pytest.approx(result["iteration_time_s"],
                                                              rel=1e-9)


@pytest.mark.parametrize(("args", "expected"), [
    (["simulate", "--model", "gpt3-175b", "--cluster", "dgx-a100:192", "--plan", "ws.json"],
     "8*8*16*1 = 1024 != 1536"),
    (["simulate", *GPT3, "--plan", "missing.json"], "no such file"),
    (["cluster", "--cluster", "dgx-h100:x"], "positive count"),
    (["plan", "new", "--global-batch-size", "8", "--seq-len", "256", "--dtype", "int4"],
     "invalid choice"),
], ids=["world-size", "missing-plan", "preset", "argparse"])
def test_subprocess_bad_input(tmp_path, args, expected):
    write_plan(tmp_path, "ws.json", dp=8, pp=16, vpp=1, schedule="1f1b")
    proc = run_trainsim(*args, cwd=tmp_path)
    assert_bad_input(proc.returncode, proc.stdout, proc.stderr, expected)


def test_subprocess_no_traceback_on_bad_layers_per_stage(tmp_path):
    plan = write_plan(tmp_path, layers_per_stage=5)
    proc = run_trainsim("simulate", *GPT3, "--plan", str(plan), cwd=tmp_path)
    assert_bad_input(proc.returncode, proc.stdout, proc.stderr, "plan.layers_per_stage")


def test_models_json_is_one_document(capsys):
    rc, out, _ = cli(capsys, "models", "--json")
    names = {m["name"] for m in json.loads(out)}
    assert rc == 0 and {"tiny", "llama3-405b", "mixtral-8x7b"} <= names


def test_closed_pipe_is_not_an_error(tmp_path):
    proc = subprocess.run(f"{sys.executable} -m trainsim hardware --sources | head -1",
                          shell=True, cwd=tmp_path, capture_output=True, text=True,
                          executable="/bin/bash")
    assert proc.stdout.startswith("a100") and proc.stderr == ""
