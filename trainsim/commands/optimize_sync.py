"""``trainsim optimize-sync``: rank synchronisation strategies for a parallel plan
(:mod:`optimizer.sync_search`)."""

from __future__ import annotations

import argparse
import json
import math
from typing import Any

__all__ = ["add_optimize_sync_parser"]


def cmd_optimize_sync(args: argparse.Namespace) -> int:
    from optimizer.sync_search import optimize_sync
    from sim import load_cluster, load_plan
    from sim.errors import SpecError
    from sim.spec.faults import faults_from_options
    from sim.spec.zoo import load_any

    model, cluster = load_any(args.model), load_cluster(args.cluster)
    faults = faults_from_options(args.straggler) if args.straggler else None
    kw = {"convergence": args.convergence, "lr": args.lr, "target": args.target,
          "des_top": args.des_top, "steps": args.steps, "faults": faults}
    if args.plan:
        search = optimize_sync(model, cluster, load_plan(args.plan), args.objective, **kw)
    else:
        from optimizer.sync_joint import optimize_joint

        for name in ("global_batch_size", "seq_len"):
            if getattr(args, name) is None:
                raise SpecError(f"--{name.replace('_', '-')}", "is needed without --plan "
                                "(the joint search finds the parallel plan too)")
        search = optimize_joint(model, cluster, args.global_batch_size, args.seq_len,
                                args.objective, parallel_top=args.parallel_top,
                                dtype=args.dtype, workers=args.workers, **kw)
    if args.json:
        rows = [{k: v for k, v in r.items() if k != "plan"} | {"plan": r["plan"].to_dict()}
                for r in search.rows[:args.top]]
        print(json.dumps({"objective": search.objective, "rows": rows,
                          "pareto": search.pareto, "notes": search.notes,
                          "baseline": {k: v for k, v in search.baseline.items()
                                       if k != "plan"}}, indent=2, default=str))
        return 0
    print(_table(search, args.top))
    return 0


def _time(row: dict[str, Any]) -> str:
    t = row["time_to_target_s"]
    if row["diverges"]:
        return "diverges"
    if t is None or not math.isfinite(t):
        return "-"
    lo, hi = row["time_band_s"]
    return f"{t:.4g} s ({lo:.3g}-{hi:.3g})"


def _table(search: Any, top: int) -> str:
    base = search.baseline
    lines = [f"objective {search.objective}; baseline {base['strategy']}: "
             f"{base['samples_per_s']:.4g} samples/s, to target {_time(base)}",
             f"{'#':>3}  {'strategy':58s} {'tier':8s} {'samples/s':>11s}  to target"]
    for i, r in enumerate(search.rows[:top]):
        mark = " *" if r["strategy"] in search.pareto else ""
        lines.append(f"{i:>3}  {r['strategy'][:58]:58s} {r['fidelity']:8s} "
                     f"{r['samples_per_s']:11.4g}  {_time(r)}{mark}")
    lines.append("  * on the Pareto set of throughput vs samples to the target")
    lines += [f"  note: {n}" for n in search.notes]
    return "\n".join(lines)


def add_optimize_sync_parser(sub: Any, model_help: str, cluster_help: str) -> None:
    from trainsim.commands.profile import int_at_least

    p = sub.add_parser("optimize-sync", help="rank synchronisation strategies for a plan",
                       description="Try BSP, ASP, SSP, backup workers, local SGD, DiLoCo, "
                       "two-stage and gossip, over all-reduce or parameter servers, with "
                       "compression, for the plan's data-parallel workers; rank them by "
                       "time-to-accuracy (a measured statistical-efficiency model) or "
                       "throughput.")
    p.add_argument("--model", required=True, help=model_help)
    p.add_argument("--cluster", required=True, help=cluster_help)
    p.add_argument("--plan", help="the parallel plan (its dp workers); without it, the "
                   "parallel plan is searched too (--global-batch-size, --seq-len)")
    p.add_argument("--global-batch-size", type=int_at_least(1), help="sequences per step "
                   "(joint search)")
    p.add_argument("--seq-len", type=int_at_least(1), help="tokens per sequence (joint "
                   "search)")
    p.add_argument("--parallel-top", type=int_at_least(1), default=3, metavar="K",
                   help="joint search: try the strategies on the K fastest BSP parallel "
                   "plans (default 3, at most 16)")
    p.add_argument("--dtype", default="bf16", choices=("bf16", "fp16", "fp8", "fp32"),
                   help="joint search: the plans' dtype (default bf16)")
    p.add_argument("--workers", type=int_at_least(1), help="joint search: processes of the "
                   "parallel search (default: all cores)")
    p.add_argument("--objective", choices=("time-to-accuracy", "throughput"),
                   default="time-to-accuracy", help="what to rank by (default "
                   "time-to-accuracy, which needs --convergence and --lr)")
    p.add_argument("--convergence", metavar="MODEL|CSV", help="statistical-efficiency model: "
                   "digits-cpu or cancer-cpu (bundled) or a CSV of measured runs")
    p.add_argument("--lr", type=float, help="the learning rate of the runs")
    p.add_argument("--target", type=float, default=0.95, help="test accuracy to reach "
                   "(0.9 or 0.95; default 0.95)")
    p.add_argument("--des-top", type=int_at_least(0), default=5, metavar="K",
                   help="re-simulate the best K in the multi-step DES (default 5)")
    p.add_argument("--steps", type=int_at_least(1), default=200, help="DES steps a worker "
                   "(default 200)")
    p.add_argument("--straggler", action="append", default=[], metavar="SCOPE:NAME=FACTOR",
                   help="slow a GPU, node or link (as trainsim simulate)")
    p.add_argument("--top", type=int_at_least(1), default=15, help="rows shown (default 15)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_optimize_sync)
