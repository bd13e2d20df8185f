"""The profile-backed cost model: lookups, log-space interpolation, fitted fallback."""

import csv
import dataclasses
import json
import shutil
import statistics
from pathlib import Path

import pytest

from sim import Plan, load_cluster, load_model, simulate
from sim.cost.compute import layer_time
from sim.cost.profile_db import (
    COMPUTE_COLUMNS,
    FIT_COLUMNS,
    INSITU_COLUMNS,
    insitu_overhead,
    segment_time,
)
from sim.cost.profiled import interpolate, load_cost_model
from sim.errors import SpecError
from sim.spec.cluster import cluster_from_dict
from sim.spec.hardware import get_hardware
from sim.spec.model import ModelSpec

CPU = get_hardware("cpu")
SHIPPED = Path(__file__).resolve().parents[1] / "sim" / "data" / "profiles" / "cpu-amd-epyc"
RATE = 5e10  # FLOP/s of the synthetic device


def _write_db(folder, rows, fits=()):
    folder.mkdir(parents=True)
    (folder / "meta.json").write_text(json.dumps({"schema_version": 1, "device": folder.name}))
    with (folder / "compute.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, COMPUTE_COLUMNS)
        w.writeheader()
        for r in rows:
            w.writerow({c: r.get(c, 0) for c in COMPUTE_COLUMNS})
    with (folder / "comm_fit.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, FIT_COLUMNS)
        w.writeheader()
        w.writerows(fits)


def _gemm_rows(grid="g"):
    return [dict(op="gemm", variant="", dtype="fp32", grid=grid, m=m, n=n, k=k,
                 fwd_median_s=2 * m * n * k / RATE, bwd_median_s=4 * m * n * k / RATE)
            for m in (64, 256) for n in (64, 256) for k in (64, 256)]


@pytest.fixture
def db(tmp_path):
    folder = tmp_path / "dev"
    fits = [dict(collective="all_reduce", backend="gloo", fabric="intra", group_size=2,
                 min_size_bytes=1024, max_size_bytes=65536, alpha_s=1e-3, beta_s_per_byte=1e-9,
                 points=3, max_rel_error=0.01),
            dict(collective="all_reduce", backend="gloo", fabric="intra", group_size=2,
                 min_size_bytes=262144, max_size_bytes=2**30, alpha_s=2e-3,
                 beta_s_per_byte=2e-9, points=5, max_rel_error=0.02)]
    _write_db(folder, _gemm_rows() + [dict(op="optimizer", variant="adam", dtype="fp32", grid="g",
                                           m=1000, fwd_median_s=1e-3)], fits)
    return folder


def test_power_laws_interpolate_exactly_in_log_space():
    table = {(m, n): (m * n * 1e-9, 2 * m * n * 1e-9) for m in (10.0, 100.0) for n in (1.0, 8.0)}
    fwd, bwd = interpolate(table, (31.6227766, 2.0))
    assert fwd == pytest.approx(31.6227766 * 2 * 1e-9) and bwd == pytest.approx(2 * fwd)
    assert interpolate(table, (5.0, 2.0)) is None  # outside the grid


def test_exact_interpolated_and_extrapolated_gemms(db):
    cm = load_cost_model(db, CPU)
    assert cm.gemm(64, 256, 64, "fp32") == (2 * 64 * 256 * 64 / RATE, 4 * 64 * 256 * 64 / RATE)
    fwd, _ = cm.gemm(128, 128, 128, "fp32")  # inside: power law, so exact
    assert fwd == pytest.approx(2 * 128**3 / RATE)
    assert not cm.extrapolated
    big = cm.gemm(1024, 1024, 1024, "fp32")[0]  # outside: roofline fitted to the profile
    assert "gemm 1024x1024x1024 fp32" in cm.extrapolated
    # the fitted roofline reproduces the profiled points in the median
    ratios = sorted(cm.fallback.gemm(r["m"], r["n"], r["k"], "fp32")[0] / r["fwd_median_s"]
                    for r in _gemm_rows())
    assert statistics.median(ratios) == pytest.approx(1.0)
    rate = cm.fallback.gemm_flops["fp32"]
    assert big == pytest.approx(2 * 1024**3 / (rate * cm.fallback.gemm_efficiency(
        1024, 1024, 1024)))


def test_missing_ops_fall_back_and_are_reported(db):
    cm = load_cost_model(db, CPU)
    cm.elementwise("rmsnorm", 128, 256, "fp32")
    cm.attention(4, 128, 128, 64, "fp32", True, False)
    assert {"rmsnorm 128x256 fp32", "attention 4x128x64 fp32"} <= cm.extrapolated
    assert cm.optimizer(1000) == 1e-3


def test_measured_collectives_by_size_range(db):
    cm = load_cost_model(db, CPU)
    assert cm.collective("all_reduce", 2, False, 4096) == pytest.approx(1e-3 + 4096e-9)
    assert cm.collective("all_reduce", 2, False, 2**20) == pytest.approx(2e-3 + 2**21 * 1e-9)
    assert cm.collective("all_gather", 2, False, 4096) is None
    assert "all_gather x2 intra: no profile fit, link model" in cm.extrapolated
    assert segment_time([(1024, 1.0, 0.0)], 10) == 1.0  # below the first range


def test_insitu_overhead_is_the_median_over_sizes_never_negative():
    assert insitu_overhead([]) == 0.0
    assert insitu_overhead([(2.0**16, 1e-3), (2.0**20, 3e-3), (2.0**24, -1e-3)]) == 1e-3
    assert insitu_overhead([(2.0**16, -1e-3), (2.0**20, 2e-4), (2.0**24, -2e-3)]) == 0.0


def test_measured_collectives_add_the_insitu_overhead(db):
    with (db / "comm_insitu.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, INSITU_COLUMNS)
        w.writeheader()
        w.writerow(dict(collective="all_reduce", backend="gloo", fabric="intra", group_size=2,
                        size_bytes=4096, isolated_s=1e-3, insitu_s=1.5e-3, overhead_s=5e-4,
                        burst_s=0.02, repeats=5))
    cm = load_cost_model(db, CPU)
    assert cm.collective("all_reduce", 2, False, 4096) == pytest.approx(1.5e-3 + 4096e-9)
    assert cm.collective("all_reduce", 4, False, 4096) is None  # no fit for 4 ranks


def test_cpu_collectives_do_not_overlap_compute():
    """gloo works on the ranks' own cores: a CPU cluster exposes the whole gradient
    all-reduce; the same plan on GPUs hides it behind the backward pass."""
    cpu = dataclasses.replace(load_cluster("cpu:2"), profile=None)
    cases = [(load_model("llama3-8b"), "dp",  # several gradient buckets
              Plan(global_batch_size=2, seq_len=256, dtype="bf16", dp=2, micro_batch_size=1)),
             (load_model("tiny"), "cp",  # the ring runs before the attention, not beside it
              Plan(global_batch_size=2, seq_len=512, dtype="fp32", cp=2, micro_batch_size=1))]
    for model, group, plan in cases:
        for fidelity in ("analytic", "des"):
            comm = simulate(model, cpu, plan, fidelity=fidelity).communication[group]
            assert comm["overlapped_s"] == pytest.approx(0.0, abs=1e-9), (group, fidelity)
            assert comm["exposed_s"] > 0
    gpu = simulate(load_model("llama3-8b"), load_cluster("dgx-h100:1"),
                   Plan(global_batch_size=16, seq_len=4096, dp=8, micro_batch_size=1))
    assert gpu.communication["dp"]["overlapped_s"] > 0


def test_des_times_tp_collectives_from_the_profile_as_the_analytic_tier():
    """The shipped CPU profile's measured gloo times, not the nominal loopback link."""
    cluster = load_cluster("cpu:2")
    if cluster.profile is None:
        pytest.skip("no shipped profile for this host's CPU model")
    plan = Plan(global_batch_size=8, seq_len=512, dtype="fp32", tp=2, micro_batch_size=4,
                sequence_parallel=True)
    tp = [simulate(load_model("tiny"), cluster, plan, fidelity=f).communication["tp"]
          ["exposed_s"] for f in ("analytic", "des")]
    assert tp[1] == pytest.approx(tp[0], rel=1e-6)


def test_compute_stat_picks_the_rows_median_or_p10(tmp_path):
    folder = tmp_path / "dev"
    _write_db(folder, [dict(op="gemm", variant="", dtype="fp32", grid="g", m=64, n=64, k=64,
                            fwd_median_s=2e-3, fwd_p10_s=1.5e-3, bwd_median_s=4e-3,
                            bwd_p10_s=3e-3)])
    hw = dataclasses.replace(CPU, name="dev")
    assert load_cost_model(folder, hw).gemm(64, 64, 64, "fp32") == (2e-3, 4e-3)
    assert load_cost_model(folder, hw, stat="p10").gemm(64, 64, 64, "fp32") == (1.5e-3, 3e-3)
    with pytest.raises(SpecError, match="compute_stat.*median, p10.*'p50'"):
        load_cost_model(folder, hw, stat="p50")
    c = dataclasses.replace(load_cluster("cpu:1"), profile=str(folder))
    plan = Plan(global_batch_size=1, seq_len=128, dtype="fp32")
    times = [simulate(load_model("tiny"), dataclasses.replace(c, compute_stat=s), plan)
             .iteration_time_s for s in ("median", "p10")]
    assert times[1] < times[0]
    with pytest.raises(SpecError, match="compute_stat"):
        dataclasses.replace(c, compute_stat="mean")


def test_compute_stat_needs_a_profile_and_survives_a_round_trip(db):
    with pytest.raises(SpecError, match="^compute_stat: p10 is a statistic of profiled"):
        dataclasses.replace(load_cluster("dgx-h100:1"), compute_stat="p10")
    c = dataclasses.replace(load_cluster("cpu:1"), profile=str(db), compute_stat="p10")
    assert cluster_from_dict(c.to_dict(), "c").compute_stat == "p10"


def test_p10_reaches_the_layer_correction_and_the_des(tmp_path):
    """Every p10 half its median: the layer correction (a ratio of layer rows to op rows)
    is the same with either statistic, so a whole layer and a DES step take exactly half."""
    folder = tmp_path / "cpu-half"
    shutil.copytree(SHIPPED, folder)
    rows = list(csv.DictReader((folder / "compute.csv").open()))
    for r in rows:
        for d in ("fwd", "bwd"):
            r[f"{d}_p10_s"] = str(float(r[f"{d}_median_s"] or 0) / 2)
    with (folder / "compute.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, COMPUTE_COLUMNS)
        w.writeheader()
        w.writerows(rows)
    hw = dataclasses.replace(CPU, name="cpu-half")
    m = ModelSpec("l", 1, 384, 6, 1024, 1000, num_kv_heads=2, max_seq_len=640,
                  gated_mlp=True, norm="rmsnorm", position_embedding="rope")
    plan = Plan(global_batch_size=1, seq_len=640, dtype="fp32")
    med, p10 = (load_cost_model(folder, hw, grid="preset-cpu", stat=s) for s in ("median", "p10"))
    assert p10.layer_factor(m, plan) == pytest.approx(med.layer_factor(m, plan), rel=1e-9)
    assert not med.extrapolated and not p10.extrapolated
    whole = [layer_time(c, m, plan) for c in (med, p10)]
    assert whole[1].forward == pytest.approx(whole[0].forward / 2, rel=1e-9)
    assert whole[1].backward == pytest.approx(whole[0].backward / 2, rel=1e-9)
    c = dataclasses.replace(load_cluster("cpu:1"), gpu=hw, profile=str(folder))
    des = [simulate(load_model("tiny"), dataclasses.replace(c, compute_stat=s),
                    Plan(global_batch_size=1, seq_len=512, dtype="fp32"), fidelity="des")
           for s in ("median", "p10")]
    assert 0 < des[1].iteration_time_s < des[0].iteration_time_s


def test_calibration_is_kept_per_statistic(db, tmp_path):
    """A calibrated profile is a folder of its own; it scales compute only where it is the
    profile asked for, refining its own factor from predictions made with it."""
    from executor.compare import calibrate

    hw = dataclasses.replace(CPU, name="dev")
    c = dataclasses.replace(load_cluster("cpu:1"), gpu=hw, profile=str(db))
    run = {"model": "tiny", "plan": {}, "measured_s": 2.0, "predicted_s": 1.0}
    cal = tmp_path / "cal" / "dev"
    out = calibrate(dataclasses.replace(c, compute_stat="p10"), [run], cal)
    assert out["compute_stat"] == "p10" and out["compute_scale"] == pytest.approx(2.0)
    assert not (db / "calibration.json").exists()
    data = json.loads((cal / "calibration.json").read_text())
    assert data["compute_scale_p10"] == pytest.approx(2.0) and "compute_scale" not in data
    t = _gemm_rows()[0]["fwd_median_s"]
    assert load_cost_model(db, hw).gemm(64, 64, 64, "fp32")[0] == pytest.approx(t)
    calibrated = dataclasses.replace(c, profile=str(cal))
    assert calibrate(calibrated, [run | {"measured_s": 3.0}])["compute_scale"] == \
        pytest.approx(3.0)  # x3 on top of the x1 its median predictions had
    assert load_cost_model(cal, hw).gemm(64, 64, 64, "fp32")[0] == pytest.approx(3 * t)
    assert load_cost_model(cal, hw).db.calibration == cal / "calibration.json"
    assert calibrate(calibrated, [run])["compute_scale"] == pytest.approx(6.0)
    data = json.loads((cal / "calibration.json").read_text())
    assert data["compute_scale_p10"] == pytest.approx(2.0) and len(data["runs"]) == 3
    (cal / "calibration.json").write_text("[1]")
    with pytest.raises(SpecError, match="not a calibration file"):
        load_cost_model(cal, hw)


def test_a_calibration_json_inside_a_measured_profile_is_ignored(db):
    hw = dataclasses.replace(CPU, name="dev")
    t = _gemm_rows()[0]["fwd_median_s"]
    (db / "calibration.json").write_text(json.dumps({"compute_scale": 5.0}))
    model = load_cost_model(db, hw)
    assert model.gemm(64, 64, 64, "fp32")[0] == pytest.approx(t) and model.db.calibration is None


def test_simulate_reads_the_clusters_profile(db):
    c = dataclasses.replace(load_cluster("cpu:2"), profile=str(db))
    r = simulate(load_model("tiny"), c, Plan(global_batch_size=4, seq_len=128, dp=2,
                                             dtype="fp32"))
    assert r.extrapolated and all(isinstance(e, str) for e in r.extrapolated)
    assert r.communication["dp"]["exposed_s"] + r.communication["dp"]["overlapped_s"] > 0


def test_db_root_or_device_folder(db, tmp_path):
    assert load_cost_model(tmp_path, get_hardware("cpu").__class__(**{
        **dataclasses.asdict(CPU), "name": "dev"})).db.device == "dev"
    with pytest.raises(SpecError, match="not a profile DB for 'cpu-.*devices there: dev"):
        load_cost_model(tmp_path, CPU)


def test_shipped_cpu_profile_is_used_by_the_cpu_preset():
    c = load_cluster("cpu:2")
    if c.profile is None:
        pytest.skip("no profile shipped for this host's CPU model")
    r = simulate(load_model("tiny"), c, Plan(global_batch_size=8, seq_len=256, dp=2,
                                             dtype="fp32"))
    assert r.iteration_time_s > 0


def test_toml_profile_path_is_relative_to_the_file(db, tmp_path):
    (tmp_path / "c.toml").write_text('nodes = 1\ngpus_per_node = 2\ngpu = "cpu"\n'
                                     'profile = "dev"\n[intra_node]\nkind = "loopback"\n')
    c = load_cluster(str(tmp_path / "c.toml"))
    assert c.profile == str(tmp_path / "dev")
