"""Rounds to a test accuracy, predicted for settings held out of the fit, against the real
federated runs (issue 17: within 25%).

Run: ``.venv/bin/python experiments/fl_convergence.py`` (seconds; reads
``experiments/results/fl_runs_cpu.csv`` from ``experiments/fl_runs_cpu.py``). Writes
``experiments/results/fl_convergence.csv``.

A *cell* is one setting (strategy, clients a round K or FedBuff's buffer, local epochs E,
Dirichlet alpha, FedProx mu, FedBuff's concurrency) with its two seeds. For each cell and
target accuracy, the model (:mod:`sim.federated.accuracy`) is fitted on every *other*
cell's runs and predicts this one; the measured value is the mean over the cell's seeds
that reached the target (a cell where no seed did is counted apart, as is one the model
says is outside its ranges).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd

from sim.federated.accuracy import fit_fl, load_fl_observations
from sim.io import atomic_write_text

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "experiments" / "results"
TARGETS = (0.80, 0.85, 0.90, 0.93)


def held_out(path: Path) -> pd.DataFrame:
    obs = load_fl_observations(path)
    key = lambda o: (o.strategy, o.clients_per_round, o.local_epochs, o.alpha, o.mu,  # noqa: E731
                     o.concurrency)
    rows = []
    for cell in sorted({key(o) for o in obs}, key=str):
        mine = [o for o in obs if key(o) == cell]
        model = fit_fl([o for o in obs if key(o) != cell])
        for t in TARGETS:
            reached = [o.rounds_to[t] for o in mine if o.rounds_to.get(t)]
            row = dict(zip(("strategy", "clients_per_round", "local_epochs", "alpha", "mu",
                            "concurrency"), cell, strict=True)) | {"target": t, "seeds": len(mine),
                                                  "reached": len(reached)}
            if not model.has(cell[0], t):
                rows.append(row | {"status": "no fit"})
                continue
            p = model.predict(cell[0], t, cell[1], cell[2], cell[3], cell[4], cell[5])
            if not reached:
                rows.append(row | {"predicted": p.rounds, "status": "not reached"})
                continue
            meas = float(np.mean(reached))
            status = "extrapolated" if any("extrapolated" in n for n in p.notes) else "ok"
            rows.append(row | {"predicted": p.rounds, "measured": meas,
                               "error": p.rounds / meas - 1, "status": status})
    return pd.DataFrame(rows)


def main() -> int:
    df = held_out(RESULTS / "fl_runs_cpu.csv")
    ok = df[df["status"] == "ok"]
    for (fam, t), sub in ok.groupby([ok["strategy"].eq("fedbuff").map(
            {True: "fedbuff", False: "fedavg/fedprox"}), "target"]):
        print(f"{fam} target {t:.2f}: median |error| {sub['error'].abs().median():.1%} over "
              f"{len(sub)} cells (worst {sub['error'].abs().max():.0%})")
    med = float(ok["error"].abs().median())
    counts = df["status"].value_counts().to_dict()
    print(f"all targets: median |error| {med:.1%} over {len(ok)} held-out cells; {counts}")
    atomic_write_text(RESULTS / "fl_convergence.csv", df.to_csv(index=False))
    return 0 if med <= 0.25 else 1


if __name__ == "__main__":
    sys.exit(main())
