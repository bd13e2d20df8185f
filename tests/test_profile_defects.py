"""Defects a new user hit in ``trainsim profile``, ``compare --calibrate`` and ``execute``:
bad numbers give one line and exit 2, the alpha-beta fit is checked, calibration never
writes into a profile (least of all the installed one) and applies only where asked for,
``profile show`` works without --db, unsupported plans are refused before torchrun."""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
from helpers.cli import cli

import executor.launch
import profiler.comm
from profiler.comm import PoorFitError, fit_alpha_beta, fit_problem, fit_segments
from profiler.db import read_table
from sim import Plan, load_cluster
from sim.cost.profile_db import shipped_profiles_root
from sim.errors import SpecError
from sim.spec.model import ModelSpec

SIZES = [2**i for i in range(10, 31, 2)]  # 1 KiB .. 1 GiB, as profile comm measures


run = cli  # trainsim in-process: (exit code, stdout, stderr)


# 1. Numeric options ---------------------------------------------------------------------------
@pytest.mark.parametrize("args,needle", [
    (["profile", "compute", "--threads", "-1"], "--threads: must be >= 1, got -1"),
    (["profile", "compute", "--threads", "0"], "--threads: must be >= 1, got 0"),
    (["profile", "compute", "--busy", "-1"], "--busy: must be >= 0"),
    (["profile", "compute", "--passes", "x"], "--passes: expected an integer >= 1"),
    (["profile", "comm", "--nproc", "1"], "--nproc: must be >= 2"),
    (["profile", "comm", "--rounds", "0"], "--rounds: must be >= 1"),
    (["profile", "comm", "--max-bytes", "-5"], "--max-bytes: must be >= 1"),
    (["profile", "comm", "--timeout", "0"], "--timeout: must be a finite number of seconds"),
    (["profile", "comm", "--timeout", "nan"], "--timeout: must be a finite number of seconds"),
    (["profile", "import-trace", "t.json", "--top", "0"], "--top: must be >= 1"),
    (["execute", "--model", "tiny", "--plan", "p.json", "--timeout", "inf"], "--timeout"),
    (["execute", "--model", "tiny", "--plan", "p.json", "--steps", "0"], "--steps"),
    (["execute", "--model", "tiny", "--plan", "p.json", "--threads", "-2"], "--threads"),
])
def test_bad_numbers_are_one_line_exit_2_and_write_nothing(capsys, tmp_path, monkeypatch,
                                                           args, needle):
    monkeypatch.chdir(tmp_path)
    db = ["--db", str(tmp_path / "db")] if args[:2] in (["profile", "compute"],
                                                        ["profile", "comm"]) else []
    code, out, err = run(capsys, *args, *db)
    assert code == 2 and out == "" and needle in err and len(err.splitlines()) == 1
    assert list(tmp_path.iterdir()) == []


# 2. The alpha-beta fit ------------------------------------------------------------------------
def _sq(s, t, alpha, beta):
    return float(np.sum(((alpha + beta * s) / t - 1) ** 2))


def test_a_negative_intercept_is_refitted_with_alpha_zero_least_squares():
    s = np.array([1e5, 1e6, 1e7, 1e8])
    t = -40.6e-6 + 2e-9 * s  # the line a user got: alpha -40.6 us
    alpha, beta, err = fit_alpha_beta(s, t)
    assert alpha == 0.0 and beta > 0
    assert err == pytest.approx(float(np.max(np.abs(beta * s / t - 1))))
    best = _sq(s, t, alpha, beta)  # no feasible line nearby does better
    for a in (0.0, 1e-6, 1e-5):
        for b in beta * np.array([0.9, 0.99, 1.01, 1.1]):
            assert _sq(s, t, a, b) > best


