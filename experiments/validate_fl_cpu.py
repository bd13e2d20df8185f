"""Real federated rounds on this CPU against the simulator's prediction of each round.

Run: ``.venv/bin/python experiments/validate_fl_cpu.py`` (about 6 minutes; ``--quick``:
two settings, 2 minutes). Writes ``experiments/results/fl_validation_cpu.csv``.
Target (issue 17): median |error| of the round time <= 15%.

Each setting is one real run (:func:`executor.federated.launch.execute_fl`): a server and
N client processes over gloo, FedAvg on a Dirichlet(1.0) split of the digits table, a
664 KB model (MLP 64-512-256-10), the server's ingress and egress and every client's up and
down link emulated by pacing (16 KB chunks, max-min fair with the clients' caps). The
clients each round sampled are the simulator's own draw (the same seed), so a round is
compared with the same round. Before the rounds every client process times its local
training (all at once, as in a round): those milliseconds per sample, the clients' link
rates and sample counts become the simulator's client trace (``train_factor = 1``: the
probe timed training, not inference). Every round counts, the first too (gloo's
connection set-up, 1-2 s unpaced, hides behind the paced transfers here).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

from executor.federated.launch import FLRun, execute_fl
from sim.federated import simulate_fl
from sim.io import atomic_write_text
from sim.spec.federated import FLJob, FLTraining, ServerSpec
from sim.spec.population import population_from_dict

ROOT = Path(__file__).resolve().parents[1]
HIDDEN = (512, 256)
SETTINGS = {  # name: (run fields)
    "contended-6": dict(population=6, processes=6, clients_per_round=4, overcommit=1.5,
                        server_ingress_Mbps=16, server_egress_Mbps=32,
                        client_up_Mbps=[2, 4, 8, 16, 3, 6],
                        client_down_Mbps=[8, 16, 32, 64, 12, 24]),
    "sampled-6-of-8": dict(population=8, processes=8, clients_per_round=3, overcommit=2.0,
                           server_ingress_Mbps=40, server_egress_Mbps=64,
                           client_up_Mbps=[3, 5, 8, 12, 20, 4, 6, 10],
                           client_down_Mbps=[20, 30, 40, 60, 80, 25, 35, 50]),
    "client-bound-5": dict(population=5, processes=5, clients_per_round=5, overcommit=1.0,
                           server_ingress_Mbps=1000, server_egress_Mbps=1000,
                           client_up_Mbps=[2, 3, 5, 8, 12],
                           client_down_Mbps=[10, 15, 20, 30, 40]),
    "compute-heavy-4": dict(population=4, processes=4, clients_per_round=3, overcommit=1.33,
                            local_epochs=8, server_ingress_Mbps=48, server_egress_Mbps=64,
                            client_up_Mbps=[8, 12, 16, 24],
                            client_down_Mbps=[32, 48, 64, 96]),
}
QUICK = ("contended-6", "compute-heavy-4")


def _job(run: FLRun, folder: Path, ms: dict[int, float], samples: dict[int, int]) -> FLJob:
    rows = pd.DataFrame({
        "client": range(run.population),
        "ms_per_sample": [ms.get(c, 1.0) for c in range(run.population)],
        "up_Mbps": [run.client_up_Mbps[c % len(run.client_up_Mbps)]
                    for c in range(run.population)],
        "down_Mbps": [run.client_down_Mbps[c % len(run.client_down_Mbps)]
                      for c in range(run.population)],
        "samples": [samples.get(c, 1) for c in range(run.population)]})
    path = folder / "trace.csv"
    rows.to_csv(path, index=False)
    pop = population_from_dict({"trace": str(path), "latency_ms": 0.0})
    params = 64 * HIDDEN[0] + HIDDEN[0] + HIDDEN[0] * HIDDEN[1] + HIDDEN[1] + HIDDEN[1] * 10 + 10
    tr = FLTraining(rounds=run.rounds, clients_per_round=run.clients_per_round,
                    overcommit=run.overcommit, local_steps=0,
                    local_epochs=float(run.local_epochs), model_MB=params * 4 / 1e6,
                    train_factor=1.0, seed=run.seed)
    server = ServerSpec(ingress_Gbps=run.server_ingress_Mbps / 1e3,
                        egress_Gbps=run.server_egress_Mbps / 1e3)
    return FLJob("real-run", pop, server, tr)


def one(name: str, fields: dict, rounds: int, folder: Path) -> pd.DataFrame:
    run = FLRun(rounds=rounds, alpha=1.0, hidden=HIDDEN, probe=True, eval_every=0, **fields)
    # the schedule: the simulator's draw of clients (independent of their speeds)
    plan = simulate_fl(_job(run, folder, {}, {}))
    run = dataclasses.replace(run, schedule=[ids.tolist() for ids in plan.sampled_ids])
    t = time.time()
    real = execute_fl(run, timeout_s=180)
    wall = time.time() - t
    pred = simulate_fl(_job(run, folder, real["ms_per_sample"], real["samples"]))
    out = []
    for got, want in zip(real["rounds"], pred.rows, strict=True):
        out.append({"setting": name, "round": got["round"], "measured_s": got["duration_s"],
                    "predicted_s": want["duration_s"], "measured_collect_s": got["collect_s"],
                    "predicted_collect_s": want["collect_s"], "updates": len(got["used"]),
                    "sampled": len(got["sampled"]), "wall_s": wall})
    df = pd.DataFrame(out)
    df["error"] = df["predicted_s"] / df["measured_s"] - 1
    return df


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="two settings, fewer rounds")
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args(argv)
    names = QUICK if args.quick else tuple(SETTINGS)
    frames = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            df = one(name, SETTINGS[name], 8 if args.quick else args.rounds, Path(tmp))
            kept = df
            print(f"{name:16s} median |error| {kept['error'].abs().median():6.1%}, "
                  f"measured {kept['measured_s'].median():.3f} s, predicted "
                  f"{kept['predicted_s'].median():.3f} s (run {df['wall_s'].iloc[0]:.0f} s)",
                  flush=True)
            frames.append(df)
    df = pd.concat(frames, ignore_index=True)
    med = float(df["error"].abs().median())
    print(f"all: median |error| {med:.1%} over {len(df)} rounds (target <= 15%)")
    if not args.quick:
        atomic_write_text(ROOT / "experiments" / "results" / "fl_validation_cpu.csv",
                          df.to_csv(index=False))
    return 0 if med <= 0.15 else 1


if __name__ == "__main__":
    sys.exit(main())
