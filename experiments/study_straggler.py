"""Study (d): one straggler node in 128 — GPT-3 175B on 1,024 A100s.

Run: ``.venv/bin/python experiments/study_straggler.py [--batch 1536] [--node 37]``.
Plan in the style of Megatron-LM SC'21 (``experiments/megatron_sc21.py``): TP 8 x PP 16 x
DP 8, micro-batch 1, interleaved 1F1B with 2 virtual stages, full recompute, fp16,
materialised attention, gradient all-reduce after the backward pass. One node (8 GPUs: one
TP group of one pipeline stage of one data-parallel replica) computes 1.0x to 1.5x slower.

* the DES at every factor, reduced to two symmetry classes (the straggler's replica and the
  other seven), and unreduced at 1.0 and at the largest factor (they must agree);
* the analytic tier, which takes each stage at its slowest rank;
* analytic only, a lognormal spread of per-GPU speeds (sigma 0.01 to 0.1, 10 seeds each):
  with 1,024 GPUs the slowest one sets the pace.

The global batch is SC'21's 1,536 sequences (192 micro-batches per replica).
Writes ``experiments/results/study_straggler.csv``, ``study_straggler_spread.csv`` and
``study_straggler.png``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import pandas as pd

from sim import Plan, load_cluster, load_model, simulate
from sim.io import atomic_write_text
from sim.spec.faults import faults_from_options
from trainsim.plots.figures import save_figure

RESULTS = Path(__file__).resolve().parent / "results"
FACTORS = (1.0, 1.1, 1.2, 1.3, 1.4, 1.5)
SIGMAS = (0.01, 0.02, 0.05, 0.1)


def plan(batch: int) -> Plan:
    return Plan(global_batch_size=batch, seq_len=2048, micro_batch_size=1, dp=8, tp=8, pp=16,
                vpp=2, schedule="interleaved-1f1b", recompute="full", dtype="fp16",
                attention="standard", sequence_parallel=False, overlap_grad_reduce=False)


def _row(kind: str, factor: float, r, wall_s: float) -> dict:
    return {"tier": kind, "factor": factor, "iteration_s": r.iteration_time_s,
            "tokens_per_s": r.tokens_per_s, "mfu": r.mfu, "bubble_s": r.breakdown["bubble"],
            "compute_s": r.breakdown["compute"], "dp_s": r.breakdown["dp"],
            "pp_s": r.breakdown["pp"], "reduced": r.simulation.get("reduced"),
            "events": r.simulation.get("events"), "wall_s": wall_s}


def straggler_table(batch: int, node: int, factors: tuple[float, ...]) -> pd.DataFrame:
    model, cluster, p = load_model("gpt3-175b"), load_cluster("dgx-a100:128"), plan(batch)
    rows = []
    for factor in factors:
        faults = faults_from_options([f"node:{node}={factor}"]) if factor != 1.0 else None
        runs = [("analytic", "analytic", True), ("des", "des", True)]
        runs += [("des (unreduced)", "des", False)] if factor in (1.0, max(factors)) else []
        for kind, fidelity, reduce in runs:
            t0 = time.perf_counter()
            r = simulate(model, cluster, p, fidelity, reduce=reduce, faults=faults)
            rows.append(_row(kind, factor, r, time.perf_counter() - t0))
            print(f"{kind:<14} x{factor:.1f}  {r.iteration_time_s:8.4f} s  "
                  f"({rows[-1]['wall_s']:.1f} s wall)", flush=True)
    df = pd.DataFrame(rows)
    healthy = df[df["factor"] == 1.0].set_index("tier")["iteration_s"]
    df["slowdown"] = df["iteration_s"] / df["tier"].map(healthy)
    return df


def spread_table(batch: int, seeds: int = 10) -> pd.DataFrame:
    model, cluster, p = load_model("gpt3-175b"), load_cluster("dgx-a100:128"), plan(batch)
    healthy = simulate(model, cluster, p).iteration_time_s
    rows = []
    for sigma in SIGMAS:
        for seed in range(seeds):
            f = faults_from_options(dists=[f"lognormal:{sigma}"], seed=seed)
            r = simulate(model, cluster, p, faults=f)
            rows.append({"sigma": sigma, "seed": seed, "slowest_gpu": r.simulation["faults"][
                "slowest_gpu_scale"], "slowdown": r.iteration_time_s / healthy})
    return pd.DataFrame(rows)


def plot(df: pd.DataFrame, spread: pd.DataFrame, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 4.5))
    for tier, style in (("des", "-o"), ("analytic", "--s")):
        part = df[df["tier"] == tier]
        ax.plot(part["factor"], part["slowdown"], style, label=f"{tier}")
    ax.plot(FACTORS, FACTORS, ":", color="grey", label="slow-down = factor")
    ax.set_xlabel("compute slow-down of one node (of 128)")
    ax.set_ylabel("iteration time / healthy")
    ax.set_title("GPT-3 175B, TP8 PP16 DP8 on 1,024 A100s")
    means = spread.groupby("sigma")[["slowdown", "slowest_gpu"]].mean()
    bx.plot(means.index, means["slowdown"], "-o", label="iteration slow-down (analytic)")
    bx.plot(means.index, means["slowest_gpu"], ":", label="slowest GPU's factor")
    bx.set_xlabel("per-GPU lognormal sigma (10 seeds, mean)")
    bx.set_ylabel("ratio to healthy")
    for a in (ax, bx):
        a.grid(True, alpha=0.3)
        a.legend()
    fig.tight_layout()
    return save_figure(fig, path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=1536, help="global batch (default 1536)")
    ap.add_argument("--node", type=int, default=37, help="the slow node (default 37: "
                    "stage 4, replica 5)")
    ap.add_argument("--factors", default=",".join(str(f) for f in FACTORS))
    args = ap.parse_args(argv)
    factors = tuple(float(f) for f in args.factors.split(","))
    df = straggler_table(args.batch, args.node, factors)
    spread = spread_table(args.batch)
    RESULTS.mkdir(parents=True, exist_ok=True)
    atomic_write_text(RESULTS / "study_straggler.csv", df.to_csv(index=False))
    atomic_write_text(RESULTS / "study_straggler_spread.csv", spread.to_csv(index=False))
    print(df.to_string(index=False))
    print(spread.groupby("sigma")[["slowest_gpu", "slowdown"]].agg(["mean", "max"]))
    print(f"wrote {plot(df, spread, RESULTS / 'study_straggler.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
