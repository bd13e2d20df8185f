"""Study: selective recomputation by module (``plan.recompute_modules``) on an MoE model.

Run: ``.venv/bin/python experiments/study_recompute_modules.py`` (under a minute).
Qwen3-30B-A3B (48 MoE layers, 128 experts, top-8) on two DGX H100 nodes: EP 8, DP 16,
global batch 256 x 4,096 tokens, micro-batches of 2 sequences, ZeRO-1 (the distributed
optimizer) and ZeRO-2; for each recomputation (none; Megatron-LM's modules alone and together; full)
the peak memory and the iteration time in both tiers. Writes
``experiments/results/study_recompute_modules.csv`` and ``.png``.

What to read: which modules bring a plan under the 80 GB of an H100 and what each costs.
Nothing here is measured: it is the model's account of what each module keeps and re-runs
(``docs/compute/memory.md``).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd
from study_cp_comm import write_study

from sim import Plan, load_cluster, load_model, simulate
from trainsim.plots.figures import save_figure

MODEL, CLUSTER = "qwen3-30b-a3b", "dgx-h100:2"
VARIANTS: tuple[tuple[str, str, tuple[str, ...] | None], ...] = (
    ("none", "none", None),
    ("core_attn", "selective", ("core_attn",)),
    ("layernorm", "selective", ("layernorm",)),
    ("moe_act", "selective", ("moe_act",)),
    ("layernorm + moe_act", "selective", ("layernorm", "moe_act")),
    ("core_attn + layernorm + moe_act", "selective", ("core_attn", "layernorm", "moe_act")),
    ("full", "full", None))


def table() -> pd.DataFrame:
    model, cluster, rows = load_model(MODEL), load_cluster(CLUSTER), []
    for zero in (1, 2):
        for name, mode, mods in VARIANTS:
            plan = Plan(256, 4096, 2, dp=16, ep=8, zero_stage=zero, recompute=mode,
                        recompute_modules=mods)
            a, d = (simulate(model, cluster, plan, fidelity=f) for f in ("analytic", "des"))
            rows.append({"zero_stage": zero, "recompute": name, "analytic_s": a.iteration_time_s,
                         "des_s": d.iteration_time_s,
                         "tiers_pct": 100 * (d.iteration_time_s / a.iteration_time_s - 1),
                         "peak_gib": a.peak_memory_gib, "fits_80gb": bool(a.fits_in_memory),
                         "hardware_tflops": a.hardware_tflops_per_gpu})
    df = pd.DataFrame(rows)
    none = df[df["recompute"] == "none"].set_index("zero_stage")
    df["time_over_none"] = df["analytic_s"] / df["zero_stage"].map(none["analytic_s"])
    df["memory_saved_gib"] = df["zero_stage"].map(none["peak_gib"]) - df["peak_gib"]
    return df


def plot(df: pd.DataFrame, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 5.5))
    markers = dict(zip([v[0] for v in VARIANTS], "osD^vPX", strict=True))
    for (zero, name), part in df.groupby(["zero_stage", "recompute"], sort=False):
        ax.scatter(part["peak_gib"], part["analytic_s"], marker=markers[name],
                   color=f"C{zero - 1}", label=f"ZeRO-{zero}: {name}")
    capacity = load_cluster(CLUSTER).gpu.memory_gib
    ax.axvline(capacity, color="k", ls="--", lw=1, label=f"H100 memory ({capacity:g} GiB)")
    ax.set_xlabel("peak memory per GPU (GiB)")
    ax.set_ylabel("iteration time (s, analytic tier)")
    ax.set_title(f"{MODEL} on 2 x DGX H100, EP 8 x DP 16, micro-batch 2: recomputation by "
                 "module")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    return save_figure(fig, path)


def main() -> int:
    write_study(table(), "study_recompute_modules", plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
