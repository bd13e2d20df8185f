"""Predicted vs measured throughput of real synchronisation runs on this CPU (issue 16).

Run: ``.venv/bin/python experiments/validate_sync_cpu.py [--repeats 3]`` (about 2 minutes a
repeat). Writes ``experiments/results/sync_validation_cpu.csv``.

Four workers train the digits MLP (batch 32 each, lr 0.1, 300 steps) under BSP (gloo
all-reduce), local SGD (H = 8), D-PSGD on a ring, ASP and SSP(2) over one parameter server,
and BSP over two server shards. Each torchrun start first **profiles its own ranks**
(``executor/sync/probe.py``: a worker's local step with every worker stepping, a one-way
message of the gradient, an all-reduce over the workers, a server's whole handling of one
push), and the multi-step DES predicts each strategy from that profile alone: the local step
and the all-reduce as measured, the loopback latency set so one message takes the measured
time, the servers' CPU time per push the measured handling. The runs are then compared with the
predictions: updates/s in each strategy's scope and the servers' mean staleness.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from executor.launch import launch
from executor.sync.launch import summarize_sync
from executor.sync.task import load_task, mlp
from profiler.graph.trace import trace_module
from sim.io import atomic_write_text
from sim.spec.cluster import load_cluster
from sim.spec.plan import Plan
from sim.spec.scenario import apply_cluster_edits
from sim.strategies import simulate_sync

RESULTS = Path(__file__).resolve().parent / "results"
N, BATCH, STEPS, LR = 4, 32, 300, 0.1
PS1, PS2 = {"architecture": "ps", "servers": 1, "placement": "colocated"}, \
    {"architecture": "ps", "servers": 2, "placement": "colocated"}
WORLDS = [  # strategies sharing one torchrun start (same ranks)
    [("BSP", "bsp", "auto"), ("local SGD H=8", {"kind": "local-sgd", "period": 8}, "auto"),
     ("D-PSGD ring", "gossip", "auto")],
    [("ASP", "asp", PS1), ("SSP(2)", {"kind": "ssp", "staleness": 2}, PS1)],
    [("BSP, 2 server shards", "bsp", PS2)]]


def _plan(sync: object, comm: object) -> Plan:
    return Plan(global_batch_size=N * BATCH, seq_len=1, dp=N, dtype="fp32",
                sync=sync, communication=comm)  # type: ignore[arg-type]


def _world(world: list[tuple[str, object, object]], reps: int) -> tuple[dict, list[dict]]:
    plans = [_plan(s, c) for _, s, c in world]
    servers = plans[0].communication.servers if plans[0].sync.kind != "bsp" or \
        plans[0].communication.architecture == "ps" else 0
    base = {"task": "digits", "hidden": [64], "steps": STEPS, "eval_every": STEPS,
            "device": "cpu", "threads": 1, "timeout_s": 120, "lr": LR, "seed": 0,
            "plan": plans[0].to_dict(),
            "runs": [{"probe": reps}] + [{"plan": p.to_dict()} for p in plans]}
    ranks = launch("executor.sync.worker", base, N + servers, 120.0, 1)
    prof = [r["runs"][0] for r in ranks]
    profile = {"step_s": statistics.median(r["step_s"] for r in prof if "step_s" in r),
               "allreduce_s": statistics.median(r["allreduce_s"] for r in prof
                                                if "allreduce_s" in r),
               "p2p_s": next(r["p2p_s"] for r in prof if "p2p_s" in r),
               "apply_s": max((r["apply_s"] for r in prof if "apply_s" in r), default=None),
               "service_s": next((r["service_s"] for r in prof if "service_s" in r), None),
               "numel": prof[0]["numel"]}
    runs = [summarize_sync([r["runs"][i + 1] for r in ranks], p, {**base, "plan": p.to_dict()})
            for i, p in enumerate(plans)]
    return profile, runs


def _predict(label: str, p: Plan, profile: dict[str, Any], workload: Any) -> Any:
    payload = profile["numel"] * 4
    cluster = load_cluster(f"cpu:{N}")
    bw = cluster.intra_node.bandwidth_GBps * 1e9
    lat_us = max(1.0, (profile["p2p_s"] - payload / bw) * 1e6)
    cluster = apply_cluster_edits(cluster, [("intra_node.latency_us", lat_us)])
    if profile["service_s"]:  # a server's whole handling of a push, as its CPU time
        shard = payload / p.communication.servers
        d = p.to_dict()
        d["communication"] = {**d["communication"],
                              "server_cpu_GBps": shard / profile["service_s"] / 1e9}
        p = Plan.from_dict(d)
    return simulate_sync(workload, cluster, p, "des", steps=STEPS, measured={
        "step_s": profile["step_s"], "allreduce_s": profile["allreduce_s"]})


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--reps", type=int, default=200, help="probe repetitions")
    args = ap.parse_args()
    task = load_task("digits")
    workload = trace_module(mlp(task, (64,), 0), torch.zeros(BATCH, 64), "digits-mlp")
    rows = []
    for rep in range(args.repeats):
        for world in WORLDS:
            profile, runs = _world(world, args.reps)
            for (label, s, c), r in zip(world, runs, strict=True):
                pred = _predict(label, _plan(s, c), profile, workload)
                rows.append({"repeat": rep, "strategy": label,
                             "measured_updates_per_s": r["updates_per_s"],
                             "predicted_updates_per_s": pred.updates_per_s,
                             "error": pred.updates_per_s / r["updates_per_s"] - 1,
                             "measured_staleness": r["staleness"]["mean"],
                             "predicted_staleness": pred.staleness.get("mean"),
                             **{f"profile_{k}": v for k, v in profile.items()}})
                print(f"{rep} {label:22s} measured {r['updates_per_s']:8.1f} predicted "
                      f"{pred.updates_per_s:8.1f} ({rows[-1]['error']:+.1%}); staleness "
                      f"{r['staleness']['mean']:.2f} vs {pred.staleness.get('mean', 0):.2f}",
                      flush=True)
    df = pd.DataFrame(rows)
    errs = df.error.abs()
    print(f"median |error| {errs.median():.1%}, worst {errs.max():.1%} over {len(df)} runs")
    atomic_write_text(RESULTS / "sync_validation_cpu.csv", df.to_csv(index=False,
                                                                     float_format="%.5g"))


if __name__ == "__main__":
    main()
