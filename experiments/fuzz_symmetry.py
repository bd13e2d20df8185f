"""Random fault and heterogeneity cases, reduced against unreduced DES.

Run: ``.venv/bin/python experiments/fuzz_symmetry.py [--cases 300] [--seed 0]``. Draws small
clusters (fat-tree with and without oversubscribed pods, rail-optimized, torus, dragonfly;
one GPU type or two; 1, 2, 4 or 8 NICs), plans (TP, PP with 1F1B, GPipe or interleaved, CP,
EP on an MoE model, ZeRO 0-3, sequence parallelism, shuffled placements), stragglers (GPUs,
nodes), slowed links and failed links (at the start or mid-step), simulates each reduced and
unreduced, and counts how each ran and how far apart they are: the iteration time and every
link's bytes must agree (1e-6 and 1e-9 relative). Writes
``experiments/results/fuzz_symmetry.csv`` (one row per case) and prints the summary.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import random
import sys
from pathlib import Path

import pandas as pd

from sim import Plan, load_cluster, load_model
from sim.cost.profiled import cost_model_for
from sim.cost.scales import combine_scales, gpu_compute_scales
from sim.des.run import simulate_des
from sim.io import atomic_write_text
from sim.network.failures import fault_inputs
from sim.network.topology import build_topology, vertex_name
from sim.spec.faults import faults_from_options
from sim.spec.plan import validate

OUT = Path(__file__).resolve().parent / "results" / "fuzz_symmetry.csv"
TOPOLOGIES = ("fat-tree", "fat-tree", "rail-optimized", "torus2d", "dragonfly")


def _cluster(rng: random.Random):
    nodes = rng.choice([1, 2, 2, 3, 4, 4, 8])
    kind = rng.choice(["dgx-a100", "dgx-h100"])
    if nodes >= 2 and rng.random() < 0.2:
        a = rng.randint(1, nodes - 1)
        c = load_cluster(f"dgx-a100:{a}+dgx-h100:{nodes - a}")
    else:
        c = load_cluster(f"{kind}:{nodes}")
    edits = {"topology": rng.choice(TOPOLOGIES)}
    if rng.random() < 0.3:
        edits |= {"pod_gpus": rng.choice([8, 16]), "oversubscription": rng.choice([1.0, 2.0])}
    if rng.random() < 0.2:
        edits["nics_per_node"] = rng.choice([1, 2, 4])
    return dataclasses.replace(c, inter_node=dataclasses.replace(c.inter_node, **edits))


def _plan(rng: random.Random, world: int, moe: bool) -> Plan | None:
    tp, pp, cp = rng.choice([1, 2, 4]), rng.choice([1, 1, 2, 4]), rng.choice([1, 1, 2])
    if world % (tp * pp * cp):
        return None
    dp = world // (tp * pp * cp)
    ep = rng.choice([d for d in (1, 2, 4) if dp % d == 0]) if moe else 1
    schedule = rng.choice(["1f1b", "1f1b", "gpipe", "interleaved-1f1b"]) if pp > 1 else "1f1b"
    vpp = 2 if schedule == "interleaved-1f1b" else 1
    dims = ["tp", "cp", "ep", "dp", "pp"]
    placement = "-".join(rng.sample(dims, 5)) if rng.random() < 0.3 else "tp-cp-ep-dp-pp"
    return Plan(global_batch_size=dp * rng.choice([2, 4]) * pp, seq_len=256 * cp, dp=dp,
                tp=tp, pp=pp, cp=cp, ep=ep, vpp=vpp, schedule=schedule,
                zero_stage=rng.choice([0, 0, 1, 2, 3]), placement=placement,
                sequence_parallel=tp > 1 and rng.random() < 0.3,
                overlap_grad_reduce=rng.random() < 0.8)


def _faults(rng: random.Random, cluster) -> tuple[list[str], list[str]]:
    stragglers, failures = [], []
    for _ in range(rng.choice([0, 1, 1, 2])):
        stragglers.append(f"gpu:{rng.randrange(cluster.world_size)}=1.3" if rng.random() < 0.6
                          else f"node:{rng.randrange(cluster.nodes)}=1.2")
    links = build_topology(cluster).links
    if rng.random() < 0.3:
        a, b = links[rng.randrange(len(links))]
        stragglers.append(f"link:{vertex_name(a)}-{vertex_name(b)}=2")
    if rng.random() < 0.3:
        a, b = links[rng.randrange(len(links))]
        failures.append(f"{vertex_name(a)}-{vertex_name(b)}@{rng.choice([0, 0.0002])}")
    return stragglers, failures


def _run(model, cluster, plan, stragglers, failures, reduce):
    f = fault_inputs(faults_from_options(stragglers, failures=failures), cluster, plan, "des",
                     reduce)
    scales = combine_scales(gpu_compute_scales(model, cluster, plan),
                            f.perturbation.compute_scale)
    return simulate_des(model, cluster, plan, cost_model_for(cluster), reduce=reduce,
                        perturbation=f.perturbation.with_scale(scales), top_links=None)


def one(rng: random.Random, models: dict) -> dict | None:
    cluster = _cluster(rng)
    moe = rng.random() < 0.25
    model = models["moe" if moe else rng.choice(["tiny", "untied"])]
    plan = _plan(rng, cluster.world_size, moe)
    if plan is None:
        return None
    try:
        validate(plan, model, cluster)
    except Exception:  # an invalid draw: skip it
        return None
    stragglers, failures = _faults(rng, cluster)
    reduced = _run(model, cluster, plan, stragglers, failures, True)
    full = _run(model, cluster, plan, stragglers, failures, False)
    got = {r["link"]: r["bytes"] for r in reduced.links}
    want = {r["link"]: r["bytes"] for r in full.links}
    link_err = max((abs(got.get(k, 0.0) - want.get(k, 0.0)) / max(want.get(k, 0.0), 1.0)
                    for k in set(got) | set(want)), default=0.0)
    same = reduced.iteration_s == full.iteration_s
    err = 0.0 if same else abs(reduced.iteration_s - full.iteration_s) / full.iteration_s
    why = reduced.simulation.get("not_reduced_because", "")
    ran = "reduced" if reduced.simulation["reduced"] and not why else \
        "fell back" if why.startswith("the reduction is not exact") else "no two alike"
    return {"cluster": cluster.name, "topology": cluster.inter_node.topology,
            "model": model.name, "plan": f"dp{plan.dp} tp{plan.tp} pp{plan.pp} cp{plan.cp} "
            f"ep{plan.ep} {plan.schedule} z{plan.zero_stage} {plan.placement}",
            "stragglers": " ".join(stragglers), "failures": " ".join(failures), "ran": ran,
            "classes": reduced.simulation.get("classes"), "iteration_rel_err": err,
            "link_bytes_rel_err": link_err,
            "agree": (err <= 1e-6 or (math.isinf(full.iteration_s) and same))
            and link_err <= 1e-9}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    tiny = load_model("tiny")
    models = {"tiny": tiny,
              "untied": dataclasses.replace(tiny, tied_embeddings=False, name="tiny-untied"),
              "moe": dataclasses.replace(tiny, num_experts=8, top_k=2, name="tiny-moe")}
    rng, rows = random.Random(args.seed), []
    while len(rows) < args.cases:
        row = one(rng, models)
        if row is not None:
            rows.append(row)
            if len(rows) % 50 == 0:
                print(f"{len(rows)} cases", flush=True)
    df = pd.DataFrame(rows)
    atomic_write_text(OUT, df.to_csv(index=False, float_format="%.3g"))
    print(df["ran"].value_counts().to_string())
    print(f"agree: {int(df['agree'].sum())} of {len(df)}; worst iteration error "
          f"{df['iteration_rel_err'].max():.2e}, worst link-bytes error "
          f"{df['link_bytes_rel_err'].max():.2e}; wrote {OUT}")
    return 0 if df["agree"].all() else 1


if __name__ == "__main__":
    sys.exit(main())
