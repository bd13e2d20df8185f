"""Study: context parallelism's three exchanges (``plan.cp_comm``) for long sequences.

Run: ``.venv/bin/python experiments/study_cp_comm.py`` (a few seconds). llama3-8b (32
query heads, 8 key/value heads) on DGX H100 nodes, full recomputation, the distributed
optimizer (ZeRO-1), 4 micro-batches of one sequence a replica, at 32k and 128k tokens, CP 2
to 16 (16 spans two nodes) with the data-parallel replicas filling a node (at least 2), TP
1: the K/V ring (``p2p``), the K/V all-gather and Ulysses' all-to-all (``a2a``, where the 8
key/value heads split over CP: up to CP 8), each in both tiers.
Writes ``experiments/results/study_cp_comm.csv`` and ``.png``.

What to read: inside a node the ring hides behind the attention core and is the fastest;
the all-gather and the all-to-all are exposed, the all-to-all moving less from CP 4. At
CP 16 over two nodes the ring's hops leave the node through one NIC each: at 32k tokens
the core no longer hides them and the all-gather (every NIC) is faster; at 128k it hides
them again. Nothing here is measured: it is the model's account of what each exchange
costs (``docs/compute/analytic.md``).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

import pandas as pd

from sim import Plan, load_cluster, load_model, simulate
from sim.errors import SpecError
from sim.io import atomic_write_text
from trainsim.plots.figures import save_figure

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "experiments" / "results"
MODEL = "llama3-8b"
SEQS = (32768, 131072)
CPS = (2, 4, 8, 16)
COMMS = ("p2p", "allgather", "a2a")
MICRO = 4


def _row(model, seq: int, cp: int, comm: str) -> dict[str, object] | None:
    dp = max(2, 8 // cp)
    cluster = load_cluster(f"dgx-h100:{cp * dp // 8}")
    plan = Plan(dp * MICRO, seq, 1, dp=dp, cp=cp, cp_comm=comm, recompute="full",
                zero_stage=1)
    try:
        a, d = (simulate(model, cluster, plan, fidelity=f) for f in ("analytic", "des"))
    except SpecError as e:  # Ulysses where the key/value heads do not split over cp
        print(f"  seq {seq} cp {cp} {comm}: {e}", file=sys.stderr)
        return None
    return {"seq_len": seq, "cp": cp, "cp_comm": comm, "dp": dp, "gpus": cluster.world_size,
            "analytic_s": a.iteration_time_s, "des_s": d.iteration_time_s,
            "tiers_pct": 100 * (d.iteration_time_s / a.iteration_time_s - 1),
            "cp_exposed_s": a.communication["cp"]["exposed_s"],
            "cp_hidden_s": a.communication["cp"]["overlapped_s"],
            "des_cp_exposed_s": d.communication["cp"]["exposed_s"],
            "peak_gib": a.peak_memory_gib, "fits": bool(a.fits_in_memory)}


def table() -> pd.DataFrame:
    model, rows = load_model(MODEL), []
    for seq in SEQS:
        for cp in CPS:
            t0 = time.perf_counter()
            rows += [r for r in (_row(model, seq, cp, c) for c in COMMS) if r is not None]
            print(f"seq {seq} cp {cp}: {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    df = pd.DataFrame(rows)
    ring = df[df["cp_comm"] == "p2p"].set_index(["seq_len", "cp"])
    df["over_ring"] = [r.analytic_s / ring["analytic_s"][(r.seq_len, r.cp)]
                       for r in df.itertuples()]
    df["des_over_ring"] = [r.des_s / ring["des_s"][(r.seq_len, r.cp)] for r in df.itertuples()]
    return df


def plot(df: pd.DataFrame, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(SEQS), figsize=(12, 4.5))
    for ax, (seq, part) in zip(axes, df.groupby("seq_len"), strict=True):
        for comm, line in part.groupby("cp_comm", sort=False):
            ax.plot(line["cp"], line["over_ring"], "-o", label=f"{comm} (analytic)")
            ax.plot(line["cp"], line["des_over_ring"], "x", color=ax.lines[-1].get_color(),
                    label=f"{comm} (DES)")
        ax.set_xscale("log", base=2)
        ax.set_xticks(CPS, [str(c) for c in CPS])
        ax.minorticks_off()
        ax.set_xlabel("context-parallel degree (cp)")
        ax.set_ylabel("iteration time / the ring's (p2p) time")
        ax.set_title(f"sequence {seq // 1024}k tokens")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"{MODEL}, DGX H100, {MICRO} micro-batches a replica, full recompute, "
                 "ZeRO-1: context-parallel exchanges")
    fig.tight_layout()
    return save_figure(fig, path)


def write_study(df: pd.DataFrame, name: str, plot: Callable[[pd.DataFrame, Path], Path]
                ) -> None:
    """A two-tier study's table and figure under ``experiments/results/``, and the table
    and the largest difference between the tiers (its ``tiers_pct``) printed."""
    csv = RESULTS / f"{name}.csv"
    atomic_write_text(csv, df.to_csv(index=False, float_format="%.5g"))
    png = plot(df, RESULTS / f"{name}.png")
    with pd.option_context("display.width", 200):
        print(df.round(3).to_string(index=False))
    print(f"largest tier difference: {df['tiers_pct'].abs().max():.2f}%")
    print(f"wrote {csv}, {png}", file=sys.stderr)


def main() -> int:
    write_study(table(), "study_cp_comm", plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