def test_times_falling_with_size_give_a_flat_line_not_a_negative_slope():
    s = np.array([1e3, 4e3, 1.6e4])
    alpha, beta, err = fit_alpha_beta(s, np.array([3e-4, 2.5e-4, 2e-4]))
    assert beta == 0.0 and alpha > 0 and err > 0
    with pytest.raises(ValueError, match="finite and > 0"):
        fit_alpha_beta(s, np.array([1e-4, 0.0, 1e-4]))


def test_a_clean_two_regime_table_has_no_quality_notes():
    times = [5e-5 + s * 1e-10 if s < 2**20 else 1e-3 + s * 3e-10 for s in SIZES]
    segs = fit_segments(SIZES, times)
    assert [seg["quality"] for seg in segs] == ["", ""]
    assert all(seg["alpha_s"] >= 0 and seg["beta_s_per_byte"] > 0 for seg in segs)


def test_a_zigzag_table_is_a_poor_fit():
    times = [1e-3 if i % 2 else 3e-3 for i in range(len(SIZES))]  # 3x up and down
    segs = fit_segments(SIZES, times)
    assert any(seg["quality"].startswith("fit error") for seg in segs)
    assert all(seg["max_rel_error"] > 0.25 for seg in segs if seg["quality"])


def test_the_last_range_needs_a_bandwidth_a_lower_one_may_be_flat():
    seg = {"alpha_s": 1e-4, "beta_s_per_byte": 0.0, "max_rel_error": 0.05}
    assert fit_problem(seg, last=False) == ""
    assert "bandwidth is not finite and positive" in fit_problem(seg, last=True)
    assert "negative latency" in fit_problem({**seg, "alpha_s": -4.06e-5}, last=False)
    assert "fit error 72% > 25%" in fit_problem({**seg, "max_rel_error": 0.72}, last=False)


def _rows(times):
    return [{"collective": "all_reduce", "backend": "gloo", "fabric": "intra", "group_size": 2,
             "size_bytes": s, "time_median_s": t, "time_p10_s": t, "time_p90_s": t,
             "algbw_GBps": s / t / 1e9, "busbw_GBps": s / t / 1e9, "repeats": 3}
            for s, t in zip(SIZES, times, strict=True)]


def test_a_poor_fit_is_refused_before_anything_is_written(capsys, tmp_path, monkeypatch):
    """The measurement (torchrun) is replaced by a fixed table; the fit, the refusal and
    the writing are the real ones."""
    zigzag = _rows([1e-3 if i % 2 else 3e-3 for i in range(len(SIZES))])
    monkeypatch.setattr(profiler.comm, "_measure", lambda *a: (zigzag, []))
    with pytest.raises(PoorFitError, match="all_reduce x2 .*fit error .*nothing written"):
        profiler.comm.run_comm_profile(2, tmp_path, SIZES, ["all_reduce"])
    assert list(tmp_path.iterdir()) == []
    code, out, err = run(capsys, "profile", "comm", "--collectives", "all_reduce", "--db",
                         str(tmp_path / "db"), "--no-insitu")
    assert code == 1 and "POOR FIT: fit error" in out and not (tmp_path / "db").exists()
    assert "trainsim: warning: poor alpha-beta fit" in err
    assert err.splitlines()[-1].startswith("trainsim: error: all_reduce x2")


def test_an_accepted_poor_fit_is_stored_flagged_and_shown(capsys, tmp_path, monkeypatch):
    zigzag = _rows([1e-3 if i % 2 else 3e-3 for i in range(len(SIZES))])
    monkeypatch.setattr(profiler.comm, "_measure", lambda *a: (zigzag, []))
    code, out, err = run(capsys, "profile", "comm", "--collectives", "all_reduce", "--db",
                         str(tmp_path), "--accept-poor-fit", "--no-insitu")
    assert code == 0 and "trainsim: warning: poor alpha-beta fit" in err
    folder = next(p for p in tmp_path.iterdir() if p.is_dir())
    fits = read_table(folder, "comm_fit")
    assert fits["quality"].str.startswith("fit error").any()
    assert json.loads((folder / "meta.json").read_text())["runs"][-1]["poor_fits"] >= 1
    code, out, _ = run(capsys, "profile", "show", "--db", str(tmp_path))
    assert code == 0 and "POOR FIT" in out and "fit error" in out


