"""Absurd sizes are one-line errors (exit 2, nothing written), not hangs or memory kills;
a sequence longer than a RoPE model's positions is a warning. Through the CLI, in-process.

Each case used to hang, be killed for memory or pass silently; each now stops at the spec
(no timed asserts: a hang would show as a test that never ends).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from helpers.cli import GOOD_PLAN, GPT3, assert_bad_input, cli, write_plan

from sim.spec import limits

SMALL = {"global_batch_size": 8, "seq_len": 2048, "dp": 8, "tp": 1, "pp": 1, "vpp": 1,
         "schedule": "1f1b", "recompute": "none", "attention": "flash"}
LLAMA_CFG = {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
             "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
             "vocab_size": 128256, "max_position_embeddings": 8192}


def simulate_into(capsys: pytest.CaptureFixture[str], tmp_path: Path, *args: str
                  ) -> tuple[int, str, str]:
    """``trainsim simulate ARGS --out RUN``; a refused run must leave RUN unwritten."""
    run = tmp_path / "run"
    result = cli(capsys, "simulate", *args, "--out", str(run))
    if result[0] == 2:
        assert not run.exists()
    return result


def hf_model(tmp_path: Path, **changes: object) -> str:
    folder = tmp_path / "hf"
    folder.mkdir(exist_ok=True)
    text = json.dumps({**LLAMA_CFG, **changes})
    (folder / "config.json").write_text(text.replace('"HUGE"', "1" + "0" * 30))
    return str(folder)


@pytest.mark.parametrize("cluster, expected", [
    ("dgx-h100:1000000000", ["cluster", "at most 1,048,576", "1000000000"]),
    ("dgx-h100:131073", ["nodes*gpus_per_node", "131,073*8 = 1,048,584", "1,048,576 devices"]),
    ("cpu:" + "9" * 5000, ["cluster", "at most 1,048,576", "(5,000 digits)"]),
    ("dgx-a100:1+dgx-h100:200000", ["nodes*gpus_per_node", "200,000*8"]),
])
def test_cluster_size(capsys, tmp_path, cluster, expected):
    plan = write_plan(tmp_path, **SMALL)
    rc, out, err = simulate_into(capsys, tmp_path, "--model", "llama3-8b", "--cluster",
                                 cluster, "--plan", str(plan))
    assert_bad_input(rc, out, err, *expected)


def test_cluster_file_nics(capsys, tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('nodes = 2\ngpus_per_node = 8\ngpu = "h100-sxm5-80gb"\n'
                    "[inter_node]\nnics_per_node = 100000000\n")
    rc, out, err = cli(capsys, "cluster", "--cluster", str(path))
    assert_bad_input(rc, out, err, "inter_node.nics_per_node", "at most 128 NICs")
    path.write_text('nodes = 131073\ngpus_per_node = 1\ngpu = "h100-sxm5-80gb"\n')
    rc, out, err = cli(capsys, "cluster", "--cluster", str(path))  # 8 NICs a node (default)
    assert_bad_input(rc, out, err, "nodes*inter_node.nics_per_node", "1,048,576 NICs",
                     "got 1,048,584")


@pytest.mark.parametrize("changes, expected", [
    ({"num_hidden_layers": 1e30}, ["config.json num_hidden_layers", "must be an integer"]),
    ({"num_hidden_layers": "HUGE"}, ["config.json num_hidden_layers", "at most 10,000 layers"]),
    ({"hidden_size": 2**21}, ["config.json hidden_size", "at most 1,048,576"]),
    ({"vocab_size": 2**25}, ["config.json vocab_size", "at most 16,777,216 tokens"]),
    ({"max_position_embeddings": 2**30}, ["config.json max_position_embeddings"]),
])
def test_hf_model_sizes(capsys, tmp_path, changes, expected):
    plan = write_plan(tmp_path, **SMALL)
    rc, out, err = simulate_into(capsys, tmp_path, "--model", hf_model(tmp_path, **changes),
                                 "--cluster", "dgx-h100:1", "--plan", str(plan))
    assert_bad_input(rc, out, err, *expected)


@pytest.mark.parametrize("line, expected", [
    ("num_layers = 1e30", ["model.num_layers", "positive integer", "1e+30"]),
    ("num_layers = 100000000000", ["model.num_layers", "at most 10,000 layers"]),
    ("num_layers = 2\nffn_hidden_size = 4611686018427387904",
     ["model.ffn_hidden_size", "at most 1,048,576"]),
])
def test_toml_model_sizes(capsys, tmp_path, line, expected):
    path = tmp_path / "m.toml"
    path.write_text(f"{line}\nhidden_size = 64\nnum_heads = 4\nvocab_size = 1000\n"
                    + ("" if "ffn" in line else "ffn_hidden_size = 256\n"))
    rc, out, err = cli(capsys, "models", "--model", str(path))
    assert_bad_input(rc, out, err, *expected)


@pytest.mark.parametrize("changes, expected", [
    ({"global_batch_size": 400_000_000_000_000_000_000, "dp": 16},
     ["plan.global_batch_size", "at most 2,147,483,648 sequences"]),
    ({"seq_len": 2**25}, ["plan.seq_len", "at most 16,777,216 tokens"]),
    ({"dp": 2**21}, ["plan.dp", "at most 1,048,576 ranks"]),
    ({"dp": 2**10, "tp": 2**10, "pp": 2}, ["plan.dp*tp*pp*cp", "1024*1024*2*1 = 2,097,152"]),
    ({"vpp": 10**6}, ["plan.vpp", "at most 10,000"]),
])
def test_plan_sizes(capsys, tmp_path, changes, expected):
    plan = write_plan(tmp_path, **{**GOOD_PLAN, **changes})
    rc, out, err = simulate_into(capsys, tmp_path, *GPT3, "--plan", str(plan))
    assert_bad_input(rc, out, err, *expected)


def test_plan_new_refuses_a_huge_batch(capsys, tmp_path):
    rc, out, err = cli(capsys, "plan", "new", "--global-batch-size", "4" + "0" * 20,
                       "--seq-len", "2048", "--out", str(tmp_path / "p.json"))
    assert_bad_input(rc, out, err, "plan.global_batch_size", "at most")
    assert not (tmp_path / "p.json").exists()


def test_des_refuses_what_it_cannot_run(capsys, tmp_path):
    """The DES runs every micro-batch: 2^31 of them would never end; analytic is instant."""
    plan = write_plan(tmp_path, **{**SMALL, "global_batch_size": 2**31, "dp": 8})
    rc, out, err = simulate_into(capsys, tmp_path, "--model", "llama3-8b", "--cluster",
                                 "dgx-h100:1", "--plan", str(plan), "--fidelity", "des")
    assert_bad_input(rc, out, err, "plan.global_batch_size", "268,435,456 micro-batches",
                     "at most 65,536")
    rc, out, err = cli(capsys, "simulate", "--model", "llama3-8b", "--cluster", "dgx-h100:1",
                       "--plan", str(plan))
    assert rc == 0, err


def test_long_sequence_on_rope_model_warns(capsys, tmp_path):
    """Rotary positions run at any length: a warning, not an error (learned positions
    refuse: test_cli_errors)."""
    plan = write_plan(tmp_path, **{**SMALL, "seq_len": 2**20})
    rc, out, err = cli(capsys, "simulate", "--model", hf_model(tmp_path), "--cluster",
                       "dgx-h100:1", "--plan", str(plan))
    assert rc == 0, err
    assert "warning: seq_len 1,048,576 exceeds the model's max_seq_len 8,192" in out
    plan = write_plan(tmp_path, **SMALL)
    rc, out, err = cli(capsys, "simulate", "--model", hf_model(tmp_path), "--cluster",
                       "dgx-h100:1", "--plan", str(plan))
    assert rc == 0 and "max_seq_len" not in out


def test_sliding_window_is_a_warning(capsys, tmp_path):
    model = hf_model(tmp_path, model_type="mistral", sliding_window=1024)
    for seq, warned in ((1024, False), (2048, True)):
        plan = write_plan(tmp_path, **{**SMALL, "seq_len": seq})
        rc, out, err = cli(capsys, "simulate", "--model", model, "--cluster", "dgx-h100:1",
                           "--plan", str(plan))
        assert rc == 0, err
        assert ("32 of 32 layers attend over a sliding window of 1,024 tokens" in out) == warned


@pytest.mark.parametrize("ref", ["", " "])
def test_models_with_an_empty_name(capsys, ref):
    rc, out, err = cli(capsys, "models", "--model", ref)
    assert_bad_input(rc, out, err, "model: is empty")
    rc, out, err = cli(capsys, "models", "--model", ref, "--json")
    assert_bad_input(rc, out, err, "model: is empty")


def test_models_lists_the_zoo_without_a_name(capsys):
    rc, out, err = cli(capsys, "models")
    assert rc == 0 and "llama3-8b" in out and "gpt3-175b" in out


def documented_limits(doc: str) -> dict[str, int]:
    """The ``| `NAME` | 1,234 | ...`` rows of a limits table in the docs."""
    text = (Path(__file__).parents[1] / "docs" / "reference" / doc).read_text()
    rows = re.findall(r"^\| `(MAX_\w+)` \| ([\d,]+) \|", text, re.M)
    return {name: int(value.replace(",", "")) for name, value in rows}


def test_docs_list_every_limit():
    documented = documented_limits("model.md") | documented_limits("cluster.md")
    code = {name: getattr(limits, name) for name in limits.__all__ if name.startswith("MAX_")}
    assert documented == code
