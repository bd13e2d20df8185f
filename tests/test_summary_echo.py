"""A text summary says what it summarises: the plan, and any straggler or failed link the
simulation applied."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers.cli import cli

PLAN = {"schema_version": 1, "global_batch_size": 16, "seq_len": 4096, "dp": 4, "tp": 4}
RUN = ["--model", "llama3-8b", "--cluster", "dgx-h100:2"]


@pytest.fixture
def plan(tmp_path: Path) -> str:
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(PLAN))
    return str(path)


def test_summary_echoes_the_plan(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                 plan: str) -> None:
    rc, out, err = cli(capsys, "simulate", *RUN, "--plan", plan, "--out", str(tmp_path / "r"))
    assert rc == 0, err
    line = "plan                  tp4 pp1 dp4 mb1 zero0 rc-none, global batch 16 x 4096 tokens"
    assert line in out and line in (tmp_path / "r" / "summary.txt").read_text()
    assert "stragglers" not in out and "failed links" not in out


def test_summary_names_the_applied_straggler(capsys: pytest.CaptureFixture[str],
                                             plan: str) -> None:
    rc, out, err = cli(capsys, "simulate", *RUN, "--plan", plan, "--straggler", "gpu:3=1.5")
    assert rc == 0, err
    assert "  stragglers            gpu:3=1.5\n" in out


def test_summary_names_the_failed_link(capsys: pytest.CaptureFixture[str], plan: str) -> None:
    rc, out, err = cli(capsys, "simulate", *RUN, "--plan", plan, "--fidelity", "des",
                       "--fail-link", "nic1.0@0.1")
    assert rc == 0, err
    assert "  failed links          nic1.0 at 0.1 s\n" in out