# 3. Calibration ----------------------------------------------------------------------------
def _digest(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def _plan(tmp_path, **fields):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({"global_batch_size": 4, "seq_len": 64, "micro_batch_size": 2,
                                "dtype": "fp32", **fields}))
    return str(path)


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TRAINSIM_HOME", str(tmp_path / "trainsim"))
    monkeypatch.chdir(tmp_path)
    return tmp_path / "trainsim"


def test_compare_calibrate_writes_a_user_profile_never_the_shipped_one(capsys, tmp_path, home):
    """A real two-rank run, then the same measurement again from its JSON."""
    shipped = load_cluster("cpu:2").profile
    if shipped is None:
        pytest.skip("no profile shipped for this host's CPU model")
    before = _digest(Path(shipped))
    common = ["compare", "--model", "tiny", "--plan", _plan(tmp_path, dp=2), "--cluster",
              "cpu:2", "--json"]
    code, out, _ = run(capsys, *common, "--steps", "1", "--warmup", "1", "--calibrate")
    first = json.loads(out)
    assert code == 0 and first["calibrated_by"] is None
    cal = home / "profiles" / Path(shipped).name / "calibration.json"
    assert first["calibration"]["path"] == str(cal) and cal.is_file()
    assert _digest(Path(shipped)) == before  # the package is byte-identical
    (tmp_path / "run.json").write_text(json.dumps(first["measured"]))
    again = [*common, "--measured", str(tmp_path / "run.json")]
    code, out, _ = run(capsys, *again)
    assert code == 0 and json.loads(out)["predicted_s"] == first["predicted_s"]  # not applied
    code, out, _ = run(capsys, *again, "--profile", str(home / "profiles"))
    used = json.loads(out)
    assert code == 0 and used["calibrated_by"] == str(cal)
    step = first["calibration"]["step"]  # compute scaled by it, communication not
    assert (used["predicted_s"] - first["predicted_s"]) * (step - 1) > 0
    text = [a for a in again if a != "--json"]
    code, out, _ = run(capsys, *text, "--calibrate")  # the text output names the place
    assert code == 0 and f"written to {cal}" in out and _digest(Path(shipped)) == before


def test_a_calibration_target_inside_the_package_or_a_profile_is_refused(capsys, tmp_path,
                                                                         home):
    shipped = load_cluster("cpu:2").profile
    if shipped is None:
        pytest.skip("no profile shipped for this host's CPU model")
    base = ["compare", "--model", "tiny", "--plan", _plan(tmp_path, dp=2), "--cluster",
            "cpu:2", "--calibrate"]
    for out_dir, needle in ((shipped_profiles_root() / "mine", "installed trainsim package"),
                            (Path(shipped), "installed trainsim package")):
        code, out, err = run(capsys, *base, "--calibration-out", str(out_dir))
        assert code == 2 and out == "" and needle in err and len(err.splitlines()) == 1
    assert not (shipped_profiles_root() / "mine").exists()
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "meta.json").write_text(json.dumps({"device": "x"}))
    code, _, err = run(capsys, *base, "--calibration-out", str(tmp_path / "other"))
    assert code == 2 and "--calibration-out" in err and "a measured profile" in err
    code, _, err = run(capsys, *base[:-1], "--calibration-out", str(tmp_path / "x"))
    assert code == 2 and "--calibration-out: only with --calibrate" in err


