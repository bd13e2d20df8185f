"""``trainsim profile compute --model torchvision:NAME|hf-encoder:...|builtin:...|FILE.py:FN``:
every layer's forward and backward seconds on this device at each batch size, the whole
training step beside them, and its AdamW step, into the profile DB.

Per batch size the layer measurement (:func:`profiler.graph.timing.measure_layers`, one
step with the clock in its hooks) and the whole step without hooks alternate for
``rounds`` rounds, so both see the same machine; medians are kept. On CPU the process is
pinned to its cores and runs ``threads`` threads, beside ``busy`` neighbour processes (the
other ranks of a ``cpu:RANKS`` run share the memory bandwidth: :mod:`profiler.busy`).
Writes ``graph_layers.csv`` and ``graph_steps.csv`` in the device's folder (merged, newest
wins) and the traced workload with its measured times as ``workloads/NAME.json`` there,
which ``simulate --model`` reads.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import statistics
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from profiler.db import device_dir, merge_rows, update_meta
from profiler.device import device_name, environment
from profiler.graph.sources import build
from profiler.graph.timing import LayerTimes, measure_layers, measure_step
from profiler.graph.trace import trace_module
from sim.errors import SpecError
from sim.io import atomic_write_text
from sim.spec.workload import Measured, Workload

__all__ = ["profile_workload", "fold"]


def fold(times: dict[str, float], names: list[str]) -> dict[str, float]:
    """Time charged to a module that is no traced layer (a container between its children)
    goes to its nearest traced ancestor, else to its first traced descendant."""
    known = set(names)
    out = dict.fromkeys(names, 0.0)
    for name, t in times.items():
        target = name
        while target not in known and "." in target:
            target = target.rpartition(".")[0]
        if target not in known:
            target = next((n for n in names if n.startswith(name + ".")), names[0])
        out[target] += t
    return out


@contextlib.contextmanager
def _pinned(device: str, threads: int) -> Iterator[None]:
    """On CPU: ``threads`` threads on as many cores, restored afterwards."""
    if device != "cpu":
        yield
        return
    before_threads = torch.get_num_threads()
    before = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    torch.set_num_threads(threads)
    if before is not None:
        os.sched_setaffinity(0, set(sorted(before)[:max(threads, 1)]))
    try:
        yield
    finally:
        torch.set_num_threads(before_threads)
        if before is not None:
            os.sched_setaffinity(0, before)


def _measure_batch(ref: str, batch: int, w: Workload, device: str, rounds: int,
                   seq_len: int | None, depth: int | None, tick: Any, dtype: str
                   ) -> tuple[LayerTimes, float, float]:
    """Per layer times, the whole step and its AdamW part (medians over the rounds)."""
    module, example, _ = build(ref, batch, seq_len, device)
    names = [layer.name for layer in w.layers]
    layers, steps = [], []
    for _ in range(rounds):
        layers.append(measure_layers(module, example, depth, device, repeats=1, dtype=dtype))
        steps.append(measure_step(module, example, device, repeats=1, dtype=dtype))
        tick()
    fwd = {n: statistics.median(fold(x.forward_s, names)[n] for x in layers) for n in names}
    bwd = {n: statistics.median(fold(x.backward_s, names)[n] for x in layers) for n in names}
    return (LayerTimes(fwd, bwd), statistics.median(s for s, _ in steps),
            statistics.median(o for _, o in steps))


def profile_workload(ref: str, batches: list[int], db: str | Path, device: str = "cpu",
                     threads: int = 1, rounds: int = 3, depth: int | None = None,
                     seq_len: int | None = None, progress: bool = True, busy: int = 0,
                     dtype: str = "fp32") -> tuple[Path, Workload, list[dict[str, Any]]]:
    """Measure and store (see the module docstring); returns the device folder, the
    workload with its measured times, and one row per batch (step, sum of layers, AdamW)."""

    if not batches or min(batches) < 1:
        raise SpecError("--batch", f"must be batch sizes >= 1, got {batches}")
    if rounds < 1:
        raise SpecError("--passes", f"must be >= 1, got {rounds}")
    if dtype not in ("fp32", "bf16"):
        raise SpecError("--dtype", f"workload graphs are profiled in fp32 or bf16 (autocast), "
                        f"got {dtype}")
    from profiler.busy import busy_neighbours

    # the neighbours start first, so they do not inherit this process's pinned core
    with busy_neighbours(busy if device == "cpu" else 0), _pinned(device, threads):
        return _profile(ref, batches, db, device, threads, rounds, depth, seq_len, progress,
                        dtype)


def _profile(ref: str, batches: list[int], db: str | Path, device: str, threads: int,
             rounds: int, depth: int | None, seq_len: int | None, progress: bool, dtype: str
             ) -> tuple[Path, Workload, list[dict[str, Any]]]:
    from tqdm import tqdm

    meta_module, meta_example, name = build(ref, 2, seq_len)
    w = trace_module(meta_module, meta_example, name, ref, depth)
    label = device_name(device)
    measured: dict[str, list[Measured]] = {layer.name: [] for layer in w.layers}
    rows: list[dict[str, Any]] = []
    bar = tqdm(total=len(batches) * rounds, desc=f"profile {name}", unit="round",
               disable=not progress)
    for b in batches:
        times, step, opt = _measure_batch(ref, b, w, device, rounds, seq_len, depth,
                                          lambda: bar.update(1), dtype)
        for n in measured:
            measured[n].append(Measured(label, b, max(times.forward_s[n], 1e-9),
                                        times.backward_s[n], dtype))
        rows.append({"workload": name, "batch": b, "dtype": dtype, "threads": threads,
                     "step_s": step, "layers_s": sum(times.forward_s.values())
                     + sum(times.backward_s.values()), "optimizer_s": opt})
    bar.close()
    optimizer = float(statistics.median(float(r["optimizer_s"]) for r in rows))  # any batch
    layers = tuple(dataclasses.replace(x, measured=tuple(measured[x.name])) for x in w.layers)
    w = dataclasses.replace(w, layers=layers, optimizer_s=((label, optimizer),))
    folder = device_dir(db, label)
    folder.mkdir(parents=True, exist_ok=True)
    merge_rows(folder, "graph_layers", [
        {"workload": name, "layer": x.name, "kind": x.kind, "batch": m.batch, "dtype": dtype,
         "threads": threads, "forward_s": m.forward_s, "backward_s": m.backward_s}
        for x in w.layers for m in x.measured])
    merge_rows(folder, "graph_steps", rows)
    atomic_write_text(folder / "workloads" / f"{name}.json", json.dumps(w.to_dict(), indent=1)
                      + "\n")
    update_meta(folder, label, environment(device, threads),
                {"kind": "graph", "workload": name, "batches": batches, "rounds": rounds})
    return folder, w, rows
