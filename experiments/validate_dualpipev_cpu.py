"""torch's ScheduleDualPipeV run for real (gloo, CPU) against one rank and against the
simulator's account, and why the executor refuses it with data parallelism.

Each plan trains ``tiny`` (4 layers, tied embeddings; 128-token sequences, fp32, plain SGD
at lr 0.5, whose step is proportional to the gradient) for one warm-up and one recorded
step, and is compared with a reference over the same batches: the pipelines (DualPipeV on
2 ranks, with and without TP 2) with one rank, the data-parallel ones with 1F1B on the same
grid. Every rank's collectives are checked against the simulator's torch account. The
data-parallel DualPipeV rows are run past the executor's refusal (through its launcher:
``execute`` refuses them) to measure what the refusal is for.

    python experiments/validate_dualpipev_cpu.py [--out results/dualpipev_cpu.csv]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from executor.launch import _config, launch, summarize_ranks
from executor.parallel import mesh_ranks
from sim.layout.inventory import compare_inventory, expected_collectives
from sim.spec.plan import Plan
from sim.spec.zoo import load_model

sys.path.insert(0, str(Path(__file__).resolve().parent))
from validate_executor_moe_cpu import loss_table  # noqa: E402 - the same loss comparison

TINY = load_model("tiny")
ONE = {"seq_len": 128, "dtype": "fp32", "micro_batch_size": 1}
V = {"pp": 2, "vpp": 2, "schedule": "dualpipev"}
# name -> (plan, reference plan name)
PLANS = {
    "one rank": (Plan(global_batch_size=8, **ONE), None),
    "DualPipeV PP2": (Plan(global_batch_size=8, **ONE, **V), "one rank"),
    "DualPipeV PP2 TP2": (Plan(global_batch_size=8, **ONE, **V, tp=2), "one rank"),
    "1F1B PP2 DP2 (DDP)": (Plan(global_batch_size=16, **ONE, pp=2, dp=2), None),
    "DualPipeV PP2 DP2 (DDP)": (Plan(global_batch_size=16, **ONE, **V, dp=2),
                                "1F1B PP2 DP2 (DDP)"),
    "1F1B PP2 DP2 ZeRO-3": (Plan(global_batch_size=16, **ONE, pp=2, dp=2, zero_stage=3),
                            None),
    "DualPipeV PP2 DP2 ZeRO-3": (Plan(global_batch_size=16, **ONE, **V, dp=2, zero_stage=3),
                                 "1F1B PP2 DP2 ZeRO-3"),
}


def run(plan: Plan) -> dict:
    """One recorded step after a warm-up, through the executor's own launcher."""
    config = _config(TINY, plan, steps=1, warmup=1, timeout_s=240, device="cpu", threads=1,
                     seed=0, lr=0.5, fault=None, optimizer="sgd",
                     run_refused=plan.schedule == "dualpipev" and plan.dp > 1)
    return summarize_ranks(launch("executor.worker", config, plan.world_size, 240, 1), plan)


def check(name: str, plan: Plan) -> tuple[dict, list[float]]:
    res = run(plan)
    stage = {int(r): p for p, ranks in enumerate(mesh_ranks(plan)) for r in ranks.flatten()}
    rows = [r for rank, measured in res["collectives"].items()
            for r in compare_inventory(expected_collectives(TINY, plan, stage[int(rank)]),
                                       measured)]
    return {"plan": name, "ranks": plan.world_size, "pp": plan.pp, "tp": plan.tp,
            "dp": plan.dp, "zero": plan.zero_stage, "schedule": plan.schedule,
            "collective_rows": len(rows), "rows_matching": sum(r["match"] for r in rows),
            "refused_by_executor": plan.schedule == "dualpipev" and plan.dp > 1}, \
        list(res["loss"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path,
                    default=Path(__file__).parent / "results" / "dualpipev_cpu.csv")
    args = ap.parse_args(argv)
    table = loss_table(PLANS, check, args.out)
    run_ok = table[~table.refused_by_executor]
    ok = (run_ok.rows_matching == run_ok.collective_rows).all() and \
        (run_ok.max_rel_loss_diff < 1e-6).all()
    print(f"every run the executor takes matches its reference and the account: {bool(ok)}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
