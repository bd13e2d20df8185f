"""Predicted vs measured throughput of real synchronisation runs on this CPU (issue 16).

Run: ``.venv/bin/python experiments/validate_sync_cpu.py [--repeats 3] [--task
digits-resnet18]`` (about 2 minutes a repeat for digits, 3.5 for ResNet-18). Writes
``experiments/results/sync_validation_cpu.csv`` (``_digits-resnet18.csv`` for the graph
workload).

Four workers train the digits MLP (batch 32 each, lr 0.1, 300 steps; ResNet-18 on the digits
as 32 x 32 images: 40 steps, 10 probe repetitions) under BSP (gloo all-reduce), local SGD
(H = 8), D-PSGD on a ring, ASP and SSP(2) over one parameter server, and BSP over two server
shards. Each torchrun start first **profiles its own ranks**
(``executor/sync/probe.py``) with the real loop's code, every worker doing the same thing at
once (the runs put 4-6 processes on this host's 2 cores, and a primitive's time depends on
that): the whole local step (its times kept, not only their mean), BSP's reduction, a
neighbour exchange over the gossip graph, a one-way message while the other workers step
(each worker in turn: where the kernel places the processes moves it several-fold),
and a server's whole handling of a push while every worker pushes back to back. Means,
since throughput is a mean quantity.

The multi-step DES then predicts each strategy from that profile alone, nothing fitted to
the runs: every worker's local step is drawn from the measured steps (per worker and step,
``sim/strategies/host.py``: a barrier waits for the slowest draw, and on a shared host a few
steps take a scheduler time slice longer), the all-reduce and averaging take the measured
reduction, the loopback latency is set so one message takes the measured time (a gossip
exchange's for D-PSGD), and a server's CPU time per push is its measured handling. The runs
are then compared with the predictions: updates/s in each strategy's scope and the servers'
mean staleness.

The real servers hold the plan's shards (size-balanced: whole tensors, dealt as the
simulator deals them, so one of two shards holds 85% of this MLP); a server's CPU rate is
set so that the first (largest) shard takes its measured handling.

Every rank also measures the CPU seconds each primitive costs it (``time.process_time``,
gloo's threads included), and the prediction is capped where those need more cores than the
host has (``sim.strategies.host.host_cap``: the DES gives every process a core of its own);
each run records the cores its processes kept busy (``measured_cores_busy``) and whether the
cap bound (``host_bound``). The one-way message is the unstable input: 0.06-1.4 ms from one
start to the next, by where the kernel placed the processes, and ASP and SSP on the MLP
follow it. The runs themselves move 10-25% from one start to the next on this host
(experiments/NOTES.md, 2026-12-05).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from executor.launch import launch
from executor.sync.compare import predict_sync, profile_of, task_workload
from executor.sync.launch import summarize_sync
from executor.sync.task import COMPARE_DEFAULTS, TASKS
from sim.io import atomic_write_text
from sim.spec.plan import Plan
from sim.spec.sync import architecture
from sim.strategies.host import HOST_BOUND
from trainsim.commands.profile import int_at_least

RESULTS = Path(__file__).resolve().parent / "results"
N, BATCH, LR = 4, 32, 0.1
TIMEOUT_S = {"digits": 120.0, "digits-resnet18": 900.0}
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


def _world(world: list[tuple[str, object, object]], reps: int, task: str, steps: int
           ) -> tuple[dict, list[dict]]:
    plans = [_plan(s, c) for _, s, c in world]
    assert len({architecture(p) == "ps" for p in plans}) == 1, "one profile: PS or not"
    servers = plans[0].communication.servers if plans[0].sync.kind != "bsp" or \
        plans[0].communication.architecture == "ps" else 0
    gossip = next((p for p in plans if p.sync.kind == "gossip"), plans[0])  # its graph
    timeout = TIMEOUT_S[task]
    base = {"task": task, "hidden": list(TASKS[task]), "steps": steps, "eval_every": steps,
            "device": "cpu", "threads": 1, "timeout_s": timeout, "lr": LR, "seed": 0,
            "plan": plans[0].to_dict(),
            "runs": [{"probe": reps, "plan": gossip.to_dict()}]
            + [{"plan": p.to_dict()} for p in plans]}
    ranks = launch("executor.sync.worker", base, N + servers, timeout, 1)
    profile = profile_of([r["runs"][0] for r in ranks])
    runs = [summarize_sync([r["runs"][i + 1] for r in ranks], p, {**base, "plan": p.to_dict()})
            for i, p in enumerate(plans)]
    return profile, runs


def _cores_busy(run: dict) -> float:
    """The cores the run's processes kept busy on average (their CPU seconds / wall)."""
    cpu = run["cpu_s"]
    return (sum(cpu["workers"]) + sum(cpu["servers"])) / run["wall_s"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--task", choices=sorted(TIMEOUT_S), default="digits",
                    help="digits (the MLP) or digits-resnet18 (the graph workload)")
    ap.add_argument("--reps", type=int_at_least(1), help="probe repetitions (default 200 "
                    "digits, 10 digits-resnet18)")
    ap.add_argument("--steps", type=int_at_least(1), help="local steps a worker (default 300 "
                    "digits, 40 digits-resnet18)")
    args = ap.parse_args()
    steps = args.steps or COMPARE_DEFAULTS[args.task][0]
    reps = args.reps or COMPARE_DEFAULTS[args.task][1]
    workload = task_workload(args.task, TASKS[args.task], BATCH)
    rows = []
    for rep in range(args.repeats):
        for world in WORLDS:
            profile, runs = _world(world, reps, args.task, steps)
            for (label, s, c), r in zip(world, runs, strict=True):
                pred = predict_sync(_plan(s, c), profile, workload, steps)
                rows.append({"repeat": rep, "strategy": label,
                             "measured_updates_per_s": r["updates_per_s"],
                             "predicted_updates_per_s": pred.updates_per_s,
                             "error": pred.updates_per_s / r["updates_per_s"] - 1,
                             "measured_staleness": r["staleness"]["mean"],
                             "predicted_staleness": pred.staleness.get("mean"),
                             "measured_cores_busy": _cores_busy(r),
                             "host_bound": any(w.startswith(HOST_BOUND) for w in pred.warnings),
                             **{f"profile_{k}": v for k, v in profile.items()
                                if k != "step_samples_s"}})
                print(f"{rep} {label:22s} measured {r['updates_per_s']:8.1f} predicted "
                      f"{pred.updates_per_s:8.1f} ({rows[-1]['error']:+.1%}); staleness "
                      f"{r['staleness']['mean']:.2f} vs {pred.staleness.get('mean', 0):.2f}",
                      flush=True)
    df = pd.DataFrame(rows)
    errs = df.error.abs()
    print(f"median |error| {errs.median():.1%}, worst {errs.max():.1%} over {len(df)} runs")
    name = "sync_validation_cpu" + ("" if args.task == "digits" else f"_{args.task}")
    atomic_write_text(RESULTS / f"{name}.csv", df.to_csv(index=False, float_format="%.5g"))


if __name__ == "__main__":
    main()