def test_a_measured_run_of_another_plan_is_refused(capsys, tmp_path, home):
    (tmp_path / "run.json").write_text(json.dumps({
        "iteration_s": 1, "min_s": 1, "max_s": 1, "peak_bytes": [1], "loss": [1.0],
        "tokens_per_s": 1, "collectives": {"0": []}, "model": {}, "plan": {}}))
    code, out, err = run(capsys, "compare", "--model", "tiny", "--plan", _plan(tmp_path, dp=2),
                         "--cluster", "cpu:2", "--measured", str(tmp_path / "run.json"))
    assert code == 2 and "--measured: was measured with another model" in err


# 4. profile show --------------------------------------------------------------------------
def test_profile_show_lists_shipped_and_user_profiles_without_db(capsys, tmp_path, home):
    from executor.compare import calibrate

    shipped = load_cluster("cpu:2")
    if shipped.profile is None:
        pytest.skip("no profile shipped for this host's CPU model")
    run_ = {"model": "tiny", "plan": {}, "measured_s": 2.0, "predicted_s": 1.0}
    calibrate(shipped, [run_])
    code, out, _ = run(capsys, "profile", "show")
    assert code == 0
    name = Path(shipped.profile).name
    assert f"{name}: shipped with trainsim, device {name}, last 20" in out
    assert f"path {Path(shipped.profile).resolve()}" in out
    assert "no calibration applies; the cpu:RANKS preset reads this profile" in out
    assert f"{name}: calibrated profile" in out and f"path {home / 'profiles' / name}" in out
    assert "(median x2.000, 1 runs)" in out


# 5. execute refuses before launch -----------------------------------------------------------
def _no_launch(*args, **kwargs):
    raise AssertionError("torchrun was started")


@pytest.mark.parametrize("model,fields,needle", [
    ("tiny", {"cp": 2}, "plan.cp: context parallelism"),
    ("mixtral-8x7b", {"ep": 2, "dp": 2, "zero_stage": 1, "micro_batch_size": 1},
     "plan.zero_stage: 1 with expert parallelism"),
    ("tiny", {"tp": 2, "dp": 2, "global_batch_size": 8}, "plan.zero_stage: with tp > 1"),
    ("mixtral-8x7b", {"tp": 2, "dp": 2, "ep": 4, "etp": 1, "sequence_parallel": True,
                      "zero_stage": 3, "micro_batch_size": 1, "placement": "ep-tp-cp-dp-pp"},
     "plan.placement: puts an expert block's ranks out of order"),
    ("tiny", {"pp": 2, "vpp": 2, "schedule": "dualpipev", "dp": 2, "global_batch_size": 16},
     "plan.dp: dualpipev with data parallelism"),
])
def test_execute_refuses_before_launch(capsys, tmp_path, monkeypatch, model, fields, needle):
    monkeypatch.setattr(executor.launch.subprocess, "Popen", _no_launch)
    monkeypatch.chdir(tmp_path)
    plan = _plan(tmp_path, **fields)
    world = fields.get("dp", 1) * fields.get("tp", 1) * fields.get("cp", 1) * fields.get("pp", 1)
    for cmd in (["execute"], ["compare", "--cluster", f"cpu:{world}"]):
        code, out, err = run(capsys, *cmd, "--model", model, "--plan", plan)
        assert code == 2 and out == "" and needle in err and len(err.splitlines()) == 1
    assert [p.name for p in tmp_path.iterdir()] == ["plan.json"]


def test_execute_refuses_an_unrun_moe_plan_from_the_library_too(monkeypatch):
    monkeypatch.setattr(subprocess, "Popen", _no_launch)
    moe = ModelSpec("tiny-moe", 2, 64, 4, 128, 512, max_seq_len=128, gated_mlp=True,
                    norm="rmsnorm", position_embedding="rope", num_experts=4, top_k=2,
                    linear_bias=True)
    with pytest.raises(SpecError, match="^model.linear_bias"):  # experts split over ETP
        executor.launch.execute(moe, Plan(global_batch_size=2, seq_len=64, tp=2,
                                          sequence_parallel=True, dtype="fp32"))
