"""Calibrating on Megatron-LM SC'21 Table 1 (issue 19): leave one out, and each row alone.

Run: ``.venv/bin/python experiments/calibrate_sc21.py`` (about a minute). Writes
``experiments/results/calibrate_sc21.csv``.

The ten rows of Table 1 (the published iteration times derived with the paper's Eq. 3,
``experiments/data/megatron_table1.csv``), predicted by the analytic tier:

- uncalibrated: the catalog as it ships (its one A100 number, ``gemm_dim_half``, was fitted
  to these rows, so this is in-sample);
- leave-one-out: the four factors (GEMM, attention, HBM and collective efficiencies) fitted
  to nine rows with the default prior (0.05), the tenth predicted;
- calibrate on one: each row alone as the calibration, the other nine predicted (mean and
  worst |error|): what a user with one measured run of this stack gets.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))

from megatron_sc21 import load_rows, row_cluster, row_model, row_plan  # noqa: E402

from optimizer.calibrate import Run, calibrate_on_one, leave_one_out  # noqa: E402
from sim import simulate  # noqa: E402
from sim.io import atomic_write_text  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


def runs() -> list[Run]:
    return [Run(row_model(r), row_cluster(r), row_plan(r),
                float(r["DERIVED_iter_time_s_from_eq3"]), f"{r['params_B']}B")
            for r in load_rows()]


def main() -> int:
    rs = runs()
    base = [simulate(r.model, r.cluster, r.plan).iteration_time_s / r.measured_s - 1
            for r in rs]
    loo = leave_one_out(rs)
    one = calibrate_on_one(rs)
    df = pd.DataFrame({"row": [r.label for r in rs], "uncalibrated_error": base,
                       "loo_error": [x["held_out_error"] for x in loo],
                       "on_one_others_mean": [x["mean_error"] for x in one],
                       "on_one_others_worst": [x["worst_error"] for x in one]})
    print(df.to_string(index=False, float_format=lambda x: f"{x:+.1%}"))
    print(f"uncalibrated mean |error| {np.mean(np.abs(base)):.1%}; leave-one-out "
          f"{df['loo_error'].abs().mean():.1%} (worst {df['loo_error'].abs().max():.1%}); "
          f"calibrated on one row: others {df['on_one_others_mean'].mean():.1%} mean, "
          f"worst {df['on_one_others_worst'].max():.1%}")
    atomic_write_text(RESULTS / "calibrate_sc21.csv", df.to_csv(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
