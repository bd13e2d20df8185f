"""Sweeps (``optimizer/sweep*.py``, ``trainsim sweep``, ``trainsim plot sweep``): the grid, the
checks before anything runs, the rows, streaming and resuming, the report, Ray."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from optimizer.sweep.grid import (
    SweepSpec,
    check_spec,
    evaluate_point,
    grid_points,
    plan_for_point,
    point_key,
    sort_key,
)
from optimizer.sweep.report import non_monotone, sensitivity
from optimizer.sweep.run import POINTS_FILE, read_points, run_sweep
from sim import load_cluster
from sim.errors import SpecError
from trainsim.cli import main

ROOT = Path(__file__).resolve().parents[1]
FIXED = (("global_batch_size", 32), ("seq_len", 2048))
SPEC = SweepSpec("llama3-8b", "dgx-h100:2", fixed=FIXED,
                 axes=(("inter_node.nic_Gbps", (100, 400)), ("tp", (1, 2, 3))))


# the grid -----------------------------------------------------------------------------------
def test_grid_is_the_product_first_axis_outermost():
    assert grid_points(SPEC) == [{"inter_node.nic_Gbps": n, "tp": t}
                                 for n in (100, 400) for t in (1, 2, 3)]
    assert SPEC.size == 6
    assert grid_points(SweepSpec("m", "c")) == [{}]


def test_point_key_is_canonical_and_sort_is_numeric():
    assert point_key({"tp": 2, "gpu": "b200"}) == point_key({"gpu": "b200", "tp": 2}) \
        == '{"gpu":"b200","tp":2}'
    pts = [{"n": 800}, {"n": 100}, {"n": 1600}, {"n": "x"}]
    assert [p["n"] for p in sorted(pts, key=lambda p: sort_key(p, ["n"]))] == [100, 800, 1600,
                                                                               "x"]


@pytest.mark.parametrize("spec, message", [
    (SweepSpec("llama3-8b", "dgx-h100:2", fixed=FIXED, axes=(("nic", (1,)),)),
     r"^nic: unknown scenario key"),
    (SweepSpec("llama3-8b", "dgx-h100:2", fixed=FIXED, axes=(("tp", (1,)), ("tp", (2,)))),
     r"^--vary tp: is given twice"),
    (SweepSpec("llama3-8b", "dgx-h100:2", fixed=FIXED + (("tp", 2),), axes=(("tp", (1,)),)),
     r"^tp: is both fixed"),
    (SweepSpec("llama3-8b", "dgx-h100:2", fixed=FIXED, axes=(("tp", ()),)),
     r"^--vary tp: needs at least one value"),
    (SweepSpec("llama3-8b", "dgx-h100:2", fixed=FIXED,
               axes=(("inter_node.nic_Gbps", (100, -1)),)),
     r"^inter_node\.nic_Gbps: must be a positive number, got -1"),
    (SweepSpec("llama3-8b", "dgx-h100:2", fixed=FIXED, axes=(("gpu", ("b200", "h300")),)),
     r"^gpu: unknown device 'h300'"),
    (SweepSpec("llama3-8b", "dgx-h100:2", fixed=FIXED, axes=(("fidelity", ("des", "exact")),)),
     r"^fidelity: must be one of analytic, des"),
    (SweepSpec("llama3-8b", "dgx-h100:2", axes=(("tp", (1,)),)),
     r"^plan\.global_batch_size: is required"),
    (SweepSpec("llama3-8b", "dgx-h100:2", fixed=FIXED, axes=(("tp", (1,)),), optimize=True),
     r"^tp: is a plan field"),
    (SweepSpec("llama9", "dgx-h100:2", fixed=FIXED), r"^model"),
])
def test_bad_sweeps_fail_before_anything_runs(spec, message):
    with pytest.raises(SpecError, match=message):
        check_spec(spec)


# one point ----------------------------------------------------------------------------------
def test_dp_fills_the_cluster_unless_given():
    cluster = load_cluster("dgx-h100:2")
    assert plan_for_point(SPEC, {"tp": 2}, cluster).dp == 8
    spec = SweepSpec("llama3-8b", "dgx-h100:2", fixed=FIXED + (("dp", 4),))
    assert plan_for_point(spec, {"tp": 4}, cluster).dp == 4
    with pytest.raises(SpecError, match=r"^plan\.dp: tp\*pp\*cp = 3\*1\*1 = 3 does not divide"):
        plan_for_point(SPEC, {"tp": 3}, cluster)


def test_point_rows_are_deterministic_figures_or_a_status():
    ok = evaluate_point(SPEC, {"inter_node.nic_Gbps": 100, "tp": 2})
    assert ok == evaluate_point(SPEC, {"inter_node.nic_Gbps": 100, "tp": 2})
    assert ok["status"] == "ok" and ok["dp"] == 8 and ok["plan"].startswith("tp2 pp1 dp8")
    assert sum(ok["breakdown"].values()) == pytest.approx(ok["iteration_time_s"])
    assert "wall_s" not in json.dumps(ok)
    bad = evaluate_point(SPEC, {"inter_node.nic_Gbps": 100, "tp": 3})
    assert bad["status"] == "invalid" and bad["error"].startswith("plan.dp:")
    fast = evaluate_point(SPEC, {"inter_node.nic_Gbps": 400, "tp": 2})
    assert fast["iteration_time_s"] < ok["iteration_time_s"]


def test_fidelity_and_model_can_be_swept():
    spec = SweepSpec("llama3-8b", "dgx-h100:2", fixed=FIXED + (("tp", 4),),
                     axes=(("fidelity", ("analytic", "des")), ("model", ("llama3-8b", "tiny"))))
    check_spec(spec)
    rows = [evaluate_point(spec, p) for p in grid_points(spec)]
    assert [r["fidelity"] for r in rows] == ["analytic", "analytic", "des", "des"]
    assert rows[0]["iteration_time_s"] == pytest.approx(rows[2]["iteration_time_s"], rel=0.05)
    assert rows[1]["iteration_time_s"] < rows[0]["iteration_time_s"]  # tiny


# streaming and resuming ---------------------------------------------------------------------
def test_workers_and_resume_give_the_same_results(tmp_path):
    whole = run_sweep(SPEC, tmp_path / "a", workers=1, progress=False)
    assert (whole.resumed, whole.computed) == (0, 6)
    assert [r["params"] for r in whole.rows] == grid_points(SPEC)  # sorted by values
    two = run_sweep(SPEC, tmp_path / "b", workers=2, progress=False)
    assert two.rows == whole.rows
    # a kill after two points, in the middle of writing the third line
    lines = (tmp_path / "a" / POINTS_FILE).read_bytes().splitlines(keepends=True)
    cut = tmp_path / "c"
    cut.mkdir()
    (cut / POINTS_FILE).write_bytes(b"".join(lines[:3]) + lines[3][:25])
    resumed = run_sweep(SPEC, cut, workers=1, progress=False)
    assert (resumed.resumed, resumed.computed) == (2, 4)
    assert resumed.rows == whole.rows
    for name in ("results.json", "results.csv", "summary.json"):
        assert (cut / name).read_bytes() == (tmp_path / "a" / name).read_bytes(), name
    header, rows, _ = read_points(cut / POINTS_FILE)
    assert header is not None and len(rows) == 6
    again = run_sweep(SPEC, cut, workers=1, progress=False)
    assert (again.resumed, again.computed) == (6, 0)


def test_a_grown_grid_reuses_the_finished_points(tmp_path):
    run_sweep(SPEC, tmp_path, workers=1, progress=False)
    grown = SweepSpec(SPEC.model, SPEC.cluster, fixed=FIXED,
                      axes=(("inter_node.nic_Gbps", (100, 400, 800)), ("tp", (1, 2, 3))))
    out = run_sweep(grown, tmp_path, workers=1, progress=False)
    assert (out.resumed, out.computed) == (6, 3)


def test_another_sweep_in_the_same_folder_is_refused(tmp_path):
    run_sweep(SPEC, tmp_path, workers=1, progress=False)
    other = SweepSpec(SPEC.model, "dgx-h100:4", fixed=FIXED, axes=SPEC.axes)
    with pytest.raises(SpecError, match=r"^--out: .* holds another sweep \(cluster: "
                       r"'dgx-h100:2' there, 'dgx-h100:4' now\)"):
        run_sweep(other, tmp_path, workers=1, progress=False)


def _wait_for_lines(path: Path, n: int, proc: subprocess.Popen, timeout_s: float) -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end and proc.poll() is None:
        if path.exists() and path.read_bytes().count(b"\n") >= n:
            return
        time.sleep(0.05)


# 12 DES points: long enough to kill the sweep in the middle
KILL_ARGS = [sys.executable, "-m", "trainsim", "sweep", "--model", "llama3-8b", "--cluster",
             "dgx-h100:2", "--global-batch-size", "16", "--seq-len", "2048", "--fidelity",
             "des", "--vary", "inter_node.nic_Gbps=100,200,400,800", "--vary", "tp=2,4,8",
             "--no-progress"]


def kill_resume_and_compare(where: list[str], tmp_path: Path, timeout_s: float) -> None:
    """SIGKILL of the whole process group (driver and workers) after a few points, the same
    command again, and an uninterrupted run on the local pool: the resumed sweep holds every
    point once and writes the same results."""
    killed = tmp_path / "killed"
    proc = subprocess.Popen([*KILL_ARGS, *where, "--out", str(killed)], cwd=ROOT,
                            start_new_session=True, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    _wait_for_lines(killed / POINTS_FILE, 3, proc, timeout_s)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    before = read_points(killed / POINTS_FILE)[1]
    subprocess.run([*KILL_ARGS, *where, "--out", str(killed)], cwd=ROOT, check=True,
                   capture_output=True)
    subprocess.run([*KILL_ARGS, "--workers", "2", "--out", str(tmp_path / "whole")],
                   cwd=ROOT, check=True, capture_output=True)
    after = read_points(killed / POINTS_FILE)[1]
    assert 2 <= len(before) < 12 and len(after) == 12
    assert len({str(sorted(r["params"].items())) for r in after}) == 12  # none twice
    assert (killed / "results.json").read_text() == (tmp_path / "whole" / "results.json"
                                                     ).read_text()


def test_killed_sweep_restarts_where_it_stopped(tmp_path):
    kill_resume_and_compare(["--workers", "2"], tmp_path, 60)


@pytest.mark.skipif(importlib.util.find_spec("ray") is None,
                    reason="Ray is not installed (pip install 'trainsim[sweep-ray]')")
def test_ray_gives_the_same_results(tmp_path):
    local = run_sweep(SPEC, tmp_path / "mp", workers=2, progress=False)
    on_ray = run_sweep(SPEC, tmp_path / "ray", workers=2, ray_address="local", progress=False)
    assert on_ray.rows == local.rows
    assert (tmp_path / "ray" / "results.csv").read_text() == \
        (tmp_path / "mp" / "results.csv").read_text()


# the report ---------------------------------------------------------------------------------
def _row(nic, tp, t):
    return {"params": {"inter_node.nic_Gbps": nic, "tp": tp}, "status": "ok",
            "iteration_time_s": t}


def test_sensitivity_by_hand():
    rows = [_row(100, 1, 2.0), _row(400, 1, 1.0), _row(100, 2, 3.0), _row(400, 2, 2.4)]
    got = {e["param"]: e for e in sensitivity(rows, ["inter_node.nic_Gbps", "tp"])}
    assert got["inter_node.nic_Gbps"]["max_spread"] == pytest.approx(1.0)  # 2.0 / 1.0
    assert got["inter_node.nic_Gbps"]["median_spread"] == pytest.approx((1.0 + 0.25) / 2)
    assert got["tp"]["median_spread"] == pytest.approx((0.5 + 1.4) / 2)


def test_non_monotone_steps_are_reported():
    rows = [_row(100, 1, 2.0), _row(200, 1, 1.5), _row(400, 1, 1.6), _row(100, 2, 3.0),
            _row(400, 2, 3.0)]
    found = non_monotone(rows, ["inter_node.nic_Gbps", "tp"])
    assert [(e["from"], e["to"], e["others"]) for e in found] == [(200, 400, {"tp": 1})]
    assert found[0]["slowdown"] == pytest.approx(1.6 / 1.5 - 1)


# the command line ---------------------------------------------------------------------------
def test_cli_grid_file_sweep_and_plots(capsys, tmp_path):
    grid = tmp_path / "grid.toml"
    grid.write_text('model = "llama3-8b"\ncluster = "dgx-h100:2"\n'
                    "[set]\nglobal_batch_size = 32\nseq_len = 2048\n"
                    "[vary]\ninter_node.nic_Gbps = [100, 200, 400]\n")
    out = tmp_path / "sw"
    assert main(["sweep", "--grid", str(grid), "--vary", "tp=2,4", "--out", str(out),
                 "--no-progress"]) == 0
    text = capsys.readouterr().out
    assert "6 points run, 0 already" in text and "sensitivity to tp" in text
    csv = (out / "results.csv").read_text().splitlines()
    assert csv[0].startswith("inter_node.nic_Gbps,tp,status,") and len(csv) == 7
    assert main(["plot", "sweep", str(out), "--x", "inter_node.nic_Gbps", "--hue", "tp"]) == 0
    assert main(["plot", "sensitivity", str(out / "results.json")]) == 0
    for name in ("sweep_inter_node.nic_Gbps", "sensitivity"):
        for suffix in (".png", ".svg"):
            assert (out / (name + suffix)).stat().st_size > 1000
    assert main(["plot", "sweep", str(out), "--x", "pp"]) == 2
    assert "--x: 'pp' is not a swept parameter" in capsys.readouterr().err


@pytest.mark.parametrize("args, message", [
    (["--vary", "tp"], "--vary: must be KEY=V1,V2"),
    (["--vary", "warp=1,2"], "warp: unknown scenario key"),
    (["--set", "inter_node.nic_Gbps=0", "--vary", "tp=1"], "inter_node.nic_Gbps: must be"),
])
def test_cli_bad_sweep_is_one_line_exit_2(capsys, tmp_path, args, message):
    rc = main(["sweep", "--model", "llama3-8b", "--cluster", "dgx-h100:2", "--global-batch-size",
               "32", "--seq-len", "2048", "--out", str(tmp_path / "x"), *args])
    out, err = capsys.readouterr()
    assert rc == 2 and err.startswith(f"trainsim: error: {message}") and err.count("\n") == 1
    assert not (tmp_path / "x").exists()


def test_cli_optimize_sweep(capsys, tmp_path):
    assert main(["sweep", "--model", "tiny", "--cluster", "cpu:2", "--global-batch-size", "8",
                 "--seq-len", "256", "--optimize", "--top", "2", "--vary",
                 "gpus_per_node=1,2,4", "--workers", "1", "--out", str(tmp_path),
                 "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["status"]["ok"] == 3
    rows = json.loads((tmp_path / "results.json").read_text())
    assert [r["gpus"] for r in rows] == [1, 2, 4]
    assert all(r["plan"] for r in rows)
