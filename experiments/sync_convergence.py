"""The statistical-efficiency model against held-out measured runs (issue 16).

Run: ``.venv/bin/python experiments/sync_convergence.py`` (seconds; it reads the runs of
``experiments/sync_runs_cpu.py`` the bundled model is fitted to,
``sim/data/convergence/digits_cpu.csv``). Writes ``experiments/results/sync_convergence.csv``
(``--task cancer``: the cancer-cpu model's runs, ``sync_convergence_cancer.csv``).

Leave one configuration out: a configuration is a (strategy with its staleness bound,
period, graph or straggler; learning rate) cell of the measured grids, over its seeds. For
each cell the model of its family (``sim.cost.convergence``) is fitted to every *other*
cell's runs and predicts this one from its k (measured mean staleness, period, dropped
gradients or graph mixing) and learning rate: updates to 95% test
accuracy, and whether it diverges. Measured: the median over the cell's seeds that reached
95% (a cell none of whose seeds reached it is "not reached"), diverged when most seeds did.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import pandas as pd

from sim.cost.convergence import BUNDLED, Observation, fit_convergence, load_observations
from sim.errors import SpecError
from sim.io import atomic_write_text

HERE = Path(__file__).resolve().parent


def _held_out(obs: list[Observation], keys: list[tuple], cell: tuple, grid: str
              ) -> dict[str, object]:
    """``cell`` predicted by its family's model fitted to every other cell."""
    held = [o for o, k in zip(obs, keys, strict=True) if k == cell]
    rest = [o for o, k in zip(obs, keys, strict=True) if k != cell]
    family = held[0].family
    row: dict[str, object] = {"kind": cell[0], "lr": cell[1], "strategy": cell[2],
                              "grid": grid, "family": family, "seeds": len(held)}
    try:
        model = fit_convergence(rest, family)
    except SpecError as exc:  # too few of the family's other cells reached the target
        return {**row, "no_model": str(exc)}
    k = statistics.fmean(o.k for o in held)
    pred = model.predict(held[0].lr, k)
    reached = [o.updates for o in held if o.updates is not None and not o.diverged]
    measured = statistics.median(reached) if reached else None  # type: ignore[type-var]
    diverged = sum(o.diverged for o in held) > len(held) / 2
    err = None if measured is None or pred.diverges else pred.updates / measured - 1
    return {**row, "k_measured": k, "measured_updates_to_95": measured,
            "predicted_updates_to_95": None if pred.diverges else pred.updates,
            "band_low": None if pred.diverges else pred.low,
            "band_high": None if pred.diverges else pred.high,
            "relative_error": err, "measured_diverged": diverged,
            "predicted_diverges": pred.diverges, "verdict_right": diverged == pred.diverges}


def _report(out: pd.DataFrame) -> None:
    errs = out.relative_error.dropna().abs()
    print(out.to_string(index=False))
    judged = out[out.verdict_right.notna()]
    print(f"held-out cells with both a measurement and a prediction: {len(errs)}; median "
          f"|error| {errs.median():.1%}, worst {errs.max():.1%}; divergence verdict right in "
          f"{int(judged.verdict_right.astype(bool).sum())} of {len(judged)} cells"
          f" ({len(out) - len(judged)} without a model: too few other cells reached 95%)")
    grid = judged[judged.grid == "staleness"]
    print(f"  the staleness x learning-rate grid (SSP): verdict right in "
          f"{int(grid.verdict_right.astype(bool).sum())} of {len(grid)} cells")
    for family, part in out.groupby("family"):
        e = part.relative_error.dropna().abs()
        if len(e):
            print(f"  {family}: median |error| {e.median():.1%} over {len(e)} cells")
    wrong = judged[~judged.verdict_right.astype(bool)]
    print("held-out verdicts wrong:\n" + wrong[["strategy", "lr", "k_measured",
                                              "measured_diverged"]].to_string(index=False))


def _fitted_on_all(obs: list[Observation], out: pd.DataFrame) -> None:
    models = {}
    for f in sorted({o.family for o in obs}):
        try:
            models[f] = fit_convergence(obs, f)
        except SpecError as exc:
            print(f"{f}: no model ({exc})")
    for family, m in models.items():
        print(f"{family}: log U = {m.coef[0]:.3f} {m.coef[1]:+.3f} log lr {m.coef[2]:+.3f} "
              f"log(1+k); sigma {m.sigma:.3f}; diverges when lr(1+k)^{m.gamma:g} > "
              f"{m.threshold:.3g}")
    judged = [r for r in out.itertuples() if r.family in models and pd.notna(r.k_measured)]
    right = sum(models[r.family].predict(r.lr, r.k_measured).diverges == r.measured_diverged
                for r in judged)
    print(f"fitted on every cell: divergence verdict right in {right} of {len(judged)} cells")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--task", choices=("digits", "cancer"), default="digits",
                    help="whose bundled runs (default digits)")
    task = ap.parse_args().task
    # the bundled runs (sync_runs_cpu.py writes them); a cell is a configured strategy
    # (its label names the bound, period, graph or straggler) at one learning rate
    fitted = BUNDLED / f"{task}_cpu.csv"
    obs = load_observations(fitted, 0.95)
    df = pd.read_csv(fitted)
    keys = [(o.kind, o.lr, label) for o, label in zip(obs, df.strategy, strict=True)]
    grid_of = dict(zip(df.strategy, df.grid, strict=True))
    out = pd.DataFrame([_held_out(obs, keys, cell, grid_of[cell[2]])
                        for cell in sorted(set(keys), key=str)])
    tag = "" if task == "digits" else f"_{task}"
    atomic_write_text(HERE / "results" / f"sync_convergence{tag}.csv",
                      out.to_csv(index=False, float_format="%.4g"))
    _report(out)
    _fitted_on_all(obs, out)


if __name__ == "__main__":
    main()
