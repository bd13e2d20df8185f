"""How well the fitted alpha-beta reproduces each measured gloo point (CPU profile).

Run: ``.venv/bin/python experiments/validate_comm_fit_cpu.py [--db DIR]``. Reads the DB's
``comm.csv`` (measurements) and ``comm_fit.csv`` (piecewise alpha-beta) and writes
``experiments/results/comm_fit_cpu.csv`` with the error of every point; the summary covers
messages of at least 64 KiB (the target: every one within 15%).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from profiler.db import read_table
from sim.cost.profile_db import segment_time
from sim.io import atomic_write_text
from sim.spec.cluster import shipped_cpu_profile

OUT = Path(__file__).resolve().parent / "results" / "comm_fit_cpu.csv"


def table(db: Path) -> pd.DataFrame:
    comm, fit = read_table(db, "comm"), read_table(db, "comm_fit")
    rows = []
    for r in comm.itertuples(index=False):
        part = fit[(fit["collective"] == r.collective) & (fit["group_size"] == r.group_size)]
        segments = sorted(zip(part["min_size_bytes"], part["alpha_s"], part["beta_s_per_byte"],
                              strict=True))
        predicted = segment_time(segments, r.size_bytes)
        rows.append({"collective": r.collective, "group_size": r.group_size,
                     "size_bytes": r.size_bytes, "measured_us": r.time_median_s * 1e6,
                     "fitted_us": predicted * 1e6,
                     "error_pct": 100 * (predicted - r.time_median_s) / r.time_median_s})
    return pd.DataFrame(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", default=shipped_cpu_profile(), help="profile DB (device folder)")
    df = table(Path(ap.parse_args().db))
    atomic_write_text(OUT, df.to_csv(index=False, float_format="%.4g"))
    big = df[df["size_bytes"] >= 64 * 1024]
    summary = big.assign(abs_err=big["error_pct"].abs()).groupby("collective")["abs_err"]
    print(summary.agg(["count", "mean", "max"]).round(1).to_string())
    print(f"messages >= 64 KiB: worst |error| {big['error_pct'].abs().max():.1f}% over "
          f"{len(big)} points (target <= 15%)")


if __name__ == "__main__":
    main()
