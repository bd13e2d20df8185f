"""The search over synchronisation strategies (optimizer/sync_search.py)."""

from __future__ import annotations

import math

import pytest

from optimizer.sync_search import optimize_sync, sync_candidates
from sim.errors import NoFeasiblePlan, SpecError
from sim.spec.cluster import load_cluster
from sim.spec.plan import Plan
from sim.spec.zoo import load_any

MODEL, CLUSTER = load_any("llama3-8b"), load_cluster("dgx-h100:4")
PLAN = Plan(global_batch_size=256, seq_len=4096, dp=4, tp=8)


def test_candidates_start_with_the_baseline_and_cover_the_kinds() -> None:
    cands = sync_candidates(PLAN, CLUSTER)
    assert cands[0].sync.kind == "bsp" and cands[0].compression.kind == "none"
    kinds = {c.sync.kind for c in cands}
    assert kinds == {"bsp", "asp", "ssp", "backup-workers", "local-sgd", "diloco",
                     "two-stage", "gossip"}
    assert any(c.communication.placement == "colocated" for c in cands)
    assert len({c.to_dict().__repr__() for c in cands}) == len(cands)  # no duplicates


def test_throughput_search_never_returns_worse_than_the_baseline_unsaid() -> None:
    s = optimize_sync(MODEL, CLUSTER, PLAN, "throughput", des_top=2, steps=40)
    assert s.baseline["strategy"] == "bsp over allreduce" and s.baseline["fidelity"] == "des"
    assert s.best["samples_per_s"] >= s.baseline["samples_per_s"] or s.notes
    rates = [r["samples_per_s"] for r in s.rows]
    assert rates[:2] == sorted(rates[:2], reverse=True)


def test_time_to_accuracy_ranks_diverging_strategies_last_and_pareto_is_undominated() -> None:
    s = optimize_sync(MODEL, CLUSTER, PLAN, convergence="digits-cpu", lr=0.4, des_top=1,
                      steps=40)
    times = [r["time_to_target_s"] for r in s.rows]
    ranked = [t for t, r in zip(times, s.rows, strict=True)
              if t is not None and not r["diverges"]]
    assert ranked == sorted(ranked) and s.rows[0]["time_to_target_s"] == ranked[0]
    pts = {r["strategy"]: r for r in s.rows}
    for name in s.pareto:
        a = pts[name]
        assert math.isfinite(a["samples_to_target"])
        assert not any(b["samples_per_s"] > a["samples_per_s"]
                       and b["samples_to_target"] < a["samples_to_target"]
                       for b in s.rows if b["samples_to_target"] not in (None, math.inf))


def test_bad_requests() -> None:
    with pytest.raises(SpecError, match="--convergence"):
        optimize_sync(MODEL, CLUSTER, PLAN)
    with pytest.raises(SpecError, match="--objective"):
        optimize_sync(MODEL, CLUSTER, PLAN, "speed")
    one = Plan(global_batch_size=256, seq_len=4096, dp=1, tp=8, pp=4)
    with pytest.raises(NoFeasiblePlan):
        optimize_sync(MODEL, CLUSTER, one, "throughput")


def test_cli(capsys, tmp_path) -> None:
    from sim.spec.plan import save_plan
    from trainsim.cli import main

    path = tmp_path / "p.json"
    save_plan(PLAN, path)
    assert main(["optimize-sync", "--model", "llama3-8b", "--cluster", "dgx-h100:4", "--plan",
                 str(path), "--objective", "throughput", "--des-top", "0", "--top", "3"]) == 0
    out = capsys.readouterr().out
    assert "baseline bsp over allreduce" in out and out.count("\n") >= 5


def test_joint_search_ranks_strategies_over_several_parallel_plans() -> None:
    from optimizer.sync_joint import optimize_joint

    s = optimize_joint(load_any("tiny"), load_cluster("dgx-h100:2"), 64, 512, "throughput",
                       parallel_top=2, des_top=1, steps=20, workers=1)
    layouts = {r["parallel"] for r in s.rows}
    assert len(layouts) == 2
    labels = [r["strategy"] for r in s.rows]
    assert len(labels) == len(set(labels))  # a plan tried once, however many layouts share it
    fitting = [r["samples_per_s"] for r in s.rows if r["fits_in_memory"]]
    assert s.rows[0]["samples_per_s"] == max(fitting)
    assert s.baseline["parallel_rank"] == 0 and "bsp over allreduce" in s.baseline["strategy"]
    assert s.notes[0].startswith("strategies tried on the 2 fastest BSP parallel plans")


def test_joint_search_bad_requests(capsys) -> None:
    from optimizer.sync_joint import optimize_joint
    from trainsim.cli import main

    with pytest.raises(SpecError, match="--parallel-top"):
        optimize_joint(load_any("tiny"), load_cluster("dgx-h100:2"), 64, 512, "throughput",
                       parallel_top=0)
    with pytest.raises(SpecError, match="transformer spec"):
        optimize_joint(load_any("resnet18"), load_cluster("dgx-h100:2"), 64, 1)
    assert main(["optimize-sync", "--model", "tiny", "--cluster", "dgx-h100:2",
                 "--objective", "throughput"]) == 2
    err = capsys.readouterr().err
    assert "--global-batch-size" in err and err.count("\n") == 1


def test_families_the_runs_do_not_hold_rank_last_without_failing_the_search(tmp_path) -> None:
    """Runs with no two-stage family and only two SGP runs (too few to fit): those
    candidates get no time-to-accuracy and rank after every strategy that has one."""
    import pandas as pd

    from sim.cost.convergence import BUNDLED

    runs = pd.read_csv(BUNDLED / "digits_cpu.csv")
    sgp = runs[runs.gossip_mode == "sgp"].dropna(subset=["updates_to_95"]).head(2)
    keep = runs[(runs.kind != "two-stage") & (runs.gossip_mode != "sgp")]
    path = tmp_path / "runs.csv"
    pd.concat([keep, sgp]).to_csv(path, index=False)
    s = optimize_sync(MODEL, CLUSTER, PLAN, convergence=str(path), lr=0.4, des_top=1,
                      steps=40)
    untimed = [r for r in s.rows if r["time_to_target_s"] is None]
    assert {r["strategy"].split("(")[0] for r in untimed} >= {"two-stage"}
    assert all(r["untimed"] for r in untimed)
    assert any("no time-to-accuracy" in n and "sgp runs reached" in n for n in s.notes)
    assert any("sgp" in r["strategy"] for r in untimed)
    timed = [i for i, r in enumerate(s.rows) if r["time_to_target_s"] is not None
             and not r["diverges"]]
    assert max(timed) < min(i for i, r in enumerate(s.rows) if r["time_to_target_s"] is None)
