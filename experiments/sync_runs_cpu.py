"""Real runs of the synchronisation strategies on this CPU (issue 16): throughput, measured
staleness, and test accuracy against updates on scikit-learn's bundled digits.

Run: ``.venv/bin/python experiments/sync_runs_cpu.py [--quick] [--task cancer] [--kind K |
--grids G,...]`` (321 runs in about 7 minutes on 2 cores, with a progress bar; ``--quick``
one seed; ``--kind diloco`` reruns that kind's runs only, ``--grids sgp`` those grids, and
both keep the other rows). Each batch of runs shares
one torchrun start (``executor.sync.launch.execute_sync_batch``). Writes
``experiments/results/sync_runs_cpu.csv`` (a row per run) and ``sync_curves_cpu.csv`` (test
loss and accuracy of worker 0 every 5 steps, against updates and wall time), and the runs
the bundled statistical-efficiency model is fitted to, ``sim/data/convergence/digits_cpu.csv``
(``--task cancer``: the breast-cancer table instead, into ``sync_runs_cancer_cpu.csv``,
``sync_curves_cancer_cpu.csv`` and ``cancer_cpu.csv``: the ``cancer-cpu`` model).

- Strategies: 4 workers (batch 32 each), 300 steps, lr 0.2: BSP over all-reduce and over 2
  server shards, ASP and SSP(2) over one server, backup workers (b = 1), local SGD (H = 8),
  DiLoCo (H = 10), D-PSGD on a ring, SGP over the exponential graph.
- A staleness x learning-rate grid: SSP with s in {0, 1, 2, 4, 8, inf} and lr from 0.05 to
  6.4 (doubling), seeds 0 and 1, 150 steps.
- Stragglers: worker 0 computing 2x and 4x slower (it idles the difference) under ASP,
  SSP(1), SSP(4) and BSP over one server, lr 0.1 and 0.2, seeds 0 and 1, 150 steps: the
  staleness spreads (the fast workers' pushes see few updates, the straggler's many).
- A period x learning-rate grid: local SGD with H in {1, 2, 4, 8, 16, 32}, lr in {0.1, 0.4,
  1.6}, seeds 0 and 1, 160 steps.
- The other families' grids, lr in {0.1, 0.4, 1.6}, seeds 0 and 1, 200 steps (DiLoCo
  400, to reach 95%): DiLoCo with H in {2, 5, 10, 20}; backup workers with b in {1, 2,
  3}; D-PSGD and AD-PSGD over a complete graph, a ring and a path (mixing gaps 1, 2/3 and
  about 0.2); SGP over the exponential graph (lr 0.1 to 1.6, doubling: one k, 1 on 4
  workers); two-stage with 10%, 30% and 60% of the gradient important; and 160 steps of
  compressed BSP: fp16, int8, 1-bit, top-10%, top-1%, PowerSGD rank 1 and 4, error
  feedback on. ``--grids sgp,ad-psgd,two-stage`` reruns those grids and keeps the rest.

A run **diverged** when its last test loss is not finite or above its first, or its last
accuracy is below 20% (chance is 10%).
"""

from __future__ import annotations

import argparse
import functools
import math
from pathlib import Path
from typing import Any

import pandas as pd
from tqdm import tqdm

from executor.sync.launch import execute_sync_batch, updates_to
from executor.sync.task import TABLE_TASKS, TASKS, load_task, mlp
from sim.cost.convergence import BUNDLED, k_of
from sim.errors import SpecError
from sim.io import atomic_write_text
from sim.spec.plan import Plan
from sim.spec.sync import SYNC_KINDS, architecture

RESULTS = Path(__file__).resolve().parent / "results"
N, BATCH = 4, 32
TASK = {"name": "digits"}  # the bundled task the runs train (--task)


def _numel() -> int:
    """The task MLP's parameters (what an uncompressed all-reduce carries)."""
    return _numel_of(TASK["name"])


@functools.cache
def _numel_of(task: str) -> int:
    return sum(q.numel() for q in mlp(load_task(task), TASKS[task], 0).parameters())


