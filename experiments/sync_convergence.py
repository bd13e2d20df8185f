"""The statistical-efficiency model against held-out measured runs (issue 16).

Run: ``.venv/bin/python experiments/sync_convergence.py`` (seconds; it reads the runs of
``experiments/sync_runs_cpu.py``). Writes ``experiments/results/sync_convergence.csv``.

Leave one configuration out: a configuration is a (strategy, its staleness bound or period,
learning rate, straggler) cell of the measured grids, over its seeds. For each cell the model of its
family (``sim.cost.convergence``) is fitted to every *other* cell's runs and predicts this
one from its measured mean staleness (or period) and learning rate: updates to 95% test
accuracy, and whether it diverges. Measured: the median over the cell's seeds that reached
95% (a cell none of whose seeds reached it is "not reached"), diverged when most seeds did.
"""

from __future__ import annotations

import statistics
from pathlib import Path

import pandas as pd

from sim.cost.convergence import Observation, fit_convergence, load_observations
from sim.io import atomic_write_text

HERE = Path(__file__).resolve().parent
RUNS = HERE / "results" / "sync_runs_cpu.csv"


def _cell(o: Observation) -> tuple[str, float, float]:
    return (o.kind, o.lr, float(o.period) if o.family == "local" else round(o.k))


def main() -> None:
    obs = load_observations(RUNS, 0.95)
    # a cell: the configured bound (not the measured mean staleness) and the straggler
    df = pd.read_csv(RUNS)
    rows_of = df[df.kind.isin(["ssp", "asp", "local-sgd", "bsp"])].reset_index()
    keys = [(o.kind, o.lr, o.period if o.family == "local" else rows_of.staleness[i],
             rows_of.straggler_factor[i]) for i, o in enumerate(obs)]
    rows = []
    for cell in sorted(set(keys), key=str):
        held = [o for o, k in zip(obs, keys, strict=True) if k == cell]
        rest = [o for o, k in zip(obs, keys, strict=True) if k != cell]
        family = held[0].family
        model = fit_convergence(rest, family)
        k = statistics.fmean(o.k for o in held)
        pred = model.predict(held[0].lr, k)
        reached = [o.updates for o in held if o.updates is not None and not o.diverged]
        measured = statistics.median(reached) if reached else None  # type: ignore[type-var]
        diverged = sum(o.diverged for o in held) > len(held) / 2
        err = None if measured is None or pred.diverges else pred.updates / measured - 1
        rows.append({"kind": cell[0], "lr": cell[1], "bound_or_period": cell[2],
                     "straggler": cell[3],
                     "family": family, "k_measured": k, "seeds": len(held),
                     "measured_updates_to_95": measured, "predicted_updates_to_95":
                     None if pred.diverges else pred.updates,
                     "band_low": None if pred.diverges else pred.low,
                     "band_high": None if pred.diverges else pred.high,
                     "relative_error": err, "measured_diverged": diverged,
                     "predicted_diverges": pred.diverges,
                     "verdict_right": diverged == pred.diverges})
    out = pd.DataFrame(rows)
    atomic_write_text(HERE / "results" / "sync_convergence.csv",
                      out.to_csv(index=False, float_format="%.4g"))
    errs = out.relative_error.dropna().abs()
    print(out.to_string(index=False))
    print(f"held-out cells with both a measurement and a prediction: {len(errs)}; median "
          f"|error| {errs.median():.1%}, worst {errs.max():.1%}; divergence verdict right in "
          f"{int(out.verdict_right.sum())} of {len(out)} cells")
    wrong = out[~out.verdict_right]
    print("held-out verdicts wrong:\n" + wrong[["kind", "lr", "bound_or_period", "straggler",
                                              "k_measured", "measured_diverged"]].to_string(
                                                  index=False))
    models = {f: fit_convergence(obs, f) for f in ("async", "local")}
    for family, m in models.items():
        print(f"{family}: log U = {m.coef[0]:.3f} {m.coef[1]:+.3f} log lr {m.coef[2]:+.3f} "
              f"log(1+k); sigma {m.sigma:.3f}; diverges when lr(1+k) > {m.threshold:.3g}")
    right = sum(models[r.family].predict(r.lr, r.k_measured).diverges == r.measured_diverged
                for r in out.itertuples())
    print(f"fitted on every cell: divergence verdict right in {right} of {len(out)} cells")


if __name__ == "__main__":
    main()
