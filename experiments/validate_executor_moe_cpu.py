"""MoE expert grids run for real (gloo, CPU) against the simulator's account of them.

Each plan trains ``tiny-moe-shared`` (2 MoE layers, 4 experts, top-2, a shared expert;
8 x 128 tokens, fp32; plain SGD at lr 1, whose step is proportional to the gradient) for
one warm-up, one timed and one recorded step, and checks every
rank's collectives against the simulator's torch account
(:func:`sim.layout.inventory.expected_collectives`, the pipeline stage of that rank): kind,
count and bytes. It also compares the losses: plans with the same micro-batches as one rank
must give one rank's losses (the parallel layers compute the same function), and plans
with two replicas must give those of two data-parallel replicas holding every expert (the
expert gradients' scaling: twice too large a gradient moves the second loss by ~3e-3).

    python experiments/validate_executor_moe_cpu.py [--out results/executor_moe_cpu.csv]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

import pandas as pd

from executor.launch import execute
from executor.parallel import mesh_ranks
from sim.layout.inventory import compare_inventory, expected_collectives
from sim.spec.model import ModelSpec
from sim.spec.plan import Plan

MODEL = ModelSpec("tiny-moe-shared", 2, 64, 4, 128, 512, max_seq_len=128, gated_mlp=True,
                  norm="rmsnorm", position_embedding="rope", num_experts=4, top_k=2,
                  shared_expert_ffn_hidden_size=64)
BASE = {"global_batch_size": 8, "seq_len": 128, "dtype": "fp32"}
SP = {"sequence_parallel": True}
# name -> (plan, the plan whose losses it must give)
PLANS = {
    "one rank": (Plan(**BASE, micro_batch_size=4), None),
    "TP2 (etp = tp)": (Plan(**BASE, micro_batch_size=4, tp=2, **SP), "one rank"),
    "TP2 EP2 etp 1 (EP > DP)": (Plan(**BASE, micro_batch_size=4, tp=2, ep=2, etp=1, **SP),
                                "one rank"),
    "PP2 TP2": (Plan(**BASE, micro_batch_size=4, pp=2, tp=2, **SP), "one rank"),
    "TP4 EP4 etp 1 (EP > DP)": (Plan(**BASE, micro_batch_size=4, tp=4, ep=4, etp=1, **SP),
                                "one rank"),
    "TP2 full recompute": (Plan(**BASE, micro_batch_size=4, tp=2, recompute="full", **SP),
                           "one rank"),
    "DP2 (experts data parallel)": (Plan(**BASE, micro_batch_size=2, dp=2), None),
    "DP2 EP2 (DDP)": (Plan(**BASE, micro_batch_size=2, dp=2, ep=2),
                      "DP2 (experts data parallel)"),
    "DP2 EP2 full recompute": (Plan(**BASE, micro_batch_size=2, dp=2, ep=2,
                                    recompute="full"), "DP2 (experts data parallel)"),
    "DP2 EP2 ZeRO-3": (Plan(**BASE, micro_batch_size=2, dp=2, ep=2, zero_stage=3),
                       "DP2 (experts data parallel)"),
    "TP2 DP2 ZeRO-3": (Plan(**BASE, micro_batch_size=2, dp=2, tp=2, zero_stage=3, **SP),
                       "DP2 (experts data parallel)"),
    "TP2 DP2 EP2 ZeRO-3": (Plan(**BASE, micro_batch_size=2, dp=2, tp=2, ep=2, zero_stage=3,
                                **SP), "DP2 (experts data parallel)"),
    "TP2 DP2 ZeRO-2": (Plan(**BASE, micro_batch_size=2, dp=2, tp=2, zero_stage=2, **SP),
                       "DP2 (experts data parallel)"),
    "PP2 DP2 EP2 ZeRO-3": (Plan(**BASE, micro_batch_size=2, pp=2, dp=2, ep=2, zero_stage=3),
                           "DP2 (experts data parallel)"),
    "TP2 DP2 EP4 etp 1 ZeRO-3 (folded)": (Plan(**BASE, micro_batch_size=2, dp=2, tp=2, ep=4,
                                               etp=1, zero_stage=3, **SP),
                                          "DP2 (experts data parallel)"),
}


def check(name: str, plan: Plan) -> tuple[dict, list[float]]:
    res = execute(MODEL, plan, steps=1, warmup=1, timeout_s=300, optimizer="sgd", lr=1.0)
    stage = {int(r): p for p, ranks in enumerate(mesh_ranks(plan)) for r in ranks.flatten()}
    rows = [r for rank, measured in res["collectives"].items()
            for r in compare_inventory(expected_collectives(MODEL, plan, stage[int(rank)]),
                                       measured)]
    rank0 = {(r["group"], r["kind"]): r for r in compare_inventory(
        expected_collectives(MODEL, plan, 0), res["collectives"]["0"])}
    a2a = rank0.get(("ep", "all_to_all"), {})
    out = {"plan": name, "ranks": plan.world_size, "tp": plan.tp, "dp": plan.dp,
           "ep": plan.ep, "etp": plan.etp if plan.etp is not None else plan.tp,
           "pp": plan.pp, "zero": plan.zero_stage,
           "collective_rows": len(rows), "rows_matching": sum(r["match"] for r in rows),
           "worst_bytes_error_pct": round(100 * max((r["bytes_error"] for r in rows),
                                                    default=0.0), 3),
           "ep_all_to_all_count": a2a.get("measured_count", 0),
           "ep_all_to_all_bytes": a2a.get("measured_bytes", 0),
           "tp_reduce_scatter_bytes": rank0.get(("tp", "reduce_scatter"), {}).get(
               "measured_bytes", 0),
           "step_s": round(sorted(res["step_s"])[len(res["step_s"]) // 2], 3)}
    return out, list(res["loss"])


def loss_table(plans: dict[str, tuple[Plan, str | None]],
               check: Callable[[str, Plan], tuple[dict, list[float]]], out: Path
               ) -> pd.DataFrame:
    """Run every plan (``check``: its row and losses), set its losses beside those of the
    plan it must match (absolute and relative differences), write the table to ``out``
    and print it."""
    rows, losses = [], {}
    for i, (name, (plan, same_as)) in enumerate(plans.items(), 1):
        print(f"[{i}/{len(plans)}] {name} ({plan.world_size} ranks)", flush=True)
        row, losses[name] = check(name, plan)
        pairs = list(zip(losses[name], losses[same_as] if same_as else losses[name],
                         strict=True))
        row["loss_step1"], row["loss_step2"] = (round(v, 6) for v in losses[name])
        row["same_losses_as"] = same_as or "-"
        row["max_loss_diff"] = max(abs(a - b) for a, b in pairs)
        row["max_rel_loss_diff"] = max(abs(a - b) / abs(b) for a, b in pairs)
        rows.append(row)
    table = pd.DataFrame(rows)
    out.parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(out, index=False)
    print(table.to_string(index=False))
    return table


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path,
                    default=Path(__file__).parent / "results" / "executor_moe_cpu.csv")
    args = ap.parse_args(argv)
    table = loss_table(PLANS, check, args.out)
    ok = (table.rows_matching == table.collective_rows).all() and \
        (table.max_loss_diff < 1e-5).all()
    print(f"every collective matches and every loss agrees: {bool(ok)}; wrote {args.out}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
