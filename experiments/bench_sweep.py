"""Sweep benchmark: 200 DES points of llama3-8b on dgx-h100:4, uninterrupted and killed.

Run: ``.venv/bin/python experiments/bench_sweep.py [--seed 0] [--workers 2]``. It runs the
same ``trainsim sweep`` command three times: once to the end (timed); once killed with
SIGKILL (the whole process group: parent and workers) after a seeded random number of
finished points plus a seeded random delay; and once more, restarted with the same command,
which resumes. It prints the figures, checks that the resumed sweep's results.json,
results.csv and summary.json equal the uninterrupted run's byte for byte, and writes
``experiments/results/bench_sweep.csv``.

The grid (5 NIC rates x 5 NVLink rates x tp 1/2/4/8 x pp 1/2, dp filling the 32 GPUs,
batch 64 x 4096 tokens) is what one would sweep to see where llama3-8b stops being
network-bound on this cluster.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "experiments" / "results"
GRID = ["--vary", "inter_node.nic_Gbps=100,200,400,800,1600",
        "--vary", "intra_node.bandwidth_GBps=100,200,300,450,900",
        "--vary", "tp=1,2,4,8", "--vary", "pp=1,2"]


def command(out: Path, workers: int) -> list[str]:
    return [sys.executable, "-m", "trainsim", "sweep", "--model", "llama3-8b", "--cluster",
            "dgx-h100:4", "--global-batch-size", "64", "--seq-len", "4096", "--fidelity", "des",
            *GRID, "--workers", str(workers), "--no-progress", "--out", str(out)]


def finished(out: Path) -> int:
    path = out / "points.jsonl"
    return max(0, path.read_bytes().count(b"\n") - 1) if path.exists() else 0


def timed_run(out: Path, workers: int) -> float:
    t0 = time.perf_counter()
    subprocess.run(command(out, workers), cwd=ROOT, check=True, capture_output=True)
    return time.perf_counter() - t0


def killed_run(out: Path, workers: int, rng: random.Random, total: int) -> tuple[int, float]:
    """Start the sweep, SIGKILL its process group after a random point; (points, seconds)."""
    target, delay_s = rng.randint(1, total - 1), rng.uniform(0.0, 0.5)
    t0 = time.perf_counter()
    proc = subprocess.Popen(command(out, workers), cwd=ROOT, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while finished(out) < target and proc.poll() is None:
        time.sleep(0.02)
    time.sleep(delay_s)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    return finished(out), time.perf_counter() - t0


def same_files(a: Path, b: Path) -> bool:
    return all((a / n).read_bytes() == (b / n).read_bytes()
               for n in ("results.json", "results.csv", "summary.json"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0, help="picks the kill point")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    total = 5 * 5 * 4 * 2
    with tempfile.TemporaryDirectory() as tmp:
        whole, cut = Path(tmp) / "whole", Path(tmp) / "killed"
        whole_s = timed_run(whole, args.workers)
        at_kill, before_kill_s = killed_run(cut, args.workers, random.Random(args.seed), total)
        restart_s = timed_run(cut, args.workers)
        equal = same_files(whole, cut)
        rows = pd.read_csv(whole / "results.csv")
    ok = int((rows["status"] == "ok").sum())
    record = {"points": total, "simulated": ok, "workers": args.workers,
              "uninterrupted_s": round(whole_s, 1), "seed": args.seed,
              "points_at_kill": at_kill, "killed_after_s": round(before_kill_s, 1),
              "restart_s": round(restart_s, 1), "results_equal": equal,
              "load_avg_1min": round(os.getloadavg()[0], 2)}
    RESULTS.mkdir(exist_ok=True)
    pd.DataFrame([record]).to_csv(RESULTS / "bench_sweep.csv", index=False)
    print(f"{total} DES points ({ok} simulated, {total - ok} invalid), {args.workers} workers: "
          f"uninterrupted {whole_s:.1f} s (target <= 120 s)")
    print(f"killed (SIGKILL, seed {args.seed}) after {before_kill_s:.1f} s with {at_kill} "
          f"points on disk; restarted: {restart_s:.1f} s for the other {total - at_kill}")
    print(f"final results equal to the uninterrupted run: {equal}")
    if not equal:
        sys.exit(1)


if __name__ == "__main__":
    main()
