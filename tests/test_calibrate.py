"""trainsim calibrate: the fit recovers what made the runs, refuses what it cannot fix, and
a calibration file applies to the devices it names."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from optimizer.calibrate import Run, calibrate_on_one, fit, leave_one_out, load_runs
from sim import load_cluster, simulate
from sim.errors import SpecError
from sim.spec.calibration import apply_calibration, load_calibration
from sim.spec.plan import Plan
from sim.spec.zoo import load_any
from trainsim.cli import main

MODEL = load_any("llama3-8b")
CLUSTER = load_cluster("dgx-a100:2")
PLANS = [Plan(global_batch_size=b, seq_len=s, dp=dp, tp=16 // dp, micro_batch_size=1)
         for b, s, dp in ((32, 2048, 4), (64, 4096, 2), (16, 8192, 8))]


def _truth(gemm: float) -> list[Run]:
    """Runs 'measured' on a device whose best GEMM efficiency is ``gemm``."""
    dev = dataclasses.replace(CLUSTER.gpu, gemm_eff_max=gemm)
    real = dataclasses.replace(CLUSTER, gpu=dev)
    return [Run(MODEL, CLUSTER, p, simulate(MODEL, real, p).iteration_time_s, f"plan {i}")
            for i, p in enumerate(PLANS)]


def test_the_fit_recovers_the_efficiency_that_made_the_runs() -> None:
    cal = fit(_truth(0.55), factors=("gemm_eff_max",), prior=0.0)
    assert cal["factors"]["gemm_eff_max"] == pytest.approx(0.55, rel=0.01)
    assert all(abs(r["error_after"]) < 0.005 < abs(r["error_before"]) for r in cal["fit"])


def test_one_run_moves_what_it_identifies_and_the_others_follow() -> None:
    runs = _truth(0.6)
    on_one = calibrate_on_one(runs, factors=("gemm_eff_max", "attention_eff"), prior=0.01)
    assert all(r["worst_error"] < 0.05 for r in on_one)
    loo = leave_one_out(runs, factors=("gemm_eff_max",), prior=0.0)
    assert all(abs(r["held_out_error"]) < 0.01 for r in loo)


def test_runs_no_factor_can_explain_are_refused() -> None:
    fast = [dataclasses.replace(r, measured_s=r.measured_s / 10) for r in _truth(0.7)]
    with pytest.raises(SpecError, match="outside"):
        fit(fast, factors=("gemm_eff_max",), prior=0.0)


def test_a_calibration_applies_to_its_device_only(tmp_path: Path) -> None:
    path = tmp_path / "cal.json"
    path.write_text(json.dumps({"schema_version": 1, "device": "a100-sxm4-80gb",
                                "factors": {"gemm_eff_max": 0.5}}))
    cal = load_calibration(path)
    c = apply_calibration(CLUSTER, cal)
    assert c.gpu.gemm_eff_max == 0.5 and "calibrated: cal.json" in c.name
    with pytest.raises(SpecError, match="does not have"):
        apply_calibration(load_cluster("dgx-h100:2"), cal)
    path.write_text(json.dumps({"schema_version": 1, "device": "a100-sxm4-80gb",
                                "factors": {"gemm_eff_max": 1.5}}))
    with pytest.raises(SpecError, match="gemm_eff_max"):
        load_calibration(path)


def _csv(tmp_path: Path, runs: list[Run]) -> Path:
    rows = ["model,cluster,plan,measured_iteration_s,label"]
    for i, r in enumerate(runs):
        (tmp_path / f"p{i}.json").write_text(json.dumps(r.plan.to_dict()))
        rows.append(f"llama3-8b,dgx-a100:2,p{i}.json,{r.measured_s!r},{r.label}")
    path = tmp_path / "runs.csv"
    path.write_text("\n".join(rows) + "\n")
    return path


def test_cli_calibrate_then_simulate_with_it(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    runs = _csv(tmp_path, _truth(0.6))
    assert len(load_runs(runs)) == 3
    out = tmp_path / "cal.json"
    assert main(["calibrate", str(runs), "--out", str(out), "--factors", "gemm_eff_max",
                 "--prior", "0", "--loo"]) == 0
    text = capsys.readouterr().out
    assert "leave-one-out" in text and out.is_file()
    assert main(["simulate", "--model", "llama3-8b", "--cluster", "dgx-a100:2", "--plan",
                 str(tmp_path / "p0.json"), "--calibration", str(out), "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert "calibrated" in res["cluster"]
    assert res["iteration_time_s"] == pytest.approx(_truth(0.6)[0].measured_s, rel=0.01)


def test_bad_runs_are_one_line_errors_and_write_nothing(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    out = tmp_path / "cal.json"
    empty = tmp_path / "e.csv"
    empty.write_text("model,cluster,plan,measured_iteration_s\n")
    assert main(["calibrate", str(empty), "--out", str(out)]) == 2
    bad = _csv(tmp_path, _truth(0.7))
    bad.write_text(bad.read_text().replace(str(_truth(0.7)[0].measured_s), "-1", 1))
    assert main(["calibrate", str(bad), "--out", str(out)]) == 2
    fast = _csv(tmp_path, [dataclasses.replace(r, measured_s=r.measured_s / 10)
                           for r in _truth(0.7)])
    assert main(["calibrate", str(fast), "--out", str(out), "--factors", "gemm_eff_max",
                 "--prior", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and not out.exists()


def test_a_per_layer_fixed_cost_is_recovered_and_may_rest_at_zero() -> None:
    dev = dataclasses.replace(CLUSTER.gpu, layer_overhead_us=300.0)
    real = dataclasses.replace(CLUSTER, gpu=dev)
    runs = [Run(MODEL, CLUSTER, p, simulate(MODEL, real, p).iteration_time_s, f"plan {i}")
            for i, p in enumerate(PLANS)]
    cal = fit(runs, factors=("layer_overhead_us",), prior=0.0)
    assert cal["factors"]["layer_overhead_us"] == pytest.approx(300.0, rel=0.02)
    both = fit(_truth(0.7), factors=("gemm_eff_max", "layer_overhead_us"), prior=0.0)
    assert both["factors"]["layer_overhead_us"] == pytest.approx(0.0, abs=1.0)


_MEG = (" iteration {i:8d}/     100 | consumed samples: {s:12d} | elapsed time per iteration "
        "(ms): {ms} | learning rate: 1.0E-04 | global batch size:    32 | lm loss: 8.0E+00 |\n")
MEGATRON_LOG = "".join(_MEG.format(i=i, s=32 * i, ms=ms)
                       for i, ms in ((10, "9000.0"), (20, "1500.5"), (30, "1499.5")))
TITAN_LOG = ("\x1b[31mstep:  1  \x1b[32mloss: 12.0  \x1b[34mtps: 100  tflops: 1.0  mfu: 1%\n"
             "step: 10  loss:  8.1  grad_norm:  1.2  memory: 30.00GiB(38.00%)  tps: 4,096  "
             "tflops: 300.00  mfu: 30.00%\n"
             "step: 20  loss:  7.9  grad_norm:  1.1  memory: 30.00GiB(38.00%)  tps: 4,096  "
             "tflops: 300.00  mfu: 30.00%\n")


def test_iteration_times_from_training_logs(tmp_path: Path) -> None:
    from optimizer.logs import iteration_s_from_log

    plan = PLANS[0]  # 32 x 2048 tokens on 16 devices
    log = tmp_path / "m.log"
    log.write_text(MEGATRON_LOG)
    assert iteration_s_from_log(log, plan) == pytest.approx(1.5)  # the first left out
    log.write_text(TITAN_LOG)
    assert iteration_s_from_log(log, plan) == pytest.approx(32 * 2048 / 16 / 4096)
    log.write_text("nothing to see\n")
    with pytest.raises(SpecError, match="no iteration-time lines"):
        iteration_s_from_log(log, plan)
    log.write_text(MEGATRON_LOG + TITAN_LOG)
    with pytest.raises(SpecError, match="both"):
        iteration_s_from_log(log, plan)


def test_a_runs_csv_may_name_logs(tmp_path: Path) -> None:
    (tmp_path / "p.json").write_text(json.dumps(PLANS[0].to_dict()))
    (tmp_path / "m.log").write_text(MEGATRON_LOG)
    runs = tmp_path / "runs.csv"
    runs.write_text("model,cluster,plan,log\nllama3-8b,dgx-a100:2,p.json,m.log\n")
    assert load_runs(runs)[0].measured_s == pytest.approx(1.5)
    (tmp_path / "m.log").write_text("no lines\n")
    with pytest.raises(SpecError, match="runs\\[0\\].log"):
        load_runs(runs)


def test_nic_efficiency_moves_inter_node_collectives_in_both_tiers():
    """nic_eff (a calibration factor) is the NICs' achievable share of line rate."""
    import dataclasses

    from sim import Plan, load_cluster, load_model, simulate
    from sim.spec.calibration import apply_calibration

    m, c = load_model("llama3-8b"), load_cluster("dgx-h100:2")
    p = Plan(32, 2048, 1, dp=16, overlap_grad_reduce=False)
    slow = apply_calibration(c, {"device": c.gpu.name, "factors": {"nic_eff": 0.46}})
    assert "calibrated" in slow.name
    for fidelity in ("analytic", "des"):
        fast_dp = simulate(m, c, p, fidelity=fidelity).breakdown["dp"]
        slow_dp = simulate(m, slow, p, fidelity=fidelity).breakdown["dp"]
        assert slow_dp > 1.3 * fast_dp
    one_node = load_cluster("dgx-h100:1")
    q = dataclasses.replace(p, dp=8, global_batch_size=16)
    moved = apply_calibration(one_node, {"device": c.gpu.name, "factors": {"nic_eff": 0.46}})
    assert simulate(m, moved, q).iteration_time_s == simulate(m, one_node, q).iteration_time_s


def test_a_hidden_collective_is_found_and_des_refuses_overlap_share():
    """ZeRO-3 gathers hidden behind compute: their factors have no slope where the fit
    starts; the fit still finds the slower, less hidden communication a run implies."""
    from optimizer.calibrate import Run, fit
    from sim import Plan, load_cluster, load_model, simulate
    from sim.errors import SpecError

    m, c = load_model("llama3-8b"), load_cluster("dgx-a100:4")
    p = Plan(64, 2048, 1, dp=32, zero_stage=3)
    t = simulate(m, c, p).iteration_time_s
    run = Run(m, c, p, 2.0 * t, "slow gathers")
    cal = fit([run], factors=("nic_eff", "comm_overlap"), prior=0.005)
    assert cal["factors"]["nic_eff"] < 0.5
    assert abs(cal["fit"][0]["error_after"]) < 0.05
    with pytest.raises(SpecError, match="analytic tier only"):
        fit([run], factors=("nic_eff", "comm_overlap"), fidelity="des")