def _plan(sync: object, comm: object = "auto", compression: object = "none") -> Plan:
    return Plan(global_batch_size=N * BATCH, seq_len=1, dp=N, sync=sync,  # type: ignore[arg-type]
                communication=comm, compression=compression)  # type: ignore[arg-type]


STRATEGIES = [("BSP", "bsp", "auto"), ("BSP, 2 server shards", "bsp",
                                       {"architecture": "ps", "servers": 2}),
              ("ASP", "asp", "auto"), ("SSP(2)", {"kind": "ssp", "staleness": 2}, "auto"),
              ("backup workers b=1", {"kind": "backup-workers", "backups": 1}, "auto"),
              ("local SGD H=8", {"kind": "local-sgd", "period": 8}, "auto"),
              ("DiLoCo H=10", {"kind": "diloco", "period": 10}, "auto"),
              ("D-PSGD ring", "gossip", "auto"),
              ("SGP exponential", {"kind": "gossip", "gossip_mode": "sgp",
                                   "graph": "exponential"}, "auto")]
LRS = [0.05 * 2**i for i in range(8)]  # 0.05 .. 6.4


def diverged(r: dict[str, Any]) -> bool:
    first, last = r["evals"][0], r["evals"][-1]
    return not math.isfinite(last["loss"]) or last["loss"] > first["loss"] \
        or last["accuracy"] < 0.2


def _row(label: str, grid: str, p: Plan, lr: float, seed: int, r: dict[str, Any]
         ) -> dict[str, Any]:
    s = p.sync
    return {"run": f"{grid}:{label}:lr={lr:g}:seed={seed}", "grid": grid, "strategy": label,
            "kind": s.kind, "staleness": s.staleness if s.kind == "ssp" else None,
            "period": s.period if s.kind in ("local-sgd", "diloco") else None,
            "architecture": r["architecture"], "servers": r["servers"], "lr": lr,
            "seed": seed, "steps": r["steps"], "update_scope": r["update_scope"],
            "updates_per_s": r["updates_per_s"], "samples_per_s": r["samples_per_s"],
            "compute_ms": r["compute_s"] * 1e3, "staleness_mean": r["staleness"]["mean"],
            "straggler_factor": (r["straggler"] or {}).get("factor", 1.0),
            "updates_to_90": updates_to(r, 0.90), "updates_to_95": updates_to(r, 0.95),
            "final_accuracy": r["evals"][-1]["accuracy"],
            "final_loss": r["evals"][-1]["loss"], "diverged": diverged(r),
            "compression": p.compression.kind, "sent_bytes": r["sent_bytes_per_step"],
            "k": _k(p, r), "gossip_mode": s.gossip_mode if s.kind == "gossip" else None}


def _k(p: Plan, r: dict[str, Any]) -> float | None:
    """The run's k in its statistical-efficiency family (None: no family, e.g. two-stage by
    named layers);
    compressed: from the bytes it measured sending against an uncompressed all-reduce's."""
    sent = r["sent_bytes_per_step"]
    raw = 4 * _numel() * 2 * (p.dp - 1) / p.dp
    try:
        return k_of(p, r["staleness"]["mean"], raw / sent if sent else None)
    except SpecError:
        return None


# D-PSGD graphs over the 4 workers, slowest mixing last (k = 1/gap - 1: 0, 0.5, 4.1)
GRAPHS = [("complete", [[a, b] for a in range(N) for b in range(a + 1, N)]),
          ("ring", [[i, (i + 1) % N] for i in range(N)]),
          ("path", [[i, i + 1] for i in range(N - 1)])]
# compressed BSP over all-reduce (executor/sync/compress.py), error feedback on
COMPRESSIONS = [("fp16", "fp16"), ("int8", "int8"), ("1-bit", "onebit"),
                ("top-10%", {"kind": "topk", "ratio": 0.1}),
                ("top-1%", {"kind": "topk", "ratio": 0.01}),
                ("PowerSGD r=1", {"kind": "powersgd", "rank": 1}),
                ("PowerSGD r=4", {"kind": "powersgd", "rank": 4})]
SLOW = [("ASP", "asp"), ("SSP(1)", {"kind": "ssp", "staleness": 1}),
        ("SSP(4)", {"kind": "ssp", "staleness": 4}), ("BSP, 1 server", "bsp")]


