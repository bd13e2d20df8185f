"""Random healthy plans at real sizes, the analytic tier against the DES.

Run: ``.venv/bin/python experiments/fuzz_tiers.py [--cases 120] [--seed 0]`` (about two
minutes on 2 cores). Draws a model (llama3-8b, llama3-70b, mixtral-8x7b, qwen3-30b-a3b), a
DGX-H100 cluster of 2-8 nodes and a plan (TP with or without sequence parallelism, and
with it with or without async TP for the dense models, PP with
1F1B, GPipe or interleaving, CP with each exchange, EP with each dispatcher and overlap,
ZeRO 0-3 with and without overlapped gradient reduction, ZeRO-3 keeping gathered weights
or not, each recomputation), and
simulates it in both tiers. The two model the same step: the DES runs every event on the
shared fabric, the closed form sums per-rank costs and assumes overlap where the DES
schedules it, so they part where the fabric is shared or where the closed form counts a
wait differently. Cases more than 5% apart are the ones to
read. Writes ``experiments/results/fuzz_tiers.csv`` (one row per case, each with its
breakdowns) and prints the distribution of ``analytic / DES - 1`` overall and by feature.

``--dualpipe``: DeepSeek's schedules instead (DualPipeV or DualPipe, pp 2-8, ``2 pp`` or
``4 pp`` micro-batches a replica, ZeRO 0-1 under DualPipe), written to
``fuzz_tiers_dualpipe.csv``, each row also saying which (group, kind) rows of the
collectives the DES issues differ from the account's (``sim.layout.inventory``, the DES's
conventions), stage by stage (``account_mismatch``, empty where all match).
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path
from typing import Any

import pandas as pd

from sim import Plan, load_cluster, load_model, simulate
from sim.errors import SpecError
from sim.io import atomic_write_text
from sim.layout.memory import memory_report
from sim.spec.plan import validate

OUT = Path(__file__).resolve().parent / "results" / "fuzz_tiers.csv"
MODELS = ("llama3-8b", "llama3-70b", "mixtral-8x7b", "qwen3-30b-a3b")
BREAKDOWN = ("compute", "tp", "cp", "ep", "pp", "dp", "bubble")


def _moe_fields(rng: random.Random, dp: int, tp: int) -> dict[str, object]:
    ep = rng.choice([d for d in (1, 2, 4, 8) if (dp * tp) % d == 0])
    return {"ep": ep, "moe_dispatcher": rng.choice(["alltoall", "allgather", "deepep"]),
            "moe_overlap": rng.choice(["none", "none", "shared-expert", "a2a", "operator"])}


def draw(rng: random.Random, dual: bool = False) -> tuple[str, str, Plan] | None:
    """A model, a cluster and a plan, or None where the draw does not divide; ``dual``:
    under DualPipeV or DualPipe."""
    name, nodes = rng.choice(MODELS), rng.choice([2, 4, 8])
    world = 8 * nodes
    tp, pp = rng.choice([1, 2, 4, 8]), rng.choice([2, 4, 8] if dual else [1, 2, 4])
    cp = rng.choice([1, 1, 1, 2])
    if world % (tp * pp * cp):
        return None
    dp = world // (tp * pp * cp)
    if dual:
        schedule = rng.choice(["dualpipev", "dualpipe"])
        batches, zeros = [2 * pp, 4 * pp], [0, 1] if schedule == "dualpipe" else [0, 1, 2, 3]
    else:
        schedule = rng.choice(["1f1b", "gpipe", "interleaved-1f1b"]) if pp > 1 else "1f1b"
        batches, zeros = [4, 8, 16], [0, 1, 2, 3]
    micro = rng.choice([1, 2])
    fields: dict[str, object] = {
        "global_batch_size": dp * micro * rng.choice(batches), "seq_len": 4096,
        "micro_batch_size": micro, "dp": dp, "tp": tp, "pp": pp, "cp": cp,
        "vpp": 1 if schedule in ("1f1b", "gpipe") else 2, "schedule": schedule,
        "zero_stage": rng.choice(zeros),
        "recompute": rng.choice(["none", "selective", "full"]),
        "overlap_grad_reduce": rng.random() < 0.8,
        "sequence_parallel": tp > 1 and rng.random() < 0.7,
        "cp_comm": rng.choice(["p2p", "allgather", "a2a"]) if cp > 1 else "p2p"}
    if fields["zero_stage"] == 3:
        fields["reshard_after_forward"] = rng.random() < 0.7
    if name in ("mixtral-8x7b", "qwen3-30b-a3b"):
        fields |= _moe_fields(rng, dp, tp)
    elif fields["sequence_parallel"]:  # async TP (dense models: MoE is not modelled)
        fields["tp_overlap"] = rng.random() < 0.5
    try:
        return name, f"dgx-h100:{nodes}", Plan(**fields)  # type: ignore[arg-type]
    except SpecError:  # a combination the plan refuses
        return None


def _mismatch(model: Any, cluster: Any, plan: Plan) -> str:
    """(group, kind) rows where the DES's issued collectives differ from the account's."""
    from sim.cost.profiled import cost_model_for
    from sim.des.run import issued_collectives
    from sim.layout.inventory import SIMULATED, compare_inventory, expected_collectives

    issued = issued_collectives(model, cluster, plan, cost_model_for(cluster), 0)
    return "; ".join(sorted({
        f"{r['group']} {r['kind']}" for stage in range(plan.pp)
        for r in compare_inventory(expected_collectives(model, plan, stage, SIMULATED),
                                   issued[stage], bytes_tol=0.0) if not r["match"]}))


def one(rng: random.Random, dual: bool = False) -> dict[str, object] | None:
    drawn = draw(rng, dual)
    if drawn is None:
        return None
    name, cluster_name, plan = drawn
    model, cluster = load_model(name), load_cluster(cluster_name)
    try:
        validate(plan, model, cluster)
        if not memory_report(model, cluster, plan).fits:
            return None  # the search would not offer it
        a = simulate(model, cluster, plan)
        t0 = time.perf_counter()
        d = simulate(model, cluster, plan, fidelity="des")
    except SpecError:
        return None
    row: dict[str, object] = {
        "model": name, "cluster": cluster_name, "tp": plan.tp, "pp": plan.pp, "vpp": plan.vpp,
        "cp": plan.cp, "ep": plan.ep, "dp": plan.dp, "schedule": plan.schedule,
        "zero": plan.zero_stage, "recompute": plan.recompute, "sp": plan.sequence_parallel,
        "overlap": plan.overlap_grad_reduce, "reshard": plan.reshard_after_forward,
        "tp_overlap": plan.tp_overlap,
        "cp_comm": plan.cp_comm if plan.cp > 1 else "", "mbs": plan.micro_batch_size,
        "microbatches": plan.num_microbatches,
        "dispatcher": plan.moe_dispatcher if plan.ep > 1 else "",
        "moe_overlap": plan.moe_overlap if plan.ep > 1 else "",
        "analytic_s": a.iteration_time_s, "des_s": d.iteration_time_s,
        "ratio_minus_1": a.iteration_time_s / d.iteration_time_s - 1,
        "des_wall_s": time.perf_counter() - t0}
    for k in BREAKDOWN:
        row[f"a_{k}"], row[f"d_{k}"] = a.breakdown[k], d.breakdown[k]
    if dual:
        row["account_mismatch"] = _mismatch(model, cluster, plan)
    return row


def summary(df: pd.DataFrame) -> None:
    err = df["ratio_minus_1"].abs()
    print(f"{len(df)} cases: |analytic / DES - 1| median {100 * err.median():.2f}%, "
          f"p90 {100 * err.quantile(0.9):.2f}%, worst {100 * err.max():.2f}%; "
          f"{(err > 0.05).sum()} beyond 5%, {(err > 0.10).sum()} beyond 10%")
    for col in ("model", "schedule", "zero", "overlap", "reshard", "tp_overlap", "recompute",
                "cp_comm", "dispatcher", "moe_overlap", "tp", "pp"):
        by = df.assign(e=100 * err).groupby(col)["e"].agg(["count", "median", "max"])
        print(f"by {col}:\n{by.to_string(float_format='%.2f')}")
    cols = ["model", "cluster", "tp", "pp", "vpp", "cp", "ep", "dp", "zero", "recompute",
            "sp", "tp_overlap", "cp_comm", "dispatcher", "moe_overlap", "ratio_minus_1"]
    print("beyond 5%:")
    print(df[err > 0.05].sort_values("ratio_minus_1")[cols].to_string(
        index=False, float_format="%.3f"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=120)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dualpipe", action="store_true",
                    help="DeepSeek's schedules (DualPipeV, DualPipe) instead of Megatron-LM's")
    args = ap.parse_args(argv)
    if args.cases < 1:
        ap.error("--cases: must be at least 1")
    rng, rows, t0 = random.Random(args.seed), [], time.perf_counter()
    while len(rows) < args.cases:
        row = one(rng, args.dualpipe)
        if row is not None:
            rows.append(row)
            if len(rows) % 10 == 0:
                print(f"{len(rows)}/{args.cases} cases, {time.perf_counter() - t0:.0f} s",
                      flush=True)
    df = pd.DataFrame(rows)
    out = OUT.with_name("fuzz_tiers_dualpipe.csv") if args.dualpipe else OUT
    atomic_write_text(out, df.to_csv(index=False, float_format="%.6g"))
    summary(df)
    if args.dualpipe:
        for name, rows in df.groupby("schedule"):
            same = rows["account_mismatch"].fillna("") == ""
            print(f"{name}: the DES issues the account's collectives on {int(same.sum())} of "
                  f"{len(rows)} plans; the others differ in: "
                  f"{sorted(set(rows.loc[~same, 'account_mismatch']))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
