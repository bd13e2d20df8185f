"""How long ``trainsim fl`` takes for 10,000 clients x 100 rounds on one core.

Run: ``.venv/bin/python experiments/bench_fl.py`` (about a minute). Writes
``experiments/results/bench_fl.csv``. Target (issue 17): <= 30 s.

The population is the ``fl:mobile`` preset's (10,000 clients); FedAvg rounds with the
server's link shared, at 100 and 1,000 updates a round (x1.3 sampled) and with every
client sampled every round (7,692 x 1.3, rounded up: 10,000), plus FedBuff (100 server steps of 100
updates, 1,300 training at once). Each case runs once, timed with its wall clock and
also as a ratio to a bare Python loop of 10^7 additions timed in the same run (the
machines are noisy: the ratio travels, the seconds do not).
"""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path

import pandas as pd

from sim.federated import simulate_fl
from sim.io import atomic_write_text
from sim.spec.federated import load_fl

ROOT = Path(__file__).resolve().parents[1]


def bare_loop() -> float:
    t = time.perf_counter()
    x = 0
    for i in range(10_000_000):
        x += i
    return time.perf_counter() - t


def main() -> int:
    base = load_fl("fl:mobile")
    cases = [("fedavg", 100, {}), ("fedavg", 1000, {}), ("fedavg", 7692, {}),
             ("fedbuff", 100, {"concurrency": 1300})]
    loop = bare_loop()
    rows = []
    for strategy, k, extra in cases:
        tr = dataclasses.replace(base.training, strategy=strategy, clients_per_round=k,
                                 rounds=100, **extra)
        job = dataclasses.replace(base, training=tr)
        t = time.perf_counter()
        res = simulate_fl(job)
        wall = time.perf_counter() - t
        rows.append({"strategy": strategy, "clients": job.population.clients,
                     "rounds": len(res.rows), "updates_per_round": k,
                     "sampled_per_round": tr.in_flight if strategy == "fedbuff"
                     else tr.sampled, "wall_s": wall, "bare_loop_s": loop,
                     "ratio_to_bare_loop": wall / loop, "target_s": 30.0})
        print(f"{strategy:8s} K={k:5d}: {wall:6.2f} s ({wall / loop:.1f} bare loops)",
              flush=True)
    df = pd.DataFrame(rows)
    atomic_write_text(ROOT / "experiments" / "results" / "bench_fl.csv",
                      df.to_csv(index=False))
    return 0 if (df["wall_s"] <= 30).all() else 1


if __name__ == "__main__":
    sys.exit(main())
