"""Real federated runs for the statistical-efficiency model: rounds to a test accuracy
against clients per round, local epochs, the non-IID split and FedProx's ``mu``.

Run: ``.venv/bin/python experiments/fl_runs_cpu.py`` (about 8 minutes for FedAvg/FedProx,
a few more for FedBuff; ``--part fedavg`` or ``--part fedbuff`` runs one part and keeps the
other's rows from the last run; ``--quick``: a third of the grid). Writes
``experiments/results/fl_runs_cpu.csv`` (one row a run) and
``experiments/results/fl_curves_cpu.csv`` (test accuracy after every round), and, unless
``--quick``, the bundled observations ``sim/data/convergence/fl-digits-cpu.csv`` that
:mod:`sim.federated.accuracy` fits.

Every run: a server and 4 client processes over gloo (:func:`executor.federated.launch.
execute_fl_batch`, links not emulated: only rounds count here), 20 clients holding a
Dirichlet(alpha) split of the digits table's training rows, an MLP 64-64-10, local SGD at
lr 0.05 with batches of 16, 60 rounds, the global model tested after each. Grid: FedAvg
with K in {2, 5, 10, 20} clients a round x local epochs E in {1, 3, 8} x alpha in {0.1,
0.5, inf (IID)}, and FedProx (mu 0.01 and 0.1) at K in {5, 10}, E = 8, alpha in {0.1, 0.5};
two seeds each (the seed draws the split, the model and the samples).

FedBuff (:mod:`executor.federated.fedbuff`): 2 or 4 client processes (the concurrency: each
trains one client at a time) x buffer 1, 2 or 4 deltas a server step x E in {1, 3} x alpha
in {0.5, inf}, server lr 1, staleness scaling ``1 / sqrt(1 + s)``, 150 server steps, the
global model tested after each; two seeds. Its ``clients_per_round`` column is the buffer
and ``concurrency`` the processes.
"""

from __future__ import annotations

import argparse
import itertools
import math
import sys
import time
from pathlib import Path

import pandas as pd
from tqdm import tqdm

from executor.federated.launch import FLRun, execute_fl_batch
from sim.io import atomic_write_text

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "experiments" / "results"
BUNDLED = ROOT / "sim" / "data" / "convergence" / "fl-digits-cpu.csv"
TARGETS = (0.80, 0.85, 0.90, 0.93)
ROUNDS = 60
FEDBUFF_STEPS = 150


def _merge(df: pd.DataFrame, curves: list[dict], part: str) -> tuple[pd.DataFrame, list]:
    old = pd.read_csv(RESULTS / "fl_runs_cpu.csv")
    old_curves = pd.read_csv(RESULTS / "fl_curves_cpu.csv")
    mine = old["strategy"].eq("fedbuff") if part == "fedbuff" else ~old["strategy"].eq(
        "fedbuff")
    kept = old[~mine].reset_index()  # `index`: the run id its curves carry
    ids = dict(zip(kept["index"], range(len(kept)), strict=True))
    kept_curves = old_curves[old_curves["run"].isin(ids)].assign(
        run=lambda d: d["run"].map(ids))
    shift = len(kept)
    new_curves = pd.DataFrame(curves).assign(run=lambda d: d["run"] + shift)
    merged = pd.concat([kept.drop(columns="index"), df], ignore_index=True)
    return merged, pd.concat([kept_curves, new_curves]).to_dict("records")


def grid(quick: bool) -> list[dict]:
    cells = [{"strategy": "fedavg", "clients_per_round": k, "local_epochs": e, "alpha": a,
              "mu": 0.0} for k, e, a in itertools.product(
        (2, 5, 10, 20), (1, 3, 8), (0.1, 0.5, math.inf))]
    cells += [{"strategy": "fedprox", "clients_per_round": k, "local_epochs": 8, "alpha": a,
               "mu": mu} for k, a, mu in itertools.product((5, 10), (0.1, 0.5), (0.01, 0.1))]
    if quick:
        cells = cells[::3]
    return [{**c, "seed": s} for c in cells for s in (0, 1)]


def fedbuff_grid(quick: bool) -> list[dict]:
    cells = [{"strategy": "fedbuff", "clients_per_round": b, "local_epochs": e, "alpha": a,
              "mu": 0.0, "concurrency": m} for m, b, e, a in itertools.product(
        (2, 4), (1, 2, 4), (1, 3), (0.5, math.inf))]
    if quick:
        cells = cells[::3]
    return [{**c, "seed": s} for c in cells for s in (0, 1)]


def rounds_to(accs: list[float], target: float) -> int | None:
    for i, a in enumerate(accs):
        if a >= target:
            return i + 1
    return None


def _spec(c: dict) -> FLRun:
    if c["strategy"] == "fedbuff":
        return FLRun(population=20, processes=c["concurrency"], strategy="fedbuff",
                     buffer=c["clients_per_round"], rounds=FEDBUFF_STEPS, alpha=c["alpha"],
                     local_epochs=c["local_epochs"], lr=0.05, batch_size=16, seed=c["seed"])
    return FLRun(population=20, processes=4, clients_per_round=c["clients_per_round"],
                 rounds=ROUNDS, alpha=c["alpha"], local_epochs=c["local_epochs"], lr=0.05,
                 batch_size=16, mu=c["mu"], seed=c["seed"])


def _batches(cells: list[dict]) -> list[list[dict]]:
    """Up to 14 runs a torchrun start, each start one process count."""
    out = []
    for procs in sorted({c.get("concurrency", 4) for c in cells}):
        mine = [c for c in cells if c.get("concurrency", 4) == procs]
        out += [mine[i:i + 14] for i in range(0, len(mine), 14)]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="a third of the grid")
    ap.add_argument("--part", choices=("all", "fedavg", "fedbuff"), default="all",
                    help="run one part; the other's rows are kept from the last full run")
    args = ap.parse_args(argv)
    cells = (grid(args.quick) if args.part != "fedbuff" else []) + (
        fedbuff_grid(args.quick) if args.part != "fedavg" else [])
    runs, curves = [], []
    t0 = time.time()
    bar = tqdm(total=len(cells), desc="fl runs", unit="run")
    for batch in _batches(cells):
        specs = [_spec(c) for c in batch]
        for c, res in zip(batch, execute_fl_batch(specs, timeout_s=300), strict=True):
            accs = [r["accuracy"] for r in res["rounds"]]
            row = dict(c, final_accuracy=accs[-1], rounds=len(accs))
            for t in TARGETS:
                row[f"rounds_to_{int(t * 100)}"] = rounds_to(accs, t)
            runs.append(row)
            run_id = len(runs) - 1
            curves += [{"run": run_id, "round": r + 1, "accuracy": a}
                       for r, a in enumerate(accs)]
        bar.update(len(batch))
    bar.close()
    df = pd.DataFrame(runs)
    print(df.groupby(["strategy", "alpha"])[["rounds_to_90", "final_accuracy"]]
          .agg(["median", "count"]).to_string())
    print(f"{len(df)} runs in {time.time() - t0:.0f} s")
    RESULTS.mkdir(parents=True, exist_ok=True)
    suffix = "_quick" if args.quick else ""
    if args.part != "all" and not args.quick:  # keep the other part's rows and curves
        df, curves = _merge(df, curves, args.part)
    atomic_write_text(RESULTS / f"fl_runs_cpu{suffix}.csv", df.to_csv(index=False))
    atomic_write_text(RESULTS / f"fl_curves_cpu{suffix}.csv",
                      pd.DataFrame(curves).to_csv(index=False))
    if not args.quick:
        atomic_write_text(BUNDLED, df.to_csv(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
