"""FedScale's round formula, reproduced exactly, then what a shared server link changes.

Run: ``.venv/bin/python experiments/fl_fedscale.py`` (about half a minute). Writes
``experiments/results/fl_fedscale.csv`` and ``experiments/results/fl_contention.csv`` and
a figure beside them.

1. **Bit for bit.** A synthetic trace of 2,000 clients (inference latency per sample and
   one bandwidth each, the same up and down as in FedScale's device profiles) is written
   as a trace CSV and simulated with ``network = "scalar"`` (no latency, no dropouts, every
   client online). Independently, every round's sampled clients are put through FedScale's
   own round arithmetic, written out here from its aggregator and client metadata (the
   ``get_completion_time`` and ``tictak_client_tasks`` of FedScale's cloud package):
   ``computation = 3 x batch x local_steps x ms_per_sample / 1000``,
   ``communication = (upload + download) / bandwidth``, the clients sorted by their sum
   (a stable sort), the round lasting until the K-th. Every round duration and every kept
   client's time must be the same double.
2. **Contention.** The same population (20,000 clients, lognormal bandwidths), 100, 1,000
   and 10,000 updates a round (x1.3 sampled) with the server's 10 Gb/s ingress and egress
   shared max-min fairly (``shared``) against the scalar model: median round time of 20
   rounds each.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

from sim.federated import simulate_fl
from sim.io import atomic_write_text
from sim.spec.federated import FLJob, FLTraining, ServerSpec
from sim.spec.population import Population, population_from_dict

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "experiments" / "results"


def fedscale_round(ms: np.ndarray, bw: np.ndarray, ids: np.ndarray, batch: int,
                   steps: int, size: float, k: int) -> tuple[float, list[float]]:
    """FedScale's arithmetic for one round's sample ``ids`` (sizes and bandwidth in any
    one unit): its round duration and the kept clients' times in order."""
    completion = []
    for c in ids:
        computation = 3.0 * batch * steps * float(ms[c]) / 1000.
        communication = (size + size) / float(bw[c])
        completion.append(computation + communication)
    order = sorted(range(len(completion)), key=lambda i: completion[i])
    top = order[:min(k, len(completion))]
    return completion[top[-1]], [completion[i] for i in top]


def bit_for_bit(folder: Path) -> pd.DataFrame:
    rng = np.random.default_rng(7)
    n = 2000
    trace = pd.DataFrame({"client": np.arange(n),
                          "ms_per_sample": rng.lognormal(np.log(30), 0.7, n),
                          "up_Mbps": (bw := rng.lognormal(np.log(8), 0.9, n)),
                          "down_Mbps": bw})
    path = folder / "trace.csv"
    trace.to_csv(path, index=False)
    pop = population_from_dict({"trace": str(path), "latency_ms": 0.0})
    tr = FLTraining(rounds=50, clients_per_round=100, overcommit=1.3, local_steps=20,
                    batch_size=20, model_MB=12.5, network="scalar", seed=3)
    res = simulate_fl(FLJob("fedscale-synthetic", pop, ServerSpec(), tr))
    arrays = pop.arrays(tr.seed)
    rows = []
    for r, ids in zip(res.rows, res.sampled_ids, strict=True):
        dur, kept = fedscale_round(arrays.ms_per_sample, arrays.up_Bps, ids, tr.batch_size,
                                   tr.local_steps, tr.model_bytes, tr.clients_per_round)
        ours = res.client_s[r["round"]]
        rows.append({"round": r["round"], "fedscale_s": dur, "trainsim_s": r["collect_s"],
                     "same_duration": dur == r["collect_s"],
                     "same_kept_times": list(ours) == kept,
                     "max_abs_diff_s": float(np.max(np.abs(np.asarray(kept) - ours)))})
    return pd.DataFrame(rows)


def contention() -> pd.DataFrame:
    pop = Population(clients=20_000, latency_ms=50.0)
    rows = []
    for k in (100, 1000, 10_000):
        for net in ("scalar", "shared"):
            tr = FLTraining(rounds=20, clients_per_round=k, network=net, seed=1)
            res = simulate_fl(FLJob("contention", pop, ServerSpec(), tr))
            rows.append({"clients_per_round": k, "sampled": tr.sampled, "network": net,
                         "median_round_s": float(np.median(res.round_times())),
                         "p90_round_s": float(np.percentile(res.round_times(), 90)),
                         "wall_s": res.wall_s})
    df = pd.DataFrame(rows)
    wide = df.pivot(index="clients_per_round", columns="network", values="median_round_s")
    df["shared_over_scalar"] = df["clients_per_round"].map(wide["shared"] / wide["scalar"])
    return df


def figure(df: pd.DataFrame, path: Path) -> None:
    import matplotlib.pyplot as plt

    from trainsim.plots.output import save_figure

    fig, ax = plt.subplots(figsize=(6.5, 4))
    for net, sub in df.groupby("network"):
        ax.plot(sub["clients_per_round"], sub["median_round_s"], marker="o",
                label=f"{net} server link")
    ax.set_xscale("log")
    ax.set_xlabel("Updates a round (clients, x1.3 sampled)")
    ax.set_ylabel("Median round time (s)")
    ax.set_title("FedAvg round time: server link shared vs FedScale's scalar model")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    save_figure(fig, path)


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        exact = bit_for_bit(Path(tmp))
    same = int((exact["same_duration"] & exact["same_kept_times"]).sum())
    print(f"FedScale's round formula: {same}/{len(exact)} rounds identical to the last bit "
          f"(largest difference {exact['max_abs_diff_s'].max():.3g} s)")
    cont = contention()
    print(cont.to_string(index=False, float_format=lambda x: f"{x:.4g}"))
    RESULTS.mkdir(parents=True, exist_ok=True)
    atomic_write_text(RESULTS / "fl_fedscale.csv", exact.to_csv(index=False))
    atomic_write_text(RESULTS / "fl_contention.csv", cont.to_csv(index=False))
    figure(cont, RESULTS / "fl_contention.png")
    return 0 if same == len(exact) else 1


if __name__ == "__main__":
    sys.exit(main())
