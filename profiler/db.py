"""Writing a profile DB: merge new rows into a device's tables, atomically.

Every table is rewritten as a whole to a temporary file and renamed over the old one, so
a killed run leaves each table either as it was or fully updated; rows are merged on their
key columns, newest winning, so re-running adds shapes instead of discarding them.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pandas as pd

from sim.cost.profile_db import COMM_COLUMNS, COMPUTE_COLUMNS, FIT_COLUMNS, INSITU_COLUMNS
from sim.io import atomic_write_text, read_text

__all__ = ["TABLES", "read_table", "merged_table", "merge_rows", "write_table", "update_meta",
           "device_dir"]

# table -> (columns, key columns)
TABLES = {
    "compute": (COMPUTE_COLUMNS, ["op", "variant", "dtype", "grid", "m", "n", "k"]),
    "comm": (COMM_COLUMNS, ["collective", "backend", "fabric", "group_size", "size_bytes"]),
    "comm_insitu": (INSITU_COLUMNS, ["collective", "backend", "fabric", "group_size",
                                     "size_bytes"]),
    "comm_fit": (FIT_COLUMNS, ["collective", "backend", "fabric", "group_size",
                               "min_size_bytes"]),
    # workload graphs (profiler/graph/profile.py): every layer, and the whole step
    "graph_layers": (["workload", "layer", "kind", "batch", "dtype", "threads", "forward_s",
                      "backward_s"], ["workload", "layer", "batch", "dtype", "threads"]),
    "graph_steps": (["workload", "batch", "dtype", "threads", "step_s", "layers_s",
                     "optimizer_s"], ["workload", "batch", "dtype", "threads"]),
}


def device_dir(root: str | Path, device: str) -> Path:
    return Path(root) / device


def read_table(folder: Path, table: str) -> pd.DataFrame:
    columns, _ = TABLES[table]
    path = folder / f"{table}.csv"
    if not path.is_file():
        return pd.DataFrame(columns=columns)
    return pd.read_csv(io.StringIO(read_text(path, "profile")), keep_default_na=False)


def merged_table(folder: Path, table: str, rows: list[dict[str, Any]]) -> pd.DataFrame:
    """``folder/table.csv`` with ``rows`` merged in (newest wins per key), not written."""
    columns, keys = TABLES[table]
    new = pd.DataFrame(rows, columns=columns)
    old = read_table(folder, table)
    for c in columns:  # a column added since the table was written
        if c not in old.columns:
            old[c] = ""
    merged = new if old.empty else pd.concat([old[columns], new], ignore_index=True)
    return merged.drop_duplicates(keys, keep="last").sort_values(keys, ignore_index=True)


def merge_rows(folder: Path, table: str, rows: list[dict[str, Any]]) -> pd.DataFrame:
    """Merge ``rows`` into ``folder/table.csv``; returns the merged table."""
    merged = merged_table(folder, table, rows)
    atomic_write_text(folder / f"{table}.csv", merged.to_csv(index=False))
    return merged


def write_table(folder: Path, table: str, rows: list[dict[str, Any]]) -> None:
    """Replace a table as a whole (``comm_fit``, derived; ``comm_insitu``, per group)."""
    columns, keys = TABLES[table]
    df = pd.DataFrame(rows, columns=columns).sort_values(keys, ignore_index=True)
    atomic_write_text(folder / f"{table}.csv", df.to_csv(index=False))


def update_meta(folder: Path, device: str, environment: dict[str, Any], run: dict[str, Any]
                ) -> dict[str, Any]:
    """meta.json: the device, the latest environment, and a log of every run."""
    path = folder / "meta.json"
    meta: dict[str, Any] = json.loads(read_text(path, "profile")) if path.is_file() else {
        "schema_version": 1, "device": device, "runs": []}
    meta["environment"] = environment
    meta["runs"].append({**run, "torch": environment.get("torch"),
                         "time_utc": environment.get("time_utc")})
    atomic_write_text(path, json.dumps(meta, indent=2) + "\n")
    return meta
