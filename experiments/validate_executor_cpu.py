"""Closed loop on this machine: the executor suite run for real vs the simulator.

Run: ``.venv/bin/python experiments/validate_executor_cpu.py [--db DIR] [--rounds R]``.

1. Profiles this machine unless ``--db`` names a profile of it, into
   ``runs/executor-profile``: ``trainsim profile comm --nproc 2`` up to 64 MiB first, then
   the compute profile of ``tiny`` (``trainsim profile compute --model tiny``, one thread, the
   other core kept busy as in a two-rank run) and the TP plans' whole layers and output
   heads run over two ranks as the executor runs them (``trainsim profile tp``; not with
   ``--no-tp-rows``) and FSDP2's cost around ZeRO-3's collectives (``trainsim profile
   fsdp``; not with ``--no-fsdp-rows``) **once per round, just before that round's
   runs**. Each shape keeps its median pass over the rounds (``profiler.compute.
   merge_passes``). A shared VM's speed wanders by more than the targets within minutes;
   interleaved, the profile and the runs it predicts sample the same minutes.
2. Runs the eight two-rank plans of :func:`executor.suite.suite_plans` on ``cpu:2`` with
   torchrun + gloo, ``--rounds`` times each, round-robin (so slow spells of a shared host
   hit all plans alike); the measured iteration time of a plan is the median over every
   timed step of every round.
3. Predicts each plan with both simulator tiers from that profile (no calibration) and
   compares: |error| median and worst, Spearman rank correlation of the plans, and the
   collectives rank 0 issued vs those the simulator expects (kinds and counts exact, bytes
   within 5%).
4. Reports how repeatable the measurement itself is on this machine: for each plan, the
   spread of its per-round medians, (max - min) / median in percent. A prediction cannot be
   expected to land closer than the measurement repeats.

Writes ``experiments/results/executor_cpu.csv``.
"""

from __future__ import annotations

import argparse
import dataclasses
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pandas as pd

from executor.launch import execute
from executor.suite import suite_plans
from profiler.compute import merge_passes
from profiler.db import device_dir
from profiler.device import device_name
from sim.api import simulate
from sim.io import atomic_write_text
from sim.layout.inventory import compare_inventory, expected_collectives
from sim.spec.cluster import ClusterSpec, load_cluster
from sim.spec.plan import Plan
from sim.spec.zoo import load_model

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "experiments" / "results" / "executor_cpu.csv"
TRAINSIM = [str(Path(sys.executable).with_name("trainsim"))]


def profile(args: list[str], db: Path) -> None:
    subprocess.run([*TRAINSIM, "profile", *args, "--db", str(db)], check=True, cwd=ROOT)


def profile_comm(db: Path) -> None:
    # a size range fitted worse than 25% is stored flagged (and warned about) rather than
    # ending the run: run 2 of 2026-12-05 stopped here on all_gather at 16-64 MiB, sizes
    # the suite's plans never send
    profile(["comm", "--nproc", "2", "--max-bytes", str(64 << 20), "--rounds", "5",
             "--accept-poor-fit"], db)


def profile_compute_pass(db: Path, r: int, tp_rows: bool = True, fsdp_rows: bool = True
                         ) -> Path:
    """One pass of the ``tiny`` compute profile into its own DB; its device folder."""
    root = db / "passes" / f"round-{r + 1}"
    shutil.rmtree(root, ignore_errors=True)
    profile(["compute", "--model", "tiny"], root)
    if tp_rows:  # the TP plans' layers and heads as they run over two ranks
        profile(["tp", "--model", "tiny", "--tp", "2", "--micro-batch", "4", "--seq-len",
                 "512", "--sp", "both"], root)
    if fsdp_rows:  # FSDP2's cost around ZeRO-3's collectives, over two ranks
        profile(["fsdp", "--dp", "2"], root)
    return device_dir(root, device_name("cpu"))


def spearman(a: pd.Series, b: pd.Series) -> float:
    return float(a.rank().corr(b.rank()))


def _args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", help="profile DB of this machine (default: profile it now)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--no-tp-rows", action="store_true", help="do not profile whole TP "
                    "layers over two ranks (trainsim profile tp) before each round")
    ap.add_argument("--no-fsdp-rows", action="store_true", help="do not profile FSDP2 "
                    "units over two ranks (trainsim profile fsdp) before each round")
    ap.add_argument("--repredict", action="store_true", help="keep the measured columns of "
                    f"{OUT.name} and predict again with the current simulator (after a "
                    "model change; needs --db, the profile that run used)")
    return ap.parse_args()


