"""The optimizer's numbers: optimality against exhaustive DES, speed, published plans.

Run: ``.venv/bin/python experiments/optimizer_checks.py [optimality|speed|megatron]``
(default: all). Writes ``experiments/results/optimizer_*.csv``.

* optimality: on cases small enough to simulate every plan that fits with the DES, the
  optimizer's best vs the exhaustive optimum, and the share of plans it simulated;
* speed: a full search for gpt3-175b on dgx-a100:128 (global batch 1536, seq 2048), and the
  analytic tier's plans/s on one core;
* megatron: for each row of SC'21 Table 1, the optimizer's best (searching with the row's
  fixed choices: fp16, materialised attention, no gradient-reduce overlap) vs the published
  configuration, both with the DES; and the best among plans Megatron-LM can run (ZeRO <= 1),
  since the overall winners use ZeRO-3, whose cost model is not calibrated.
"""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import sys
import time
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))

from megatron_sc21 import load_rows, row_cluster, row_model, row_plan  # noqa: E402

from optimizer import scoring  # noqa: E402
from optimizer import search as s  # noqa: E402
from optimizer.constraints import Constraints
from optimizer.space import SearchSpace  # noqa: E402
from sim import ModelSpec, load_cluster, load_model, simulate  # noqa: E402
from sim.io import atomic_write_text  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
SMALL = [
    ("llama3-8b", "dgx-h100:2", 16, 4096, None),
    ("gpt3-175b-8-layers", "dgx-a100:4", 32, 2048,
     ModelSpec("gpt3-175b-8-layers", 8, 12288, 96, 49152, 50257, max_seq_len=2048,
               linear_bias=True, dropout=True)),
]


def _exhaustive(model: ModelSpec, cluster_ref: str, gbs: int, seq: int) -> tuple[float, int]:
    cluster = load_cluster(cluster_ref)
    space = SearchSpace(model, cluster, gbs, seq)
    plans = list(space)
    scoring.init_worker(model, cluster)
    fits = [p for p, (sec, _) in zip(plans, scoring.score(plans), strict=True)
            if sec < float("inf")]
    with mp.get_context("fork").Pool(None, scoring.init_worker, (model, cluster)) as pool:
        results = pool.map(scoring.des_result, fits, chunksize=4)
    # des_result is None only past the DES's micro-batch limit, which no plan here reaches
    return min(r.iteration_time_s for r in results if r is not None), len(fits)


def optimality() -> pd.DataFrame:
    rows = []
    for name, cluster, gbs, seq, spec in SMALL:
        model = spec or load_model(name)
        t0 = time.perf_counter()
        best, n = _exhaustive(model, cluster, gbs, seq)
        wall_ex = time.perf_counter() - t0
        rep = s.optimize(model, load_cluster(cluster), gbs, seq, progress=False)
        rows.append({"case": f"{name} on {cluster}", "plans_that_fit": n,
                     "exhaustive_best_s": best, "optimizer_best_s": rep.best.best_s,
                     "gap_pct": 100 * (rep.best.best_s / best - 1),
                     "des_evaluated": rep.des_evaluated,
                     "des_share_pct": 100 * rep.des_evaluated / n,
                     "exhaustive_wall_s": wall_ex, "optimizer_wall_s": rep.wall_s})
    return pd.DataFrame(rows)


def speed() -> pd.DataFrame:
    model, cluster = load_model("gpt3-175b"), load_cluster("dgx-a100:128")
    rep = s.optimize(model, cluster, 1536, 2048, progress=False)
    space = SearchSpace(model, cluster, 1536, 2048)
    s._init(model, cluster)
    fits = [c.plan for c in rep.candidates[:3000]]
    t0 = time.perf_counter()
    s._score(fits)
    per_s = len(fits) / (time.perf_counter() - t0)
    everything = list(space)
    t0 = time.perf_counter()
    s._score(everything[:5000])
    all_per_s = 5000 / (time.perf_counter() - t0)
    return pd.DataFrame([{"case": "gpt3-175b on dgx-a100:128, batch 1536 x 2048",
                          "search_wall_s": rep.wall_s, "space": rep.space_size,
                          "feasible": rep.feasible, "des_evaluated": rep.des_evaluated,
                          "analytic_plans_per_s_feasible_one_core": per_s,
                          "plans_per_s_with_memory_filter_one_core": all_per_s}])


def megatron() -> pd.DataFrame:
    rows = []
    for row in load_rows():
        model, cluster, published = row_model(row), row_cluster(row), row_plan(row)
        space = SearchSpace(model, cluster, published.global_batch_size, published.seq_len,
                            dtype="fp16", attention="standard", overlap_grad_reduce=False)
        rep = s.optimize(model, cluster, published.global_batch_size, published.seq_len,
                         progress=False, space=space)
        pub = simulate(model, cluster, published, "des").iteration_time_s
        megatron_space = dataclasses.replace(space, constraints=Constraints(max_zero_stage=1))
        runnable = s.optimize(model, cluster, published.global_batch_size, published.seq_len,
                              progress=False, space=megatron_space).best
        rows.append({"params_B": row["params_B"], "gpus": row["gpus"],
                     "published_plan_des_s": pub, "optimizer_best_des_s": rep.best.best_s,
                     "speedup": pub / rep.best.best_s,
                     "best_plan": f"tp{rep.best.plan.tp} pp{rep.best.plan.pp} "
                                  f"dp{rep.best.plan.dp} cp{rep.best.plan.cp} "
                                  f"mb{rep.best.plan.micro_batch_size} "
                                  f"zero{rep.best.plan.zero_stage} {rep.best.plan.recompute}",
                     "megatron_runnable_best_des_s": runnable.best_s,
                     "megatron_runnable_speedup": pub / runnable.best_s,
                     "megatron_runnable_plan": f"tp{runnable.plan.tp} pp{runnable.plan.pp} "
                                               f"dp{runnable.plan.dp} vpp{runnable.plan.vpp} "
                                               f"mb{runnable.plan.micro_batch_size} "
                                               f"{runnable.plan.recompute}",
                     "search_wall_s": rep.wall_s})
        print(rows[-1], flush=True)
    return pd.DataFrame(rows)


def main() -> None:
    wanted = sys.argv[1:] or ["optimality", "speed", "megatron"]
    for name in wanted:
        df = {"optimality": optimality, "speed": speed, "megatron": megatron}[name]()
        atomic_write_text(RESULTS / f"optimizer_{name}.csv",
                          df.to_csv(index=False, float_format="%.5g"))
        with pd.option_context("display.width", 220, "display.max_columns", 20):
            print(df.round(4).to_string(index=False))


if __name__ == "__main__":
    main()
