"""The ``trainsim`` CLI on bad input: one line naming the field and the rule, exit code 2,
no traceback, and nothing already written is lost.

Runs ``trainsim.cli.main`` in-process (:func:`helpers.cli.cli`).
"""

from __future__ import annotations

import pytest
from helpers.cli import DELETE, GPT3, H100, NEW, assert_bad_input, cli, write_plan

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
    "missing-gbs": ({"global_batch_size": DELETE}, [], ["plan.global_batch_size",
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
    "ep-not-dividing-dp": ({"ep": 3}, [], ["plan.ep", "etp x ep = 8 x 3 must divide",
                                           "tp x cp x dp = 8 x 1 x 16 = 128"]),
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
