"""A copy of the shipped CPU profile with rows added, for cost-model tests."""

import csv
import shutil
from pathlib import Path

from sim.cost.profile_db import COMPUTE_COLUMNS

SHIPPED = Path(__file__).resolve().parents[2] / "sim" / "data" / "profiles" / "cpu-amd-epyc"


def profile_copy(folder: Path, rows=(), comm: bool = True) -> Path:
    """``folder``: the shipped CPU profile with ``rows`` appended to its compute table
    (missing columns 0); without its collective fit unless ``comm``."""
    shutil.copytree(SHIPPED, folder)
    if not comm:
        (folder / "comm_fit.csv").unlink()
        (folder / "comm_insitu.csv").unlink()
    with (folder / "compute.csv").open("a", newline="") as f:
        w = csv.DictWriter(f, COMPUTE_COLUMNS)
        for r in rows:
            w.writerow({c: r.get(c, 0) for c in COMPUTE_COLUMNS})
    return folder
