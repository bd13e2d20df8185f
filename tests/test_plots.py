"""``trainsim plot breakdown`` and ``plot timeline``: the files they write and what they read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.cli import assert_bad_input, cli

from sim import Plan
from trainsim.cli import main
from trainsim.commands.breakdown import load_breakdowns

MODEL = ["--model", "llama3-8b", "--cluster", "dgx-h100:2"]


@pytest.fixture()
def plan_file(tmp_path: Path) -> Path:
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(Plan(global_batch_size=16, seq_len=2048, dp=4, tp=2,
                                    pp=2).to_dict()))
    return path


def _simulate(capsys, plan: Path, *extra: str) -> dict:
    rc, out, err = cli(capsys, "simulate", *MODEL, "--plan", str(plan), "--json", *extra)
    assert (rc, err) == (0, "")
    return json.loads(out)


def test_breakdown_reads_results_and_scenarios(capsys, tmp_path, plan_file):
    one = _simulate(capsys, plan_file)
    (tmp_path / "base.json").write_text(json.dumps(one))
    scenarios = tmp_path / "nic.toml"
    scenarios.write_text("[scenario.nic100]\ninter_node.nic_Gbps = 100\n"
                         "[scenario.nic800]\ninter_node.nic_Gbps = 800\n")
    many = _simulate(capsys, plan_file, "--scenario", str(scenarios))
    (tmp_path / "nic.json").write_text(json.dumps(many))
    rows, skipped = load_breakdowns([str(tmp_path / "base.json"), str(tmp_path / "nic.json")])
    assert skipped == 0 and len(rows) == 1 + len(many["scenarios"])
    label, breakdown, it = rows[0]
    assert label == "base" and it == one["iteration_time_s"]
    assert sum(breakdown.values()) == pytest.approx(it)
    slow = [r for r in rows if "100" in r[0]]
    fast = [r for r in rows if "800" in r[0]]
    assert slow and fast and slow[0][2] > fast[0][2]  # the slower NIC shows in the bars
    rc, out, err = cli(capsys, "plot", "breakdown", str(tmp_path / "base.json"),
                       str(tmp_path / "nic.json"), "--share", "--out",
                       str(tmp_path / "b.png"))
    assert (rc, err) == (0, "")
    for suffix in (".png", ".svg"):
        written = tmp_path / f"b{suffix}"
        assert f"wrote {written}" in out and written.stat().st_size > 1000
    assert (tmp_path / "b.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert b"<svg" in (tmp_path / "b.svg").read_bytes()[:400]


def test_breakdown_reads_a_sweep_and_skips_invalid_points(capsys, tmp_path):
    out_dir = tmp_path / "sw"
    rc, _, err = cli(capsys, "sweep", *MODEL, "--global-batch-size", "16", "--seq-len", "2048",
                     "--vary", "tp=1,2,3", "--out", str(out_dir), "--no-progress")
    assert (rc, err) == (0, ""), err
    rows, skipped = load_breakdowns([str(out_dir)])
    assert [r[0] for r in rows] == ["tp=1", "tp=2"] and skipped == 1  # tp=3 is invalid
    rc, out, err = cli(capsys, "plot", "breakdown", str(out_dir / "results.json"), "--out",
                       str(tmp_path / "sweep.png"))
    assert (rc, err) == (0, "") and "skipped 1 result" in out


def test_breakdown_bad_input_exits_2(capsys, tmp_path):
    rc, out, err = cli(capsys, "plot", "breakdown", str(tmp_path / "nope.json"))
    assert_bad_input(rc, out, err, "results", "no such file")
    (tmp_path / "x.json").write_text('{"a": 1}')
    rc, out, err = cli(capsys, "plot", "breakdown", str(tmp_path / "x.json"))
    assert_bad_input(rc, out, err, "results", "neither")
    (tmp_path / "bad.json").write_text("{")
    rc, out, err = cli(capsys, "plot", "breakdown", str(tmp_path / "bad.json"))
    assert_bad_input(rc, out, err, "results", "not JSON")
    rc, out, err = cli(capsys, "plot", "breakdown", str(tmp_path / "x.json"), "--out", "a.pdf")
    assert_bad_input(rc, out, err, "--out", ".png or .svg")
    assert not (tmp_path / "a.pdf").exists()


def test_timeline_writes_png_and_svg(capsys, tmp_path, plan_file):
    trace = tmp_path / "t.json"
    _simulate(capsys, plan_file, "--fidelity", "des", "--trace", str(trace))
    assert main(["plot", "timeline", str(trace), "--out", str(tmp_path / "tl.png")]) == 0
    out = capsys.readouterr().out
    assert "tl.png" in out and "tl.svg" in out
    assert (tmp_path / "tl.svg").stat().st_size > 1000
    assert main(["plot", "timeline", str(trace), "--out", str(tmp_path / "b" / "tl2.svg")]) == 0
    assert sorted(p.name for p in (tmp_path / "b").iterdir()) == ["tl2.png", "tl2.svg"]
