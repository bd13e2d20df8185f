"""Study (a): weak scaling of GPT models from 1.7B to 1T parameters on A100 clusters.

Run: ``.venv/bin/python experiments/study_weak_scaling.py [--fidelity analytic|des|both]``.
The model size and the GPU count grow together, with the plans of Megatron-LM SC'21
Table 1 (32 to 3,072 A100s; the inputs and their assumptions are in
``experiments/megatron_sc21.py``). For each row it predicts the iteration time, TFLOP/s per
GPU, the share of peak, the aggregate PFLOP/s and the weak-scaling efficiency (TFLOP/s per
GPU relative to the 32-GPU row), next to the published figures, and where the time goes.
Writes ``experiments/results/study_weak_scaling.csv`` and ``.png``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))

from megatron_sc21 import eq3_flops, load_rows, row_cluster, row_model, row_plan  # noqa: E402

from sim.api import simulate
from sim.io import atomic_write_text  # noqa: E402
from trainsim.plots.figures import save_figure  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
A100_PEAK_TFLOPS = 312.0


def study(fidelities: list[str]) -> pd.DataFrame:
    rows = []
    for row in load_rows():
        model, cluster, plan = row_model(row), row_cluster(row), row_plan(row)
        for fidelity in fidelities:
            r = simulate(model, cluster, plan, fidelity)
            tflops = eq3_flops(row) / r.iteration_time_s / cluster.world_size / 1e12
            rows.append({
                "params_B": float(row["params_B"]), "gpus": cluster.world_size,
                "tp": plan.tp, "pp": plan.pp, "dp": plan.dp, "fidelity": fidelity,
                "iteration_s": r.iteration_time_s, "tflops_per_gpu": tflops,
                "pct_peak": 100 * tflops / A100_PEAK_TFLOPS,
                "aggregate_pflops": tflops * cluster.world_size / 1e3,
                "published_tflops_per_gpu": float(row["tflops_per_gpu"]),
                "bubble_fraction": r.bubble_fraction, "peak_memory_gib": r.peak_memory_gib,
                **{f"{k}_share": v / r.iteration_time_s for k, v in r.breakdown.items()}})
    df = pd.DataFrame(rows)
    first = df.groupby("fidelity")["tflops_per_gpu"].transform("first")
    df["weak_scaling_efficiency"] = df["tflops_per_gpu"] / first
    return df


def plot(df: pd.DataFrame, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(13, 4.8))
    for fidelity, part in df.groupby("fidelity"):
        ax.plot(part["gpus"], part["tflops_per_gpu"], marker="o", label=f"predicted ({fidelity})")
    first = df[df["fidelity"] == df["fidelity"].iloc[0]]
    ax.plot(first["gpus"], first["published_tflops_per_gpu"], "k--s", label="published (SC'21)")
    for _, r in first.iterrows():
        ax.annotate(f"{r['params_B']:g}B", (r["gpus"], r["tflops_per_gpu"]), fontsize=7,
                    textcoords="offset points", xytext=(0, 6), ha="center")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("A100 GPUs (model grows with them)")
    ax.set_ylabel("TFLOP/s per GPU")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    kinds = [c[:-6] for c in first.columns if c.endswith("_share")]
    left = [0.0] * len(first)
    labels = [f"{p:g}B/{g}" for p, g in zip(first["params_B"], first["gpus"], strict=True)]
    for kind in kinds:
        share = list(100 * first[f"{kind}_share"])
        bx.barh(labels, share, left=left, label=kind)
        left = [a + b for a, b in zip(left, share, strict=True)]
    bx.set_xlabel(f"share of iteration time (%), {first['fidelity'].iloc[0]}")
    bx.invert_yaxis()
    bx.legend(ncol=4, fontsize=7, loc="lower center", bbox_to_anchor=(0.5, 1.0))
    fig.tight_layout()
    return save_figure(fig, path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fidelity", choices=["analytic", "des", "both"], default="both")
    args = parser.parse_args()
    fidelities = ["analytic", "des"] if args.fidelity == "both" else [args.fidelity]
    df = study(fidelities)
    csv = RESULTS / "study_weak_scaling.csv"
    atomic_write_text(csv, df.to_csv(index=False, float_format="%.5g"))
    png = plot(df, RESULTS / "study_weak_scaling.png")
    cols = ["params_B", "gpus", "fidelity", "iteration_s", "tflops_per_gpu", "pct_peak",
            "published_tflops_per_gpu", "aggregate_pflops", "weak_scaling_efficiency",
            "bubble_fraction"]
    with pd.option_context("display.width", 200):
        print(df[cols].round(3).to_string(index=False))
    print(f"wrote {csv}, {png}")


if __name__ == "__main__":
    main()
