"""The 200-point sweep of ``bench_sweep.py`` on a real local Ray cluster with 2 workers,
beside the local pool's 2 processes.

Run: ``.venv/bin/python experiments/bench_ray_sweep.py`` (needs the ``sweep-ray`` extra). It
starts a head node (``ray start --head --num-cpus 2``), runs the same ``trainsim sweep``
command with ``--ray 127.0.0.1:PORT`` and with ``--workers 2``, checks that both write the
same results byte for byte, stops the cluster, prints both wall times and writes
``experiments/results/bench_ray_sweep.csv``.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "experiments"))

from bench_sweep import GRID, same_files  # noqa: E402

RAY = str(Path(sys.executable).parent / "ray")


def command(out: Path, where: list[str]) -> list[str]:
    return [sys.executable, "-m", "trainsim", "sweep", "--model", "llama3-8b", "--cluster",
            "dgx-h100:4", "--global-batch-size", "64", "--seq-len", "4096", "--fidelity", "des",
            *GRID, *where, "--no-progress", "--out", str(out)]


def timed(out: Path, where: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(command(out, where), cwd=ROOT, check=True, capture_output=True)
    return time.perf_counter() - t0


def main() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "PYTHONPATH": os.pathsep.join([str(ROOT),
                                                        os.environ.get("PYTHONPATH", "")])}
    t0 = time.perf_counter()
    subprocess.run([RAY, "start", "--head", f"--port={port}", "--num-cpus=2",
                    "--include-dashboard=false", "--disable-usage-stats"], check=True,
                   capture_output=True, env=env)
    start_s = time.perf_counter() - t0
    try:
        with tempfile.TemporaryDirectory() as tmp:
            ray_s = timed(Path(tmp) / "ray", ["--ray", f"127.0.0.1:{port}"])
            pool_s = timed(Path(tmp) / "pool", ["--workers", "2"])
            same = same_files(Path(tmp) / "ray", Path(tmp) / "pool")
    finally:
        subprocess.run([RAY, "stop", "--force"], capture_output=True)
    print(f"200 DES points: Ray cluster (2 workers) {ray_s:.1f} s (+ {start_s:.1f} s to start "
          f"it), local pool (2 processes) {pool_s:.1f} s; identical results: {same}")
    pd.DataFrame([{"engine": "ray-cluster", "workers": 2, "wall_s": round(ray_s, 2),
                   "start_s": round(start_s, 2), "identical": same},
                  {"engine": "local-pool", "workers": 2, "wall_s": round(pool_s, 2),
                   "start_s": 0.0, "identical": same}]).to_csv(
        ROOT / "experiments" / "results" / "bench_ray_sweep.csv", index=False)
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
