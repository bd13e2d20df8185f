"""The alpha-beta all-reduce model vs nccl-tests on one 8-GPU node (A100, H100, H200).

Run: ``.venv/bin/python experiments/validate_nccl.py``. Writes
``experiments/results/nccl_allreduce_validation.csv``: bus bandwidth measured (Azure
nccl-tests, ``experiments/data/nccl_allreduce_busbw_8gpu_single_node_azure.csv``) and
predicted by ``sim.network.alphabeta`` with the auto algorithm, per message size.
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import pandas as pd

from sim.io import atomic_write_text
from sim.layout.placement import GroupSpan
from sim.network.algorithms import collective_time
from sim.network.alphabeta import fabric_for
from sim.spec.cluster import load_cluster

HERE = Path(__file__).resolve().parent
DATA = HERE / "data" / "nccl_allreduce_busbw_8gpu_single_node_azure.csv"
OUT = HERE / "results" / "nccl_allreduce_validation.csv"
PRESETS = {1: "dgx-a100:1", 2: "dgx-h100:1", 3: "hgx-h200:1"}
UNITS = {"K": 2**10, "M": 2**20, "G": 2**30}


def _size(label: str) -> int:
    return int(label[:-1]) * UNITS[label[-1]]


def table() -> pd.DataFrame:
    rows = []
    with DATA.open() as f:
        reader = csv.reader(f)
        header = next(reader)
        for rec in reader:
            if rec[0] == "NOTE":
                continue
            for col, preset in PRESETS.items():
                fab = fabric_for(load_cluster(preset), GroupSpan(8, 8, 1, False))
                size = _size(rec[0])
                t = collective_time("all_reduce", fab, size)
                measured = float(rec[col])
                predicted = 2 * 7 / 8 * size / t / 1e9
                rows.append({"gpu": header[col].split("_busbw")[0], "size": rec[0],
                             "measured_busbw_GBps": measured,
                             "predicted_busbw_GBps": predicted,
                             "error_pct": 100 * (predicted - measured) / measured})
    return pd.DataFrame(rows)


def main() -> None:
    df = table()
    atomic_write_text(OUT, df.to_csv(index=False, float_format="%.4g"))
    wide = df.pivot(index="size", columns="gpu", values="error_pct")
    wide = wide.loc[[r for r in df["size"].unique()]]
    print("prediction error of bus bandwidth, % (+ = model faster than measured)")
    print(wide.round(1).to_string())
    for size_from in ("1K", "128M"):
        idx = list(df["size"].unique()).index(size_from if size_from in set(df["size"])
                                              else "134M")
        part = df[df["size"].isin(list(df["size"].unique())[idx:])]
        print(f"from {size_from}: mean |error| {part['error_pct'].abs().mean():.1f}%, "
              f"worst {part['error_pct'].abs().max():.1f}%")
    print(f"wrote {OUT}", file=sys.stderr)


if __name__ == "__main__":
    main()