def _batches(seeds: list[int]) -> list[tuple[str, int, list[tuple[str, Plan, float, int]]]]:
    """(grid, steps, runs) batches; each batch's plans share workers and servers."""
    out = []
    by_ranks: dict[int, list[tuple[str, Plan, float, int]]] = {}
    for label, sync, comm in STRATEGIES:
        p = _plan(sync, comm)
        ranks = p.dp + (p.communication.servers if architecture(p) == "ps" else 0)
        by_ranks.setdefault(ranks, []).append((label, p, 0.2, 0))
    out += [("strategies", 300, runs) for runs in by_ranks.values()]
    for seed in seeds:
        out.append(("staleness", 150, [
            (f"SSP({s})", _plan({"kind": "ssp", "staleness": s}), lr, seed)
            for s in (0, 1, 2, 4, 8, "inf") for lr in LRS]))
        out.append(("straggler", 150, [
            (f"{label}, worker 0 x{f}", _plan(sync, {"architecture": "ps"}), lr, seed)
            for label, sync in SLOW for f in (2, 4) for lr in (0.1, 0.2)]))
        out.append(("period", 160, [
            (f"local SGD H={h}", _plan({"kind": "local-sgd", "period": h}), lr, seed)
            for h in (1, 2, 4, 8, 16, 32) for lr in (0.1, 0.4, 1.6)]))
        out.append(("diloco", 400, [
            (f"DiLoCo H={h}", _plan({"kind": "diloco", "period": h}), lr, seed)
            for h in (2, 5, 10, 20) for lr in (0.1, 0.4, 1.6)]))
        out.append(("backup", 200, [
            (f"backup workers b={b}", _plan({"kind": "backup-workers", "backups": b}), lr,
             seed) for b in (1, 2, 3) for lr in (0.1, 0.4, 1.6)]))
        out.append(("graph", 200, [
            (f"D-PSGD {name}", _plan({"kind": "gossip", "graph": "edges", "edges": edges}),
             lr, seed) for name, edges in GRAPHS for lr in (0.1, 0.4, 1.6)]))
        out.append(("compression", 160, [
            (f"BSP, {name}", _plan("bsp", compression=comp), lr, seed)
            for name, comp in COMPRESSIONS for lr in (0.1, 0.4, 1.6)]))
        out.append(("sgp", 200, [
            ("SGP exponential", _plan({"kind": "gossip", "gossip_mode": "sgp",
                                       "graph": "exponential"}), lr, seed)
            for lr in (0.1, 0.2, 0.4, 0.8, 1.6)]))  # one k (4 workers): more learning rates
        out.append(("ad-psgd", 200, [
            (f"AD-PSGD {name}", _plan({"kind": "gossip", "gossip_mode": "ad-psgd",
                                       "graph": "edges", "edges": edges}), lr, seed)
            for name, edges in GRAPHS for lr in (0.1, 0.4, 1.6)]))
        out.append(("two-stage", 200, [
            (f"two-stage {f:.0%} important", _plan({"kind": "two-stage",
                                                   "important_fraction": f}), lr, seed)
            for f in (0.1, 0.3, 0.6) for lr in (0.1, 0.4, 1.6)]))
    return out


def _write(df: pd.DataFrame, curves: list[dict[str, Any]], task: str) -> None:
    """The runs, their curves, and the runs the bundled model (``TASK-cpu``) is fitted to."""
    tag = "" if task == "digits" else f"_{task}"
    RESULTS.mkdir(exist_ok=True)
    atomic_write_text(RESULTS / f"sync_runs{tag}_cpu.csv", df.to_csv(index=False,
                                                                     float_format="%.6g"))
    atomic_write_text(RESULTS / f"sync_curves{tag}_cpu.csv", pd.DataFrame(curves).to_csv(
        index=False, float_format="%.6g"))
    df["k"] = df.k.where(~(df.k.abs() < 1e-9), 0.0)  # exact averaging, not float noise
    fit = df[df.k.notna()][[
        "kind", "gossip_mode", "compression", "lr", "staleness_mean", "period", "k", "seed",
        "updates_to_90",
        "updates_to_95", "final_accuracy", "diverged", "grid", "strategy", "straggler_factor"]]
    atomic_write_text(BUNDLED / f"{task}_cpu.csv", fit.to_csv(index=False,
                                                              float_format="%.6g"))


