"""Study (e): a mixed cluster, 8 DGX A100 nodes + 8 DGX H100 nodes, for llama3-70b.

Run: ``.venv/bin/python experiments/study_mixed_cluster.py [--workers N]``. The optimizer
(``optimizer.search.optimize``, DES for its top plans) on:

* all-A100 (``dgx-a100:16``) and all-H100 (``dgx-h100:16``): the best plan of each;
* the mixed cluster (``dgx-a100:8+dgx-h100:8``, each group with its own NICs and NVLink):
  the best plan under the homogeneous assumption (even layers and micro-batches) and the
  best balanced plan (layers per stage and micro-batches per replica by speed), both
  simulated on the mixed cluster;
* the all-A100 cluster's best plan run unchanged on the mixed cluster (planned as if every
  GPU were an A100).

Batch 256 x 4096 tokens (1M tokens, as study (c)). The searches hold ZeRO at 0-1
(plans Megatron-LM can run, ``--max-zero 1``): micro-batch balancing needs replicas that
meet only in the gradient reduction, ZeRO-3's cost model is not calibrated
(docs/compute/analytic.md, known limits), and the DES of a ZeRO-3 plan whose replicas differ
in speed runs unreduced, every layer's gathers over 128 devices, for many minutes per plan
on this machine. Writes
``experiments/results/study_mixed_cluster.csv`` and ``.png``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from optimizer.constraints import Constraints
from optimizer.report import plan_label
from optimizer.scoring import Candidate, SearchReport
from optimizer.search import optimize
from optimizer.space import SearchSpace
from sim import load_cluster, load_model, simulate
from sim.io import atomic_write_text
from sim.spec.plan import Plan
from trainsim.plots.figures import save_figure

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "experiments" / "results"
MODEL, GBS, SEQ = "llama3-70b", 256, 4096
A100, H100, MIXED = "dgx-a100:16", "dgx-h100:16", "dgx-a100:8+dgx-h100:8"


def _row(case: str, cluster: str, plan: Plan) -> dict:
    model, c = load_model(MODEL), load_cluster(cluster)
    des, ana = simulate(model, c, plan, "des"), simulate(model, c, plan)
    return {"case": case, "cluster": cluster, "plan": plan_label(plan),
            "des_s": des.iteration_time_s, "analytic_s": ana.iteration_time_s,
            "tokens_per_s": des.tokens_per_s, "mfu": des.mfu,
            "peak_gib": des.peak_memory_gib, "fits_in_memory": des.fits_in_memory,
            "des_reduced": des.simulation.get("reduced"), "plan_json": plan.to_dict()}


def _best(cluster: str, top: int, workers: int | None, max_zero: int
          ) -> tuple[Candidate, SearchReport]:
    model, c = load_model(MODEL), load_cluster(cluster)
    space = SearchSpace(model, c, GBS, SEQ, constraints=Constraints(max_zero_stage=max_zero))
    rep = optimize(model, c, GBS, SEQ, top_k=top, workers=workers, progress=True, space=space)
    return rep.best, rep


def table(top: int, workers: int | None, max_zero: int) -> pd.DataFrame:
    a100, _ = _best(A100, top, workers, max_zero)
    h100, _ = _best(H100, top, workers, max_zero)
    _, mixed = _best(MIXED, top, workers, max_zero)
    assert mixed.homogeneous is not None and mixed.balanced is not None
    rows = [_row("all-A100", A100, a100.plan), _row("all-H100", H100, h100.plan),
            _row("mixed, A100 plan", MIXED, a100.plan),
            _row("mixed, homogeneous assumption", MIXED, mixed.homogeneous.plan),
            _row("mixed, balanced", MIXED, mixed.balanced.plan)]
    df = pd.DataFrame(rows)
    df["speedup_vs_all_A100"] = df["tokens_per_s"] / df.loc[0, "tokens_per_s"]
    return df


def plot(df: pd.DataFrame, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 4.5))
    colours = ["#888888", "#444444", "#d98c3f", "#c0504d", "#4f81bd"]
    bars = ax.barh(df["case"][::-1], df["tokens_per_s"][::-1] / 1e3, color=colours[::-1])
    for bar, (_, r) in zip(bars, df[::-1].iterrows(), strict=True):
        ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2,
                f" {r['des_s']:.2f} s  {r['plan'][:48]}", va="center", fontsize=7)
    ideal = (df.loc[0, "tokens_per_s"] + df.loc[1, "tokens_per_s"]) / 2e3
    ax.axvline(ideal, color="k", ls="--", lw=1)
    ax.text(ideal, -0.6, " half A100 + half H100", fontsize=7, va="bottom")
    ax.set_xlabel("thousand tokens/s (DES)")
    ax.set_xlim(0, df["tokens_per_s"].max() / 1e3 * 1.9)
    ax.grid(True, axis="x", alpha=0.3)
    ax.set_title(f"{MODEL}, batch {GBS} x {SEQ}: 8 DGX A100 + 8 DGX H100 nodes")
    fig.tight_layout()
    return save_figure(fig, path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, help="processes (default: all cores)")
    parser.add_argument("--top", type=int, default=3, help="plans the DES simulates per search")
    parser.add_argument("--max-zero", type=int, default=1, help="highest ZeRO stage searched")
    args = parser.parse_args()
    df = table(args.top, args.workers, args.max_zero)
    csv = RESULTS / "study_mixed_cluster.csv"
    atomic_write_text(csv, df.to_csv(index=False, float_format="%.5g"))
    png = plot(df, RESULTS / "study_mixed_cluster.png")
    with pd.option_context("display.width", 200, "display.max_colwidth", 70):
        print(df.drop(columns="plan_json").round(4).to_string(index=False))
    print(f"wrote {csv}, {png}", file=sys.stderr)


if __name__ == "__main__":
    main()
