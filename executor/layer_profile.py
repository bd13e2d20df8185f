"""``trainsim profile tp``: whole tensor-parallel layers and output heads timed as the
executor runs them, over ``torchrun`` ranks, into the profile DB.

Single-process layer rows (``profile compute``, op ``layer``) time a layer at the shapes one
TP rank sees, without what tensor parallelism adds around the kernels: DTensor dispatch,
layout redistributions, the vocab-parallel loss's unfused passes, and the wait for the
slower rank at each of the layer's collectives. On our 2-core VM that left the executor's
TP plans 27-32% slower than predicted, inside each micro-batch (``experiments/NOTES.md``).
These rows measure it: ``tp-layer`` / ``tp-layer-sp`` (tokens, hidden, tp), variant the
layer's structure (:func:`sim.cost.compute.layer_variant`), and ``tp-head`` / ``tp-head-sp``
(tokens, hidden, vocab), variant ``tp=T;norm=N``. Each row includes the TP collectives it
ran; the cost model subtracts what it charges for them itself
(:meth:`sim.cost.profiled.Profiled.layer_factor`), so the simulated layer comes out at the
measured one.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from executor.launch import launch
from profiler.compute import median_pass
from profiler.db import device_dir, merge_rows, update_meta
from profiler.device import device_name, environment
from sim.cost.compute import layer_variant
from sim.errors import SpecError
from sim.spec.model import ModelSpec

__all__ = ["tp_shapes", "run_tp_profile", "profile_ranks", "TP_OPS", "TORCH_DTYPES"]

TP_OPS = ("tp-layer", "tp-layer-sp", "tp-head", "tp-head-sp")
TORCH_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def _check(m: ModelSpec, tp: int, seq_lens: list[int], sp: list[bool]) -> None:
    if m.is_moe or m.is_mla:
        raise SpecError("--model", "tp layer profiles build dense layers with standard "
                        "attention (the executor runs MoE and MLA layers without TP)")
    if tp < 2:
        raise SpecError("--tp", f"must be >= 2 (a TP group), got {tp}")
    for what, n in (("num_heads", m.num_heads), ("num_kv_heads", m.kv_heads),
                    ("vocab_size", m.vocab_size), ("ffn_hidden_size", m.ffn_hidden_size)):
        if n % tp:
            raise SpecError("--tp", f"{tp} does not divide model.{what} {n}")
    for s in seq_lens:
        if s > m.max_seq_len or (True in sp and s % tp):
            raise SpecError("--seq-len", f"{s} must be <= model.max_seq_len {m.max_seq_len}"
                            + (f" and a multiple of tp {tp} (sequence parallel)"
                               if True in sp else ""))


def tp_shapes(m: ModelSpec, tp: int, micro_batches: list[int], seq_lens: list[int],
              sp: list[bool], dtype: str) -> list[dict[str, Any]]:
    """One worker shape per (micro-batch, sequence, sp), with the DB keys of its two rows."""
    _check(m, tp, seq_lens, sp)
    grid = f"model-{m.name}"
    out = []
    for mb in micro_batches:
        for s in seq_lens:
            for on in sp:
                suffix, tokens = ("-sp" if on else ""), mb * s
                keys = {
                    f"tp-layer{suffix}": {"variant": layer_variant(m, s), "m": tokens,
                                          "n": m.hidden_size, "k": tp},
                    f"tp-head{suffix}": {"variant": f"tp={tp};norm={m.norm}", "m": tokens,
                                         "n": m.hidden_size, "k": m.vocab_size}}
                for k in keys.values():
                    k.update(dtype=dtype, grid=grid)
                out.append({"micro_batch": mb, "seq_len": s, "sp": on, "keys": keys})
    return out


def run_tp_profile(m: ModelSpec, tp: int, micro_batches: list[int], seq_lens: list[int],
                   sp: list[bool], root: str | Path, device: str = "cpu", dtype: str = "fp32",
                   passes: int = 1, samples: int = 7, warmup: int = 2,
                   timeout_s: float = 1800.0) -> tuple[Path, list[dict[str, Any]]]:
    """Measure every shape ``passes`` times (separate torchrun runs; each row keeps its
    median pass), merge the rows into the DB's compute table; (device folder, rows)."""
    shapes = tp_shapes(m, tp, micro_batches, seq_lens, sp, dtype)
    one_layer = dataclasses.replace(m, num_layers=1, mlp_only_layers=())
    cfg = {"model": one_layer.to_dict(), "shapes": shapes, "device": device, "threads": 1,
           "timeout_s": timeout_s, "torch_dtype": TORCH_DTYPES[dtype], "samples": samples,
           "warmup": warmup}
    return profile_ranks("executor.layer_worker", cfg, tp, root, passes,
                         {"kind": "tp-layers", "device": device, "tp": tp})


def profile_ranks(module: str, cfg: dict[str, Any], nproc: int, root: str | Path, passes: int,
                  run: dict[str, Any]) -> tuple[Path, list[dict[str, Any]]]:
    """Run the rank worker ``module`` over ``nproc`` torchrun ranks ``passes`` times (each
    row keeps its median pass), merge its rows into the DB's compute table and log ``run``
    in its meta; (device folder, rows)."""
    device = cfg["device"]
    results: dict[tuple, list[dict[str, Any]]] = {}
    for _ in range(passes):
        ranks = launch(module, cfg, nproc, cfg["timeout_s"], 1)
        for row in ranks[0]["rows"]:
            row["threads"] = 1 if device == "cpu" else 0
            key = tuple(row[c] for c in ("op", "variant", "dtype", "grid", "m", "n", "k"))
            results.setdefault(key, []).append(row)
    rows = [median_pass(r) for r in results.values()]
    name = device_name(device)
    folder = device_dir(root, name)
    folder.mkdir(parents=True, exist_ok=True)
    merge_rows(folder, "compute", rows)
    update_meta(folder, name, environment(device, 1), {**run, "rows": len(rows),
                                                       "passes": passes})
    return folder, rows
