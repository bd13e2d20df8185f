"""The ``trainsim`` CLI: good input works, every ``--help`` is complete, and the real program
behaves as the in-process one (bad input: ``test_cli_errors.py``).

The bulk runs ``trainsim.cli.main`` in-process (fast); a few cases run the real program in a
subprocess to check what a user actually sees.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest
from helpers.cli import (
    BREAKDOWN_KEYS,
    GPT3,
    H100,
    NEW,
    RESULT_KEYS,
    assert_bad_input,
    cli,
    run_trainsim,
    write_plan,
)

from trainsim import __version__
from trainsim.cli import build_parser


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
         "cosim", "trace", "optimize-sync", "fl", "sites", "calibrate"],
    ("calibrate",): ["runs", "--out", "--factors", "--prior", "--fidelity", "--loo",
                     "--on-one", "--json"],
    ("sites",): ["--model", "--cluster", "--plan", "--sync", "--wan-gbps", "--choose",
                 "--floor", "--fidelity", "--convergence", "--lr", "--balance", "--out",
                 "--json"],
    ("fl",): ["job", "--strategy", "--rounds", "--clients-per-round", "--overcommit",
              "--deadline-s", "--network", "--buffer", "--concurrency", "--seed",
              "--compare-networks", "--compare-strategies", "--target", "--convergence",
              "--out", "--json", "--no-progress"],
    ("optimize",): ["--model", "--cluster", "--global-batch-size", "--seq-len", "--top",
                    "--workers", "--json", "--out", "--set", "--scenario", "--dtype",
                    "--framework", "--max-zero-stage", "--fix", "--max-memory-gib", "--min-mfu",
                    "--max-wall-s", "--no-progress"],
    ("export",): ["--plan", "--model", "--cluster", "--format", "--out"],
    ("optimize-sync",): ["--model", "--cluster", "--plan", "--objective", "--convergence", "--lr",
                         "--target", "--des-top", "--steps", "--straggler", "--top", "--json",
                         "--global-batch-size", "--seq-len", "--parallel-top", "--dtype",
                         "--workers"],
    ("simulate",): ["--model", "--cluster", "--plan", "--fidelity", "--profile",
                    "--compute-stat", "--trace",
                    "--no-reduce", "--json", "--out", "--set", "--scenario", "--straggler",
                    "--straggler-dist", "--seed", "--fail-link", "--max-wall-s", "--no-progress",
                    "--steps", "--jitter", "--convergence", "--lr", "--target", "--explain",
                    "--explain-delta", "--calibration", "--stack"],
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
                 "--workers", "--ray", "--out", "--json", "--no-progress",
                 "--framework", "--max-zero-stage", "--fix", "--max-memory-gib", "--min-mfu"],
    ("plan",): ["new", "check"],
    ("plan", "new"): ["--global-batch-size", "--seq-len", "--micro-batch-size", "--dp", "--tp",
                      "--pp", "--cp", "--ep", "--etp", "--vpp", "--zero-stage", "--schedule",
                      "--recompute", "--dtype", "--grad-reduce-dtype", "--attention",
                      "--placement",
                      "--sequence-parallel", "--moe-max-load", "--moe-capacity-factor",
                      "--moe-dispatcher", "--moe-dispatch-dtype", "--moe-comm-sms", "--cp-comm",
                      "--recompute-modules", "--recompute-replay", "--tp-overlap",
                      "--keep-gathered-weights",
                      "--moe-overlap", "--sync",
                      "--communication",
                      "--compression", "--model", "--cluster", "--out"],
    ("plan", "check"): ["plan", "--model", "--cluster"],
    ("models",): ["--model", "--json"],
    ("hardware",): ["--sources", "--stacks"],
    ("cluster",): ["--cluster", "--json"],
    ("demo",): ["--out"],
    ("profile",): ["compute", "comm", "tp", "fsdp", "show", "import-trace"],
    ("profile", "fsdp"): ["--dp", "--params", "--samples", "--device", "--dtype", "--passes",
                          "--timeout", "--db"],
    ("profile", "tp"): ["--model", "--tp", "--micro-batch", "--seq-len", "--sp", "--device",
                        "--dtype", "--passes", "--timeout", "--db"],
    ("profile", "compute"): ["--model", "--batch", "--depth", "--device", "--threads",
                             "--dtype", "--tp", "--micro-batch", "--seq-len", "--db", "--force",
                             "--passes", "--busy"],
    ("profile", "comm"): ["--nproc", "--collectives", "--min-bytes", "--max-bytes", "--rounds",
                          "--no-insitu", "--timeout", "--db", "--accept-poor-fit"],
    ("profile", "show"): ["--db"],
    ("trace",): ["--model", "--out", "--name", "--depth", "--batch", "--seq-len", "--json"],
    ("profile", "import-trace"): ["trace", "--top", "--json"],
    ("execute",): ["--model", "--plan", "--nproc", "--steps", "--warmup", "--device",
                   "--threads", "--timeout", "--scale-layers", "--scale-hidden",
                   "--inject-fault", "--json", "--task", "--lr", "--eval-every"],
    ("compare",): ["--model", "--plan", "--nproc", "--steps", "--warmup", "--device",
                   "--threads", "--timeout", "--scale-layers", "--scale-hidden",
                   "--inject-fault", "--json", "--cluster", "--profile", "--compute-stat",
                   "--fidelity", "--calibrate", "--measured", "--calibration-out",
                   "--task", "--lr", "--eval-every", "--convergence", "--target"],
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
