"""Synchronisation strategies over many steps (issue 16): exactness, closed forms vs the
multi-step DES, throughput under a straggler, and the DES's speed.

Run: ``.venv/bin/python experiments/sync_strategies.py`` (about a minute on 2 cores).
Writes ``experiments/results/sync_exactness.csv``, ``sync_straggler.csv`` (+ ``.png``) and
``sync_bench.csv``.

- Exactness: SSP(0) vs BSP over a parameter server (the same simulated end time), SSP(inf) vs
  ASP (the same record), BSP and local SGD with H = 1 vs the one-step tier, and every
  closed form vs the DES on an idle network (Llama 3 8B, TP 8 x DP 4 on 4 DGX H100).
- Straggler: ResNet-50, 16 single-GPU workers on 2 DGX H100 (global batch 1,024 images),
  worker 0 slowed by 1 to 3x; samples/s of BSP (all-reduce and 4 dedicated CPU servers),
  SSP(2), ASP (4 servers and 1), local SGD (H = 8), D-PSGD on a ring and backup workers
  (b = 1), all from the DES; then no straggler but every step of every worker slowed by a
  lognormal jitter (sigma 0.1-0.4) for the server strategies.
- Speed: 64 asynchronous workers (ResNet-18, one GPU each on 8 DGX H100) and one
  parameter server, 1,000 steps each; wall time and events/s against a bare SimPy loop timed
  in the same run (the issue's target: <= 10 s).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from sim.analytic.sync import sync_closed_form  # noqa: E402
from sim.api import simulate  # noqa: E402
from sim.des.workers import run_workers  # noqa: E402
from sim.io import atomic_write_text  # noqa: E402
from sim.spec.cluster import load_cluster  # noqa: E402
from sim.spec.faults import faults_from_options, parse_dist  # noqa: E402
from sim.spec.plan import Plan  # noqa: E402
from sim.spec.zoo import load_any  # noqa: E402
from sim.strategies import build_setup, simulate_sync  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_des import bare_simpy_rate  # noqa: E402 - the same bare loop as bench_des.py

RESULTS = Path(__file__).resolve().parent / "results"
PS1 = {"architecture": "ps", "servers": 1}
PS2 = {"architecture": "ps", "servers": 2}


def _exactness() -> pd.DataFrame:
    m, c = load_any("llama3-8b"), load_cluster("dgx-h100:4")

    def plan(sync: object = "bsp", comm: object = "auto") -> Plan:
        return Plan(global_batch_size=256, seq_len=4096, dp=4, tp=8, sync=sync,
                    communication=comm)

    def end(p: Plan, faults: object = None) -> tuple:
        s, _ = build_setup(m, c, p, "analytic", faults)  # type: ignore[arg-type]
        r = run_workers(s, 60)
        return r.end_s, r.updates, r.staleness

    rows = []
    slow = faults_from_options(["gpu:0=1.3"])
    pairs = [("SSP(0) vs BSP over two servers: end time", plan({"kind": "ssp", "staleness": 0},
                                                             PS2), plan("bsp", PS2), None),
             ("SSP(inf) vs ASP, 1.3x straggler: whole record",
              plan({"kind": "ssp", "staleness": "inf"}, PS2), plan("asp", PS2), slow),
             ("local SGD H=1 vs BSP: end time", plan({"kind": "local-sgd", "period": 1}),
              plan(), None)]
    for label, a, b, faults in pairs:
        ra, rb = end(a, faults), end(b, faults)
        same = ra == rb if "record" in label else ra[0] == rb[0]
        rows.append({"check": label, "relative_difference": abs(ra[0] - rb[0]) / rb[0],
                     "exact": same})
    one = simulate(m, c, plan(), "des")
    r = simulate_sync(m, c, plan(), "des", steps=40)
    rows.append({"check": "BSP over many steps vs the one-step DES tier: step time",
                 "relative_difference": abs(r.step_time_s - one.iteration_time_s)
                 / one.iteration_time_s, "exact": r.step_time_s == one.iteration_time_s})
    for sync, comm in [("bsp", PS2), ("asp", PS1), ({"kind": "local-sgd", "period": 8}, "auto"),
                       ({"kind": "diloco", "period": 10}, "auto"),
                       ({"kind": "two-stage", "important_fraction": 0.3}, "auto"),
                       ({"kind": "gossip", "graph": "ring"}, "auto"),
                       ({"kind": "gossip", "gossip_mode": "sgp", "graph": "exponential"},
                        "auto")]:
        p = plan(sync, comm)
        s, _ = build_setup(m, c, p, "analytic")
        d = simulate_sync(m, c, p, "des", steps=200).updates_per_s
        cf = sync_closed_form(s).updates_per_s
        rows.append({"check": f"closed form vs DES, idle network: {p.sync.kind}"
                     f"{'' if p.sync.kind != 'gossip' else ' ' + p.sync.gossip_mode}",
                     "relative_difference": abs(d - cf) / d, "exact": False})
    return pd.DataFrame(rows)


PS4 = {"architecture": "ps", "servers": 4}
STRATEGIES = [("BSP, all-reduce", "bsp", "auto"), ("BSP, 4 servers", "bsp", PS4),
              ("SSP(2), 4 servers", {"kind": "ssp", "staleness": 2}, PS4),
              ("ASP, 4 servers", "asp", PS4), ("ASP, 1 server", "asp", PS1),
              ("local SGD H=8", {"kind": "local-sgd", "period": 8}, "auto"),
              ("D-PSGD ring", "gossip", "auto"),
              ("backup workers b=1, 4 servers", {"kind": "backup-workers", "backups": 1}, PS4)]


def _straggler() -> pd.DataFrame:
    m, c = load_any("resnet50"), load_cluster("dgx-h100:2")
    rows = []
    for factor in (1.0, 1.25, 1.5, 2.0, 3.0):
        faults = faults_from_options([f"gpu:0={factor}"]) if factor > 1 else None
        for label, sync, comm in STRATEGIES:
            p = Plan(global_batch_size=1024, seq_len=1, dp=16, sync=sync, communication=comm)
            r = simulate_sync(m, c, p, "des", steps=200, faults=faults)
            rows.append({"straggler": factor, "jitter_sigma": 0.0, "strategy": label,
                         "samples_per_s":
                         r.samples_per_s, "updates_per_s": r.updates_per_s,
                         "staleness_mean": r.staleness.get("mean"),
                         "idle_mean": sum(r.idle_fraction) / len(r.idle_fraction)})
        print(f"  straggler {factor}x done", flush=True)
    for sigma in (0.1, 0.2, 0.4):  # transient slow-downs: every worker, every step
        for label, sync, comm in STRATEGIES[1:4]:
            p = Plan(global_batch_size=1024, seq_len=1, dp=16, sync=sync, communication=comm)
            r = simulate_sync(m, c, p, "des", steps=200, jitter=parse_dist(
                f"lognormal:{sigma}", "--jitter"), seed=1)
            rows.append({"straggler": 1.0, "jitter_sigma": sigma, "strategy": label,
                         "samples_per_s": r.samples_per_s, "updates_per_s": r.updates_per_s,
                         "staleness_mean": r.staleness.get("mean"),
                         "idle_mean": sum(r.idle_fraction) / len(r.idle_fraction)})
    return pd.DataFrame(rows)


def _plot(df: pd.DataFrame) -> None:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, _, _ in STRATEGIES:
        d = df[(df.strategy == label) & (df.jitter_sigma == 0)]
        ax.plot(d.straggler, d.samples_per_s, marker="o", label=label)
    ax.set_title("ResNet-50, 16 H100 workers: one straggler (multi-step DES)")
    ax.set_xlabel("slow-down of worker 0 (x)")
    ax.set_ylabel("throughput (images/s)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(RESULTS / "sync_straggler.png", dpi=120)


def _bench(bare: float) -> pd.DataFrame:
    m, c = load_any("resnet18"), load_cluster("dgx-h100:8")
    p = Plan(global_batch_size=64 * 32, seq_len=1, dp=64, sync="asp", communication=PS1)
    t0 = time.perf_counter()
    r = simulate_sync(m, c, p, "des", steps=1000)
    wall = time.perf_counter() - t0
    events = r.simulation["events"]
    return pd.DataFrame([{"case": "64 ASP workers, 1 server, 1,000 steps", "wall_s": wall,
                          "target_s": 10.0, "met": wall <= 10.0, "events": events,
                          "ratio_to_bare_simpy": events / wall / bare,
                          "updates_per_s": r.updates_per_s,
                          "staleness_mean": r.staleness["mean"]}])


def main() -> None:
    RESULTS.mkdir(exist_ok=True)
    bare = bare_simpy_rate()
    print(f"bare SimPy timeout loop: {bare:,.0f} events/s")
    ex = _exactness()
    print(ex.to_string(index=False))
    atomic_write_text(RESULTS / "sync_exactness.csv", ex.to_csv(index=False,
                                                                float_format="%.3g"))
    st = _straggler()
    steady = st[st.jitter_sigma == 0]
    print(steady.pivot(index="strategy", columns="straggler", values="samples_per_s").round(0))
    jit = st[st.straggler == 1.0]
    print(jit.pivot(index="strategy", columns="jitter_sigma", values="samples_per_s").dropna()
          .round(0))
    atomic_write_text(RESULTS / "sync_straggler.csv", st.to_csv(index=False,
                                                                float_format="%.6g"))
    _plot(st)
    b = _bench(bare)
    print(b.to_string(index=False))
    atomic_write_text(RESULTS / "sync_bench.csv", b.to_csv(index=False, float_format="%.4g"))
    print(f"wrote {RESULTS}/sync_exactness.csv, sync_straggler.csv/.png, sync_bench.csv")


if __name__ == "__main__":
    main()
