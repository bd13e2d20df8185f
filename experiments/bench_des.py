"""Speed and memory of the discrete-event tier, and how its cost grows with the cluster.

Run: ``.venv/bin/python experiments/bench_des.py``. Prints, for the two reference cases of
the issue, wall time, simulation events, events/s, the events/s of a bare SimPy timeout
loop measured in the same run (and the ratio), and peak RSS (each case in a fresh process);
then simulates llama3-405b from 64 to 16,384 GPUs and writes
``experiments/results/des_scaling.csv`` and ``des_scaling.png`` (wall time vs GPUs).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import simpy

from sim.io import atomic_write_text

RESULTS = Path(__file__).resolve().parent / "results"
CASES = {
    "gpt3-175b on dgx-a100:128 (TP8 PP16 DP8, 1F1B, 64 micro-batches)": (
        "gpt3-175b", "dgx-a100:128",
        dict(global_batch_size=512, seq_len=2048, dp=8, tp=8, pp=16, recompute="full")),
    "llama3-405b on dgx-h100:2048 (16,384 GPUs, TP8 PP16 DP128, 7+14x8+7 layers)": (
        "llama3-405b", "dgx-h100:2048",
        dict(global_batch_size=2048, seq_len=8192, dp=128, tp=8, pp=16, recompute="full",
             sequence_parallel=True, layers_per_stage=[7] + [8] * 14 + [7])),
}
_CHILD = """
import json, resource, sys, time
from sim import Plan, load_cluster, load_model, simulate
model, cluster, plan = json.loads(sys.argv[1])
t0 = time.perf_counter()
r = simulate(load_model(model), load_cluster(cluster), Plan.from_dict(plan), "des")
wall = time.perf_counter() - t0
print(json.dumps({"wall_s": wall, "events": r.simulation["events"],
                  "iteration_s": r.iteration_time_s,
                  "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def run_case(model: str, cluster: str, plan: dict) -> dict:
    """One simulation in a fresh interpreter (so its peak RSS is its own)."""
    out = subprocess.run([sys.executable, "-c", _CHILD, json.dumps([model, cluster, plan])],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def bare_simpy_rate(n: int = 200_000) -> float:
    """Events per second of a SimPy process doing nothing but timeouts."""
    env = simpy.Environment()

    def loop() -> simpy.events.ProcessGenerator:
        for _ in range(n):
            yield env.timeout(1)

    env.process(loop())
    t0 = time.perf_counter()
    env.run()
    return n / (time.perf_counter() - t0)


def _stages(layers: int, pp: int) -> list[int]:
    base, extra = divmod(layers, pp)
    return [base + (1 if i < extra else 0) for i in range(pp)]


def scaling() -> pd.DataFrame:
    rows = []
    for gpus in (64, 256, 1024, 4096, 16384):
        pp = min(16, gpus // 8)
        dp = gpus // (8 * pp)
        plan = dict(global_batch_size=16 * dp, seq_len=8192, dp=dp, tp=8, pp=pp,
                    recompute="full", sequence_parallel=True,
                    layers_per_stage=_stages(126, pp))
        r = run_case("llama3-405b", f"dgx-h100:{gpus // 8}", plan)
        rows.append({"gpus": gpus, "pp": pp, "dp": dp, **r})
        print(f"  {gpus:6d} GPUs (PP{pp} DP{dp}): {r['wall_s']:6.2f} s wall, "
              f"{r['events']:7d} events, {r['rss_mib']:.0f} MiB", flush=True)
    return pd.DataFrame(rows)


def _plot(df: pd.DataFrame) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    ax.loglog(df["gpus"], df["wall_s"], "o-", label="DES wall time")
    ref = df["wall_s"].iloc[0] * df["gpus"] / df["gpus"].iloc[0]
    ax.loglog(df["gpus"], ref, "--", color="grey", label="linear in GPUs")
    ax.set_title("DES cost vs cluster size, healthy (llama3-405b)")
    ax.set_xlabel("GPUs (llama3-405b, TP8, PP up to 16, 16 micro-batches)")
    ax.set_ylabel("wall time (s)")
    ax.legend()
    fig.tight_layout()
    path = RESULTS / "des_scaling.png"
    fig.savefig(path, dpi=120)
    return path


def main() -> None:
    bare = bare_simpy_rate()
    print(f"bare SimPy timeout loop: {bare:,.0f} events/s")
    for label, (model, cluster, plan) in CASES.items():
        r = run_case(model, cluster, plan)
        rate = r["events"] / r["wall_s"]
        print(f"{label}: {r['wall_s']:.2f} s wall, iteration {r['iteration_s']:.3f} s, "
              f"{r['events']} events, {rate:,.0f} events/s ({rate / bare:.3f} of bare SimPy), "
              f"peak RSS {r['rss_mib']:.0f} MiB")
    print("scaling:")
    df = scaling()
    atomic_write_text(RESULTS / "des_scaling.csv", df.to_csv(index=False, float_format="%.4g"))
    print(f"wrote {_plot(df)}")


if __name__ == "__main__":
    main()
