"""``trainsim simulate``: predict one training iteration of a plan."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from trainsim.common import (
    CLUSTER_HELP,
    MODEL_HELP,
    DesProgress,
    add_watch_options,
    max_wall_s,
    progress_after_s,
    write_run,
)

__all__ = ["cmd_simulate", "add_simulate_parser"]


def cmd_simulate(args: argparse.Namespace) -> int:
    from sim import SpecError, load_cluster, load_plan, simulate
    from sim.des.watch import Watch
    from sim.spec.zoo import load_any
    from trainsim.commands.faults import faults_of
    from trainsim.commands.profile import with_profile_options
    from trainsim.report import format_result

    model, cluster = load_any(args.model), load_cluster(args.cluster)
    cluster = with_profile_options(cluster, args)
    if args.stack is not None:  # "" takes the cluster's stack off
        import dataclasses

        cluster = dataclasses.replace(cluster, stack=args.stack)
    if args.calibration:
        from sim.spec.calibration import apply_calibration, load_calibration

        cluster = apply_calibration(cluster, load_calibration(args.calibration))
    plan = load_plan(args.plan)
    from sim.spec.sync import is_default_sync

    if not is_default_sync(plan):
        from trainsim.commands.sync import run_sync

        return run_sync(args, model, cluster, plan, faults_of(args))
    if args.steps is not None or args.jitter or args.convergence:
        raise SpecError("--steps/--jitter/--convergence", "are for plans with a sync "
                        "strategy other than bsp over all-reduce (plan new --sync ...)")
    limit = max_wall_s(args)
    if args.fidelity != "des" and (args.trace or args.no_reduce or limit):
        raise SpecError("--trace/--no-reduce/--max-wall-s", "need --fidelity des")
    faults = faults_of(args)
    progress = None if args.no_progress else DesProgress()
    watch = Watch(max_wall_s=limit, progress=progress, show_after_s=progress_after_s()) \
        if args.fidelity == "des" else None
    try:
        result = simulate(model, cluster, plan, fidelity=args.fidelity,
                          reduce=not args.no_reduce, trace=args.trace, faults=faults,
                          watch=watch)
    finally:
        if progress is not None:
            progress.close()
    if args.out:
        write_run(Path(args.out), result, model, cluster, plan, faults)
    table = _explain(args, model, cluster, plan, faults) if args.explain else None
    if args.json:
        out = result.to_dict() | ({"explain": table} if table is not None else {})
        print(json.dumps(out, indent=2))
        return 0
    print(format_result(result, plan, faults))
    if table is not None:
        print(_explain_text(table, args.explain_delta))
    return 0


def _explain(args: argparse.Namespace, model: Any, cluster: Any, plan: Any, faults: Any
             ) -> list[dict[str, Any]]:
    from optimizer.explain import explain
    from sim import SpecError

    if faults is not None:
        raise SpecError("--explain", "explains a plan without stragglers or failures")
    _, rows = explain(model, cluster, plan, args.fidelity, args.explain_delta)
    return [r.to_dict() for r in rows]


def _explain_text(rows: list[dict[str, Any]], delta: float) -> str:
    lines = [f"what moves the iteration time (each knob alone at -/+{delta:.0%}):",
             f"  {'knob':34s} {'kind':10s} {'value':>10s} {'-':>10s} {'+':>10s} "
             f"{'elasticity':>10s}"]
    for r in rows:
        lines.append(f"  {r['knob']:34s} {r['kind']:10s} {r['value']:10.4g} "
                     f"{r['minus_s']:9.4g}s {r['plus_s']:9.4g}s {r['elasticity']:10.3f}"
                     + (f"  ({r['note']})" if r["note"] else ""))
    lines.append("  elasticity: relative change of the iteration time per relative change "
                 "of the knob; 0: the knob does not enter (e.g. GEMM assumptions on a "
                 "profiled cluster)")
    return "\n".join(lines)


def add_simulate_parser(sub: Any) -> None:
    from trainsim.commands.profile import add_profile_options

    p = sub.add_parser("simulate", help="predict one training iteration of a plan",
                       description="Predict one training iteration: time, throughput, MFU, "
                       "memory, bubble and a breakdown of the critical path.")
    p.add_argument("--model", required=True, help=MODEL_HELP)
    p.add_argument("--cluster", required=True, help=CLUSTER_HELP)
    p.add_argument("--plan", required=True, help="plan JSON (make one with: trainsim plan new)")
    p.add_argument("--fidelity", default="analytic", choices=["analytic", "des"],
                   help="simulator tier: analytic (closed form, default) or des (SimPy "
                   "discrete-event, flow-level network)")
    p.add_argument("--trace", metavar="FILE", help="des: write a Chrome trace JSON "
                   "(pid = node, tid = device stream; open in Perfetto)")
    p.add_argument("--no-reduce", action="store_true", help="des: simulate every rank and "
                   "flow instead of one representative per symmetry class of replicas")
    add_profile_options(p, "profile DB to time operations from (overrides the cluster's; "
                        "a DB root or one device folder)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--out", metavar="DIR", help="also write inputs.json, result.json and "
                   "summary.txt to this run folder")
    add_watch_options(p, "a des run")
    p.add_argument("--stack", metavar="NAME", help="software stack on the cluster's devices "
                   "(overrides the cluster's, \"\" for none; trainsim hardware --stacks lists "
                   "them)")
    p.add_argument("--calibration", metavar="FILE", help="apply a calibration file (from "
                   "trainsim calibrate) to the cluster's devices, after the stack")
    p.add_argument("--explain", action="store_true",
                   help="also move each hardware assumption and cluster input by "
                   "--explain-delta alone and show which move the iteration time most")
    p.add_argument("--explain-delta", type=float, default=0.1, metavar="FRACTION",
                   help="--explain: the relative move of each knob (default 0.1)")
    from trainsim.commands.sync import add_sync_options

    add_sync_options(p)
    p.set_defaults(func=cmd_simulate)
