"""The alpha-beta all-reduce model vs nccl-tests on one 8-GPU node (A100, H100, H200), and
across nodes against the published figures NCCL's maintainers and users give.

Run: ``.venv/bin/python experiments/validate_nccl.py``. Writes
``experiments/results/nccl_allreduce_validation.csv``: bus bandwidth measured (Azure
nccl-tests, ``experiments/data/nccl_allreduce_busbw_8gpu_single_node_azure.csv``) and
predicted by ``sim.network.alphabeta`` with the auto algorithm, per message size; and
``experiments/results/nccl_multinode_validation.csv``: each published multi-node all-reduce
figure (``experiments/data/nccl_multinode_busbw_published.csv``, DGX A100 / H100 nodes with
eight NICs, every GPU of 2-4 nodes in the group) beside the auto algorithm's prediction
(a ring, as NCCL runs) and the node-by-node hierarchical one (trainsim's default before
2026-12-06), on the matching preset.
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
MULTI = HERE / "data" / "nccl_multinode_busbw_published.csv"
OUT = HERE / "results" / "nccl_allreduce_validation.csv"
OUT_MULTI = HERE / "results" / "nccl_multinode_validation.csv"
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


def multinode() -> pd.DataFrame:
    """Each published multi-node figure beside the auto and hierarchical predictions."""
    rows = []
    for rec in pd.read_csv(MULTI).to_dict("records"):
        nodes, size = int(rec["nodes"]), _size(str(rec["size"]))
        n = 8 * nodes  # every GPU of the nodes
        cluster = load_cluster(f"dgx-{str(rec['gpu']).lower()}:{nodes}")
        fab = fabric_for(cluster, GroupSpan(n, 8, nodes, False))
        row = {k: rec[k] for k in ("gpu", "fabric", "nodes", "collective", "size",
                                   "busbw_GBps", "kind", "source")}
        for alg in ("auto", "hierarchical"):
            t = collective_time(str(rec["collective"]), fab, size, alg)
            row[f"{alg}_busbw_GBps"] = 2 * (n - 1) / n * size / t / 1e9
            row[f"{alg}_error_pct"] = 100 * (row[f"{alg}_busbw_GBps"] / rec["busbw_GBps"] - 1)
        rows.append(row)
    return pd.DataFrame(rows)


def main() -> None:
    multi = multinode()
    atomic_write_text(OUT_MULTI, multi.to_csv(index=False, float_format="%.4g"))
    print("across nodes, bus bandwidth GB/s: published, auto (ring), hierarchical")
    print(multi[["gpu", "nodes", "busbw_GBps", "auto_busbw_GBps", "auto_error_pct",
                 "hierarchical_busbw_GBps", "hierarchical_error_pct"]].round(1).to_string(
        index=False))
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
