"""Study (c): fat-tree vs rail-optimized network vs an oversubscribed spine.

Run: ``.venv/bin/python experiments/study_topology.py [--workers N]``. llama3-70b on 32 DGX
H100 nodes (256 GPUs) in pods of 8 nodes (``pod_gpus = 64``, full bisection inside a pod);
between pods the spine is non-blocking (1:1) or oversubscribed 2:1, 4:1 or 8:1, on a
fat-tree (a switch per pod, one core) or a rail-optimized network (a switch per rail and
pod, spines between rails). Two plans: tp8 with pure data parallelism across all 32 nodes
(ZeRO-1), and tp8 pp4 (pipeline stages on consecutive nodes, dp8). Each point is
simulated with the DES (which routes flows over the topology) and with the analytic tier
(which knows only pods and the oversubscription). One sweep
(``optimizer/sweep/run.py``, resumable under ``runs/studies/``); writes
``experiments/results/study_topology.csv`` and ``.png``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from optimizer.sweep.grid import SweepSpec
from optimizer.sweep.run import run_sweep
from sim.io import atomic_write_text
from trainsim.plots.figures import save_figure

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "experiments" / "results"
OVERSUB = (1.0, 2.0, 4.0, 8.0)
SPEC = SweepSpec(
    "llama3-70b", "dgx-h100:32",
    fixed=(("global_batch_size", 256), ("seq_len", 4096), ("tp", 8), ("zero_stage", 1),
           ("recompute", "full"), ("inter_node.pod_gpus", 64)),
    axes=(("inter_node.topology", ("fat-tree", "rail-optimized")),
          ("inter_node.oversubscription", OVERSUB), ("pp", (1, 4)),
          ("fidelity", ("analytic", "des"))))


def table(workers: int | None) -> pd.DataFrame:
    out = run_sweep(SPEC, ROOT / "runs" / "studies" / "topology", workers=workers)
    rows = []
    for r in out.rows:
        if r["status"] != "ok":
            continue
        p = r["params"]
        rows.append({"topology": p["inter_node.topology"],
                     "oversubscription": p["inter_node.oversubscription"], "pp": p["pp"],
                     "fidelity": p["fidelity"], "plan": r["plan"],
                     "iteration_s": r["iteration_time_s"], "mfu": r["mfu"],
                     "dp_exposed_s": r["breakdown"]["dp"], "pp_exposed_s": r["breakdown"]["pp"],
                     "fits_in_memory": r["fits_in_memory"]})
    df = pd.DataFrame(rows)
    key = ["topology", "pp", "fidelity"]
    full = df[df["oversubscription"] == 1.0].set_index(key)["iteration_s"]
    df["slowdown_vs_1to1"] = [t / full[tuple(k)] for t, k in
                              zip(df["iteration_s"], df[key].values, strict=True)]
    return df


def plot(df: pd.DataFrame, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    for ax, (_pp, part) in zip(axes, df.groupby("pp"), strict=True):
        for (topo, fid), line in part.groupby(["topology", "fidelity"]):
            ax.plot(line["oversubscription"], line["iteration_s"],
                    "-o" if fid == "des" else ":x", label=f"{topo} ({fid})")
        ax.set_xscale("log", base=2)
        ax.set_xticks(OVERSUB, [f"{o:g}:1" for o in OVERSUB])
        ax.minorticks_off()
        ax.set_title(f"{part['plan'].iloc[0]}")
        ax.set_xlabel("spine oversubscription above 8-node pods")
        ax.grid(True, alpha=0.3)
    axes[0].set_ylabel("iteration time (s)")
    axes[0].legend(fontsize=8)
    fig.suptitle("llama3-70b on 32 x DGX H100: network topology and oversubscription")
    fig.tight_layout()
    return save_figure(fig, path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, help="processes (default: all cores)")
    args = parser.parse_args()
    df = table(args.workers)
    csv = RESULTS / "study_topology.csv"
    atomic_write_text(csv, df.to_csv(index=False, float_format="%.5g"))
    png = plot(df, RESULTS / "study_topology.png")
    with pd.option_context("display.width", 200, "display.max_colwidth", 50):
        print(df.round(4).to_string(index=False))
    print(f"wrote {csv}, {png}", file=sys.stderr)


if __name__ == "__main__":
    main()