def _kept(task: str, kind: str | None, grids: list[str] | None
          ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The rows and curves of the runs not rerun (none without ``--kind`` or ``--grids``)."""
    if kind is None and grids is None:
        return [], []
    tag = "" if task == "digits" else f"_{task}"
    df = pd.read_csv(RESULTS / f"sync_runs{tag}_cpu.csv")
    curves = pd.read_csv(RESULTS / f"sync_curves{tag}_cpu.csv")
    df = df[df["kind"] != kind] if kind else df[~df["grid"].isin(grids or [])]
    curves = curves[curves["run"].isin(set(df["run"]))]
    return df.to_dict("records"), curves.to_dict("records")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="one seed of the grids")
    ap.add_argument("--task", choices=TABLE_TASKS, default="digits", help="the bundled "
                    "task (default digits; cancer writes its own files and model)")
    ap.add_argument("--kind", help="rerun only the runs of this sync kind (e.g. diloco) and "
                    "keep the other rows of the files")
    ap.add_argument("--grids", help="rerun only these grids (comma-separated, e.g. "
                    "sgp,ad-psgd,two-stage) and keep the other rows of the files")
    args = ap.parse_args()
    if args.kind and args.grids:
        ap.error("--kind and --grids: give one (each keeps the rows the other would rerun)")
    if args.kind is not None and args.kind not in SYNC_KINDS:
        ap.error(f"--kind: must be one of {', '.join(SYNC_KINDS)}, got {args.kind!r}")
    TASK["name"] = args.task
    grids = args.grids.split(",") if args.grids is not None else None
    if grids is not None and not all(grids):
        ap.error(f"--grids: comma-separated grid names, got {args.grids!r}")
    rows, curves = _kept(args.task, args.kind, grids)
    batches = _batches([0] if args.quick else [0, 1])
    if args.kind:
        batches = [(g, steps, [r for r in runs if r[1].sync.kind == args.kind])
                   for g, steps, runs in batches]
    if grids:
        unknown = sorted(set(grids) - {g for g, _, _ in batches})
        if unknown:
            ap.error(f"--grids: unknown grid(s) {', '.join(unknown)}")
        batches = [b for b in batches if b[0] in grids]
    batches = [b for b in batches if b[2]]
    with tqdm(total=sum(len(b[2]) for b in batches), unit="run") as bar:
        for grid, steps, runs in batches:
            slow = [{"worker": 0, "factor": float(label.rsplit("x", 1)[1])}
                    if grid == "straggler" else None for label, _, _, _ in runs]
            out = execute_sync_batch([(p, lr, seed) for _, p, lr, seed in runs], args.task,
                                     steps=steps, eval_every=5, timeout_s=120, stragglers=slow)
            for (label, p, lr, seed), r in zip(runs, out, strict=True):
                row = _row(label, grid, p, lr, seed, r)
                rows.append(row)
                curves += [{"run": row["run"], **e} for e in r["evals"]]
            bar.update(len(runs))
    df = pd.DataFrame(rows)
    _write(df, curves, args.task)
    show = df[df.grid == "strategies"][["strategy", "updates_per_s", "samples_per_s",
                                        "staleness_mean", "updates_to_95", "final_accuracy"]]
    print(show.to_string(index=False))
    grid = df[df.grid == "staleness"].groupby(["strategy", "lr"]).diverged.mean().unstack()
    print("share of seeds diverged, SSP staleness x lr:\n" + grid.to_string())
    slow = df[df.grid == "straggler"].groupby("strategy")[
        ["updates_per_s", "samples_per_s", "staleness_mean", "updates_to_95"]].mean()
    print("stragglers (mean over lr and seeds):\n" + slow.round(2).to_string())
    tag = "" if args.task == "digits" else f"_{args.task}"
    print(f"wrote {RESULTS}/sync_runs{tag}_cpu.csv and sync_curves{tag}_cpu.csv")


if __name__ == "__main__":
    main()
