"""``trainsim profile compute``: time every op of a grid, merge the results into the DB."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from profiler.busy import busy_neighbours
from profiler.db import device_dir, merge_rows, read_table, update_meta
from profiler.device import device_name, environment
from profiler.ops import OpSpec, build_op
from profiler.timing import time_op
from sim.io import read_text

__all__ = ["measure", "run_compute_profile", "merge_passes", "median_pass", "FLUSH_EVERY_S"]

FLUSH_EVERY_S = 20.0  # a killed run loses at most this much work


def measure(spec: OpSpec, device: str) -> dict[str, Any]:
    """One DB row: median and spread of forward and backward seconds."""
    fwd, bwd = build_op(spec, device)
    f = time_op(fwd, device)
    b = time_op(bwd, device) if spec.op != "optimizer" else None
    row: dict[str, Any] = {"op": spec.op, "variant": spec.variant, "dtype": spec.dtype,
                           "grid": spec.grid, "m": spec.m, "n": spec.n, "k": spec.k,
                           "fwd_median_s": f.median_s, "fwd_p10_s": f.p10_s,
                           "fwd_p90_s": f.p90_s, "repeats": f.repeats,
                           "threads": torch.get_num_threads() if device == "cpu" else 0}
    for name, value in (("median", "median_s"), ("p10", "p10_s"), ("p90", "p90_s")):
        row[f"bwd_{name}_s"] = getattr(b, value) if b else 0.0
    return row


def _key(values: Iterable[object]) -> tuple[str, ...]:
    return tuple(str(v) for v in values)


def _done(folder: Path) -> set[tuple[str, ...]]:
    """Keys of the shapes already measured."""
    df = read_table(folder, "compute")
    return {_key(r) for r in df[["op", "variant", "dtype", "grid", "m", "n", "k"]]
            .itertuples(index=False)}


def median_pass(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Of one shape's rows from several passes, the one whose forward + backward is the
    median (a slow spell of the machine hits one pass, not the shape's final row)."""
    ranked = sorted(rows, key=lambda r: r["fwd_median_s"] + r["bwd_median_s"])
    return {**ranked[(len(ranked) - 1) // 2], "repeats": sum(r["repeats"] for r in rows)}


def merge_passes(passes: list[Path], dest: Path) -> int:
    """Merge device folders that each hold one pass over the same shapes (taken at
    different times, e.g. between other measurements) into ``dest``: every shape keeps its
    median pass, as with ``--passes``. Returns the number of shapes written."""
    results: dict[tuple[str, ...], list[dict[str, Any]]] = {}
    for folder in passes:
        for row in read_table(folder, "compute").to_dict("records"):
            key = _key(row[c] for c in ("op", "variant", "dtype", "grid", "m", "n", "k"))
            results.setdefault(key, []).append(row)
    dest.mkdir(parents=True, exist_ok=True)
    merge_rows(dest, "compute", [median_pass(rows) for rows in results.values()])
    first = json.loads(read_text(passes[0] / "meta.json", "profile")) \
        if (passes[0] / "meta.json").is_file() else {}
    update_meta(dest, first.get("device", dest.name), first.get("environment", {}),
                {"kind": "compute", "rows": len(results), "merged_passes": len(passes)})
    return len(results)


def run_compute_profile(specs: Iterable[OpSpec], device: str, root: str | Path,
                        threads: int | None, force: bool = False, progress: bool = True,
                        busy: int = 0, passes: int = 1) -> tuple[Path, int]:
    """Measure ``specs`` (skipping those already in the DB unless ``force``) while ``busy``
    neighbour processes keep the other cores working (:mod:`profiler.busy`), in ``passes``
    passes over all of them (each shape keeps its median pass); returns the device folder
    and the number of rows written."""
    if passes < 1:
        raise ValueError(f"passes must be >= 1, got {passes}")
    if threads is not None and threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    if device == "cpu" and threads:
        torch.set_num_threads(threads)
    name = device_name(device)
    folder = device_dir(root, name)
    folder.mkdir(parents=True, exist_ok=True)
    done = set() if force else _done(folder)
    todo = [s for s in specs if _key(s.key) not in done]
    results: dict[tuple[str, ...], list[dict[str, Any]]] = {}
    pending: set[tuple[str, ...]] = set()
    last = time.monotonic()

    def flush() -> None:
        if pending:
            merge_rows(folder, "compute", [median_pass(results[k]) for k in sorted(pending)])
            pending.clear()

    with busy_neighbours(busy if todo else 0):
        for p in range(passes):
            desc = f"profile {name}" + (f" pass {p + 1}/{passes}" if passes > 1 else "")
            for spec in tqdm(todo, desc=desc, unit="op", disable=not progress):
                key = _key(spec.key)
                results.setdefault(key, []).append(measure(spec, device))
                pending.add(key)
                if time.monotonic() - last > FLUSH_EVERY_S:
                    flush()
                    last = time.monotonic()
    flush()
    update_meta(folder, name, environment(device, threads),
                {"kind": "compute", "device": device, "rows": len(results), "busy": busy,
                 "passes": passes})
    return folder, len(results)
