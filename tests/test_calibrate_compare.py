"""trainsim calibrate takes ``trainsim compare --json`` results as measured runs (a
``compare`` column): the measured time of a real two-rank run, checked against the row's
model, cluster and plan; a comparison of anything else is a one-line error."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.cli import cli

from optimizer.calibrate import load_runs

PLAN = {"global_batch_size": 4, "seq_len": 64, "micro_batch_size": 2, "dtype": "fp32"}


def _write(tmp_path: Path, name: str, data: dict) -> str:
    (tmp_path / name).write_text(json.dumps(data))
    return name


@pytest.fixture(scope="module")
def compared(tmp_path_factory) -> tuple[Path, dict]:
    """A real ``trainsim compare --json`` of tiny on two CPU ranks (one timed step)."""
    folder = tmp_path_factory.mktemp("compared")
    plan = folder / "plan.json"
    plan.write_text(json.dumps(PLAN | {"dp": 2}))
    out = subprocess.run([sys.executable, "-m", "trainsim", "compare", "--model", "tiny",
                          "--plan", str(plan), "--cluster", "cpu:2", "--steps", "1",
                          "--warmup", "1", "--json"], capture_output=True, text=True,
                         timeout=300, check=True).stdout
    (folder / "run.json").write_text(out)
    return folder, json.loads(out)


def _runs(folder: Path, plan: str = "plan.json", model: str = "tiny",
          cluster: str = "cpu:2") -> Path:
    path = folder / "runs.csv"
    path.write_text(f"model,cluster,plan,compare\n{model},{cluster},{plan},run.json\n")
    return path


def test_a_comparison_is_a_measured_run(compared, capsys):
    folder, result = compared
    run = load_runs(_runs(folder))[0]
    assert run.measured_s == result["measured_s"] and run.plan.dp == 2
    out = folder / "cal.json"
    code, text, _ = cli(capsys, "calibrate", str(_runs(folder)), "--factors", "gemm_eff_max",
                        "--out", str(out))
    assert code == 0 and out.is_file() and "gemm_eff_max" in text


def test_a_comparison_of_another_run_is_refused(compared, capsys):
    folder, result = compared
    _write(folder, "other.json", PLAN | {"dp": 2, "micro_batch_size": 1})
    cases = {
        _runs(folder, plan="other.json"): "ran another plan: its micro_batch_size is 2, "
                                          "the row's 1",
        _runs(folder, model="llama3-8b", cluster="dgx-a100:1"): "compares model 'tiny'",
    }
    for runs, needle in cases.items():
        runs.rename(folder / "bad.csv")
        code, out, err = cli(capsys, "calibrate", str(folder / "bad.csv"), "--out",
                             str(folder / "never.json"))
        assert code == 2 and out == "" and needle in err and len(err.splitlines()) == 1
        assert "runs[0].compare" in err and not (folder / "never.json").exists()
    edited = {  # the file edited to what a wrong one would say
        "measured_s": ({"measured_s": 1.0}, "is not a `trainsim compare --json` result"),
        "task": ({"task": "digits", "plan": PLAN}, "is a synchronisation (--task) comparison"),
        "device": (result | {"measured": result["measured"] | {"device": "cuda"}},
                   "was measured on cuda, cluster 'cpu:2' has cpu"),
        "scaled": (result | {"measured": result["measured"] | {
            "model": result["measured"]["model"] | {"num_layers": 1}}},
                   "compares another model than the row's"),
    }
    try:
        for data, needle in edited.values():
            _write(folder, "run.json", data)
            code, _, err = cli(capsys, "calibrate", str(_runs(folder)))
            assert code == 2 and needle in err and len(err.splitlines()) == 1, err
    finally:
        _write(folder, "run.json", result)
