"""MoE load imbalance and token dropping, in both tiers.

Run: ``.venv/bin/python experiments/moe_imbalance.py``. Writes
``experiments/results/moe_imbalance.csv``: Mixtral-8x7B on 64 H100 (pp 4, ep 8, dp 16,
Megatron-LM's MoE README layout without interleaving) and Qwen3-30B-A3B on 8 H100 (ep 8), at
a most-loaded-rank max/mean of 1 (forced balance), 1.1, 1.25, 1.5 and 2, dropless and with
capacity factors 1.0 and 1.25. Per point: the step time per tier, its ratio to forced
balance, the expert GEMMs of the hottest rank and the all-to-all time relative to forced
balance, and the share of routed tokens dropped. No number here is fitted: the point is
what the model predicts imbalance costs (the expert phase scales with the hottest rank's
load) and that both tiers agree.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pandas as pd

from sim import Plan, load_cluster, load_model, simulate
from sim.cost import compute as cm
from sim.cost.profiled import cost_model_for
from sim.io import atomic_write_text
from sim.spec.hf_config import hf_config_to_spec

HERE = Path(__file__).resolve().parent
OUT = HERE / "results" / "moe_imbalance.csv"
LOADS = (1.0, 1.1, 1.25, 1.5, 2.0)
CAPACITIES = (None, 1.0, 1.25)


def cases() -> list[tuple[str, object, str, Plan]]:
    qwen = next(e["config"] for e in json.loads((HERE / "data" / "moe_hf_configs.json")
                                                .read_text()) if e["name"] == "Qwen3-30B-A3B")
    return [("Mixtral-8x7B", load_model("mixtral-8x7b"), "dgx-h100:8",
             Plan(global_batch_size=256, seq_len=4096, dp=16, pp=4, ep=8, zero_stage=1,
                  recompute="full")),
            ("Qwen3-30B-A3B", hf_config_to_spec(qwen, "Qwen3-30B-A3B"), "dgx-h100:1",
             Plan(global_batch_size=512, seq_len=4096, micro_batch_size=4, dp=8, ep=8,
                  zero_stage=3, recompute="full"))]


def table() -> pd.DataFrame:
    rows = []
    for name, model, cluster_name, base in cases():
        cluster = load_cluster(cluster_name)
        cost = cost_model_for(cluster)
        ref: dict[str, float] = {}
        ref_experts = sum(cm.expert_time(cost, model, base, base.local_tokens))
        for load in LOADS:
            for cap in CAPACITIES:
                plan = dataclasses.replace(base, moe_max_load=load, moe_capacity_factor=cap)
                row = {"model": name, "gpus": cluster.world_size, "max_load": load,
                       "capacity_factor": "dropless" if cap is None else cap,
                       "expert_gemm_ratio": sum(cm.expert_time(
                           cost, model, plan, plan.local_tokens)) / ref_experts}
                for tier in ("analytic", "des"):
                    res = simulate(model, cluster, plan, tier)
                    ref.setdefault(tier, res.iteration_time_s)
                    ref.setdefault(f"{tier}_ep", res.breakdown["ep"])
                    row[f"{tier}_step_s"] = res.iteration_time_s
                    row[f"{tier}_vs_balanced"] = res.iteration_time_s / ref[tier]
                    row[f"{tier}_ep_vs_balanced"] = res.breakdown["ep"] / ref[f"{tier}_ep"]
                    row["load_factor"] = res.routing["load_factor"]
                    row["dropped_fraction"] = res.routing["dropped_fraction"]
                rows.append(row)
                print(f"{name} max/mean {load:g} {row['capacity_factor']}: analytic "
                      f"x{row['analytic_vs_balanced']:.3f}, des x{row['des_vs_balanced']:.3f}, "
                      f"dropped {row['dropped_fraction']:.1%}", flush=True)
    return pd.DataFrame(rows)


def main() -> None:
    df = table()
    atomic_write_text(OUT, df.to_csv(index=False, float_format="%.5g"))
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
