"""Study (b): NIC bandwidth from 100 to 800 Gb/s for llama3-70b on 16 DGX H100 nodes.

Run: ``.venv/bin/python experiments/study_nic_bandwidth.py [--workers N]``. Two sweeps
(``optimizer/sweep/run.py``, resumable, run folders under ``runs/studies/``):

* fixed plans — tp 4 or 8 x pp 1 or 4 (dp fills the 128 GPUs), ZeRO-1, full recompute,
  1F1B — at 100, 200, 400 and 800 Gb/s per NIC, simulated with the DES;
* the optimizer's best plan at each NIC rate (its DES time).

Batch 512 x 8192 tokens (4M tokens, as ``make demo``). Writes
``experiments/results/study_nic_bandwidth.csv`` and ``.png``.
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
RUNS = ROOT / "runs" / "studies"
NICS = (100, 200, 400, 800)
BASE = (("global_batch_size", 512), ("seq_len", 8192))
FIXED = SweepSpec("llama3-70b", "dgx-h100:16", fidelity="des",
                  fixed=BASE + (("zero_stage", 1), ("recompute", "full")),
                  axes=(("inter_node.nic_Gbps", NICS), ("tp", (4, 8)), ("pp", (1, 4))))
BEST = SweepSpec("llama3-70b", "dgx-h100:16", fidelity="des", fixed=BASE,
                 axes=(("inter_node.nic_Gbps", NICS),), optimize=True, top_k=4)


def table(workers: int | None) -> pd.DataFrame:
    rows = []
    for name, spec in (("fixed", FIXED), ("optimized", BEST)):
        out = run_sweep(spec, RUNS / f"nic_{name}", workers=workers, progress=True)
        for r in out.rows:
            if r["status"] != "ok":
                continue
            rows.append({"nic_Gbps": r["params"]["inter_node.nic_Gbps"],
                         "series": "optimized" if spec.optimize else
                         f"tp{r['params']['tp']} pp{r['params']['pp']}",
                         "plan": r["plan"], "iteration_s": r["iteration_time_s"],
                         "tokens_per_s": r["tokens_per_s"], "mfu": r["mfu"],
                         "fits_in_memory": r["fits_in_memory"],
                         "dp_exposed_s": r["breakdown"]["dp"],
                         "pp_exposed_s": r["breakdown"]["pp"],
                         "tp_exposed_s": r["breakdown"]["tp"]})
    df = pd.DataFrame(rows)
    at_100 = df[df["nic_Gbps"] == NICS[0]].set_index("series")["iteration_s"]
    df["speedup_vs_100G"] = df["series"].map(at_100) / df["iteration_s"]
    return df


def plot(df: pd.DataFrame, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 4.5))
    for series, part in df.groupby("series", sort=False):
        style = "k-o" if series == "optimized" else "-o"
        label = f"{series}{'' if part['fits_in_memory'].all() else ' (does not fit)'}"
        ax.plot(part["nic_Gbps"], part["tokens_per_s"] / 1e3, style, label=label)
        bx.plot(part["nic_Gbps"], part["dp_exposed_s"] + part["pp_exposed_s"], style,
                label=series)
    for a, ylabel in ((ax, "thousand tokens/s"), (bx, "exposed DP + PP communication (s)")):
        a.set_xscale("log", base=2)
        a.set_xticks(NICS, [str(n) for n in NICS])
        a.minorticks_off()
        a.set_xlabel("NIC Gb/s (8 NICs per node)")
        a.set_ylabel(ylabel)
        a.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.suptitle("llama3-70b on 16 x DGX H100, batch 512 x 8192 (DES)")
    fig.tight_layout()
    return save_figure(fig, path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, help="processes (default: all cores)")
    args = parser.parse_args()
    df = table(args.workers)
    csv = RESULTS / "study_nic_bandwidth.csv"
    atomic_write_text(csv, df.to_csv(index=False, float_format="%.5g"))
    png = plot(df, RESULTS / "study_nic_bandwidth.png")
    with pd.option_context("display.width", 200, "display.max_colwidth", 60):
        print(df.round(4).to_string(index=False))
    print(f"wrote {csv}, {png}", file=sys.stderr)


if __name__ == "__main__":
    main()