def repredict(db: str) -> None:
    """Predict the measured rows of the last run again with the current simulator."""
    old = pd.read_csv(OUT)
    cluster = dataclasses.replace(load_cluster("cpu:2"), profile=db)
    plans = suite_plans()
    for i, name in enumerate(old["plan"]):
        for fidelity in ("analytic", "des"):
            t = simulate(load_model("tiny"), cluster, plans[name],
                         fidelity=fidelity).iteration_time_s
            old.loc[i, f"{fidelity}_s"] = t
            old.loc[i, f"{fidelity}_error_pct"] = 100 * (t / old.loc[i, "measured_s"] - 1)
    report(old)


def measure(args: argparse.Namespace, db: Path, plans: dict[str, Plan]
            ) -> tuple[dict[str, list[float]], dict[str, list[float]], dict[str, dict]]:
    """Run every plan ``args.rounds`` times (profiling one compute pass before each round
    without ``--db``): (step times, per-round medians, one run's result) per plan."""
    model = load_model("tiny")
    passes: list[Path] = []
    steps: dict[str, list[float]] = {k: [] for k in plans}
    per_round: dict[str, list[float]] = {k: [] for k in plans}
    runs: dict[str, dict] = {}
    for r in range(args.rounds):
        if not args.db:
            passes.append(profile_compute_pass(db, r, not args.no_tp_rows,
                                               not args.no_fsdp_rows))
        for name, plan in plans.items():
            t0 = time.time()
            res = execute(model, plan, steps=args.steps, warmup=args.warmup)
            steps[name] += res["step_s"][args.warmup:]
            per_round[name].append(res["iteration_s"])
            runs.setdefault(name, res)
            print(f"round {r + 1} {name:14s} {res['iteration_s']:.3f} s "
                  f"(wall {time.time() - t0:.0f} s)", flush=True)
    if passes:
        shapes = merge_passes(passes, db / passes[0].name)
        print(f"profiled {shapes} shapes in {len(passes)} passes, one before each round, "
              f"into {db / passes[0].name}")
    return steps, per_round, runs


def _row(name: str, plan: Plan, cluster: ClusterSpec, steps: list[float],
         rounds: list[float], run: dict) -> dict[str, Any]:
    """One plan's measured and predicted figures and its collective inventory check."""
    model = load_model("tiny")
    measured = statistics.median(steps)
    inv = compare_inventory(expected_collectives(model, plan, 0), run["collectives"]["0"])
    row = {"plan": name, "measured_s": measured, "measured_min_s": min(steps),
           "measured_max_s": max(steps),
           "round_medians_s": " ".join(f"{t:.3f}" for t in rounds),
           "round_spread_pct": 100 * (max(rounds) - min(rounds)) / measured}
    for fidelity in ("analytic", "des"):
        pred = simulate(model, cluster, plan, fidelity=fidelity)
        row[f"{fidelity}_s"] = pred.iteration_time_s
        row[f"{fidelity}_error_pct"] = 100 * (pred.iteration_time_s - measured) / measured
    row.update(loss_first=run["loss"][0], loss_last=run["loss"][-1],
               predicted_peak_gib=pred.peak_memory_gib,
               measured_peak_gib=max(run["peak_bytes"]) / 2**30,
               collectives_match=all(i["match"] for i in inv),
               collectives="; ".join(f"{i['group']} {i['kind']} {i['measured_count']}/"
                                     f"{i['expected_count']}" for i in inv))
    return row


def main() -> None:
    args = _args()
    if args.repredict:
        if not args.db:
            raise SystemExit("--repredict needs --db (the profile the measured run used)")
        repredict(args.db)
        return
    db = Path(args.db) if args.db else ROOT / "runs" / "executor-profile"
    if not args.db:
        shutil.rmtree(db, ignore_errors=True)
        profile_comm(db)
    cluster = dataclasses.replace(load_cluster("cpu:2"), profile=str(db))
    plans = suite_plans()
    steps, per_round, runs = measure(args, db, plans)
    report(pd.DataFrame([_row(name, plan, cluster, steps[name], per_round[name], runs[name])
                         for name, plan in plans.items()]))


def report(df: pd.DataFrame) -> None:
    """Write the table and print its summary."""
    atomic_write_text(OUT, df.to_csv(index=False, float_format="%.4g"))
    print(df.drop(columns=["collectives", "round_medians_s"]).round(3).to_string(index=False))
    for fidelity in ("analytic", "des"):
        err = df[f"{fidelity}_error_pct"].abs()
        print(f"{fidelity}: median |error| {err.median():.1f}%, worst {err.max():.1f}% "
              f"({df.loc[err.idxmax(), 'plan']}); Spearman "
              f"{spearman(df[f'{fidelity}_s'], df['measured_s']):.2f}")
    print(f"collectives match on {int(df['collectives_match'].sum())} of {len(df)} plans")
    spread = df["round_spread_pct"]
    print(f"repeatability of the measurement (spread of a plan's per-round medians): median "
          f"{spread.median():.1f}%, worst {spread.max():.1f}% ({df.loc[spread.idxmax(), 'plan']})")


if __name__ == "__main__":
    main()
