"""Exactness of the discrete-event network against the closed forms (idle network).

Run: ``.venv/bin/python experiments/des_exactness.py``. For every collective algorithm the
DES tier implements, on groups inside one node, across nodes, and both, at 1 KiB, 1 MiB and
1 GiB: the simulated time on an otherwise idle network vs ``sim.network.alphabeta`` (α and β terms).
Also the two checks of the flow model itself: two flows on one link each take twice as
long, and max-min shares on a hand-solved three-link example. Writes
``experiments/results/des_exactness.csv``.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pandas as pd
import simpy

from sim.io import atomic_write_text
from sim.layout.placement import GroupSpan
from sim.network.algorithms import collective_time
from sim.network.alphabeta import fabric_for
from sim.network.engine import CommEngine
from sim.network.flows import Flow, Network, max_min_rates
from sim.network.topology import build_topology
from sim.spec.cluster import load_cluster

OUT = Path(__file__).resolve().parent / "results" / "des_exactness.csv"
GROUPS = {"1 node x 8": (list(range(8)), GroupSpan(8, 8, 1, False)),
          "4 nodes x 1": (list(range(0, 32, 8)), GroupSpan(4, 1, 4, False)),
          "2 nodes x 8": (list(range(16)), GroupSpan(16, 8, 2, False))}
CASES = [("all_reduce", a) for a in ("ring", "tree", "hierarchical", "halving-doubling",
                                     "nvls")]
CASES += [(k, a) for k in ("all_gather", "reduce_scatter") for a in ("ring", "hierarchical",
                                                                     "halving-doubling")]
CASES += [("all_to_all", "direct"), ("all_to_all", "pairwise"), ("broadcast", "ring"),
          ("send_recv", "ring"), ("kv_ring", "ring")]


def des_time(topo, kind: str, algorithm: str, devices: list[int], size: float) -> float:
    env = simpy.Environment()
    engine = CommEngine(env, topo, Network(env, topo.cap, topo.lat))
    env.process(engine.run(kind, algorithm, devices, size))
    env.run()
    return env.now


def table() -> pd.DataFrame:
    cluster = load_cluster("dgx-h100:4")
    topo = build_topology(cluster)
    rows = []
    for (kind, algo), (label, (devices, span)), size in itertools.product(
            CASES, GROUPS.items(), (2**10, 2**20, 2**30)):
        if kind == "send_recv":  # first and last rank of the group
            devices = [devices[0], devices[-1]]
            span = GroupSpan(2, 1 if span.nodes > 1 else 2, min(2, span.nodes), False)
        des = des_time(topo, kind, algo, devices, size)
        closed = collective_time(kind, fabric_for(cluster, span), size, algo)
        rows.append({"collective": kind, "algorithm": algo, "group": label, "bytes": size,
                     "des_s": des, "closed_form_s": closed,
                     "error_pct": 100 * (des - closed) / closed})
    return pd.DataFrame(rows)


def flow_checks() -> list[str]:
    env = simpy.Environment()
    net = Network(env, [1e9], [0.0])
    done = [net.transfer((0,), 1e9) for _ in range(2)]
    env.run(simpy.AllOf(env, done))
    flows = [Flow((0, 1), (1.0, 1.0), 1, None), Flow((1, 2), (1.0, 1.0), 1, None),  # type: ignore[arg-type]
             Flow((0,), (1.0,), 1, None), Flow((2,), (1.0,), 1, None)]  # type: ignore[arg-type]
    max_min_rates(flows, [10.0, 4.0, 10.0])
    return [f"two 1 GB flows on one 1 GB/s link: both done at {env.now:.6f} s (alone: 1 s)",
            "max-min on links A=10, B=4, C=10 with flows {A,B}, {B,C}, {A}, {C}: rates "
            f"{[f.rate for f in flows]} (hand-solved: [2, 2, 8, 8])"]


def main() -> None:
    df = table()
    atomic_write_text(OUT, df.to_csv(index=False, float_format="%.6g"))
    worst = df.loc[df["error_pct"].abs().idxmax()]
    print(f"{len(df)} cases; worst |error| {abs(worst['error_pct']):.2e}% "
          f"({worst['collective']} {worst['algorithm']} {worst['group']} {worst['bytes']} B)")
    for line in flow_checks():
        print(line)


if __name__ == "__main__":
    main()
