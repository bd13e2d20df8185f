"""Predicted vs published iteration time for Megatron-LM SC'21 Table 1 (analytic tier).

Run: ``.venv/bin/python experiments/validate_megatron.py [--fit]``. Writes
``experiments/results/megatron_table1_validation.csv`` and prints the table and summary.
The published iteration time is derived from the paper's TFLOP/s per GPU with its Eq. 3
(``experiments/data/megatron_table1.csv``, column ``DERIVED_iter_time_s_from_eq3``).

``--fit`` re-derives the one fitted A100 number, ``gemm_dim_half`` in
``sim/data/hardware.csv``: a grid search minimising the mean |error| over the ten rows,
plus a leave-one-out check (fit on nine rows, predict the tenth) to show how much of the
agreement is in-sample.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))

from megatron_sc21 import eq3_flops, load_rows, row_cluster, row_model, row_plan  # noqa: E402

from sim.api import simulate
from sim.io import atomic_write_text  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
GRID = range(20, 401, 10)


def _predict(row: dict, dim_half: float | None = None, fidelity: str = "analytic"
             ) -> tuple[float, object]:
    cluster = row_cluster(row)
    if dim_half is not None:
        cluster = dataclasses.replace(
            cluster, gpu=dataclasses.replace(cluster.gpu, gemm_dim_half=dim_half))
    res = simulate(row_model(row), cluster, row_plan(row), fidelity)
    return res.iteration_time_s, res


def validation_table(fidelity: str = "analytic") -> pd.DataFrame:
    rows = []
    for row in load_rows():
        plan = row_plan(row)
        predicted, res = _predict(row, fidelity=fidelity)
        published = float(row["DERIVED_iter_time_s_from_eq3"])
        gpus = int(row["gpus"])
        rows.append({
            "params_B": float(row["params_B"]), "gpus": gpus, "tp": plan.tp, "pp": plan.pp,
            "dp": plan.dp, "vpp": plan.vpp, "batch": plan.global_batch_size,
            "published_iter_s": published, "predicted_iter_s": predicted,
            "error_pct": 100 * (predicted - published) / published,
            "published_tflops_per_gpu": float(row["tflops_per_gpu"]),
            "predicted_tflops_per_gpu": eq3_flops(row) / predicted / gpus / 1e12,
            "predicted_bubble": res.bubble_fraction,  # type: ignore[attr-defined]
            "peak_memory_gib": res.peak_memory_gib})  # type: ignore[attr-defined]
    return pd.DataFrame(rows)


def _errors(rows: list[dict], dim_half: float) -> list[float]:
    out = []
    for row in rows:
        published = float(row["DERIVED_iter_time_s_from_eq3"])
        out.append(abs(_predict(row, dim_half)[0] - published) / published * 100)
    return out


def fit() -> None:
    rows = load_rows()
    table = {d: _errors(rows, d) for d in GRID}
    best = min(GRID, key=lambda d: sum(table[d]))
    print(f"best gemm_dim_half = {best}: mean |error| {sum(table[best]) / len(rows):.1f}%, "
          f"worst {max(table[best]):.1f}%")
    loo = []
    for i, row in enumerate(rows):
        d = min(GRID, key=lambda d: sum(e for j, e in enumerate(table[d]) if j != i))
        loo.append(table[d][i])
        print(f"  leave out {row['params_B']:>6}B: fit {d:3d}, held-out |error| {table[d][i]:.1f}%")
    print(f"leave-one-out: mean |error| {sum(loo) / len(loo):.1f}%, worst {max(loo):.1f}%")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fit", action="store_true", help="re-fit gemm_dim_half (A100)")
    parser.add_argument("--fidelity", choices=["analytic", "des"], default="analytic")
    args = parser.parse_args()
    if args.fit:
        fit()
        return
    df = validation_table(args.fidelity)
    suffix = "" if args.fidelity == "analytic" else "_des"
    out = RESULTS / f"megatron_table1_validation{suffix}.csv"
    atomic_write_text(out, df.to_csv(index=False, float_format="%.4g"))
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(df.round(3).to_string(index=False))
    err = df["error_pct"].abs()
    print(f"\nmean |error| = {err.mean():.1f}%   worst = {err.max():.1f}% "
          f"(params {df.loc[err.idxmax(), 'params_B']}B)   wrote {out}")


if __name__ == "__main__":
    main()
