"""``trainsim execute`` and ``trainsim compare``: run a plan for real, and beside the
simulator."""

from __future__ import annotations

import argparse
import dataclasses
import json
from typing import Any

__all__ = ["add_execute_parsers"]


def _model(args: argparse.Namespace) -> Any:
    from executor.model import scale_model
    from sim.errors import SpecError
    from sim.spec.workload import Workload
    from sim.spec.zoo import load_any

    if args.model is None:
        raise SpecError("--model", "is required (or --task with a plan that has a sync "
                        "strategy)")
    model = load_any(args.model)
    if args.scale_layers or args.scale_hidden:
        if isinstance(model, Workload):
            raise SpecError("--scale-layers/--scale-hidden", "scale transformer models only")
        model = scale_model(model, args.scale_layers, args.scale_hidden)
    return model


def _run_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    from sim.errors import SpecError

    fault = None
    if args.inject_fault:
        kind, _, where = args.inject_fault.partition("@")
        rank, _, step = where.partition(":")
        if kind not in ("crash", "hang") or not rank.isdigit() or not step.isdigit():
            raise SpecError("--inject-fault", f"must be crash@RANK:STEP or hang@RANK:STEP, "
                            f"got {args.inject_fault!r}")
        fault = {"kind": kind, "rank": int(rank), "step": int(step)}
    return {"nproc": args.nproc, "steps": args.steps or 5, "warmup": args.warmup,
            "timeout_s": args.timeout, "device": args.device, "threads": args.threads,
            "fault": fault}


def _failed(exc: Exception) -> int:
    print(f"trainsim: execution failed: {exc}", file=__import__("sys").stderr)
    return 1


def cmd_execute(args: argparse.Namespace) -> int:
    from executor.graph_run import graph_split
    from executor.launch import ExecutionError, execute
    from sim import load_plan
    from sim.spec.plan import validate
    from sim.spec.workload import Workload

    plan = load_plan(args.plan)
    from sim.spec.sync import is_default_sync

    if args.task or not is_default_sync(plan):
        from trainsim.commands.execute_sync import cmd_execute_sync

        return cmd_execute_sync(args, plan)
    model = _model(args)
    if isinstance(model, Workload):
        if plan.pp > 1 and plan.layers_per_stage is None:  # where the run can split
            from sim import load_cluster
            from sim.cost.graph import layer_times

            cpu = load_cluster(f"cpu:{plan.world_size}")
            plan = dataclasses.replace(plan, layers_per_stage=graph_split(
                model, plan, layer_times(model, cpu, plan)))
    else:
        validate(plan, model)
    try:
        result = execute(model, plan, **_run_kwargs(args))
    except ExecutionError as exc:
        return _failed(exc)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    steps = ", ".join(f"{t:.3f}" for t in result["step_s"])
    losses = ", ".join("-" if v is None else f"{v:.3f}" for v in result["loss"])
    print(f"{model.name}: {plan.world_size} ranks on {args.device}, {result['steps']} timed "
          f"steps after {result['warmup']} warm-up\n"
          f"  iteration {result['iteration_s']:.3f} s (median; {result['min_s']:.3f}-"
          f"{result['max_s']:.3f}), {result['tokens_per_s']:.0f} tokens/s\n"
          f"  steps     {steps}\n  loss      {losses}\n"
          f"  peak mem  " + ", ".join(f"{b / 2**30:.2f}" for b in result["peak_bytes"])
          + " GiB per rank")
    for row in result["collectives"]["0"]:
        print(f"  rank 0 {row['group']:9s} {row['kind']:14s} x{row['count']:<4d} "
              f"{row['bytes']:,d} bytes")
    return 0


def _measured(path: str | None) -> dict[str, Any] | None:
    from pathlib import Path

    from sim.errors import SpecError
    from sim.io import read_text

    if path is None:
        return None
    try:
        return dict(json.loads(read_text(Path(path), "--measured")))
    except (json.JSONDecodeError, TypeError, ValueError):
        raise SpecError("--measured", f"{path} is not the JSON object `trainsim execute "
                        "--json` prints") from None


def cmd_compare(args: argparse.Namespace) -> int:
    from executor.compare import calibrate, calibration_target, compare, format_comparison
    from executor.launch import ExecutionError
    from sim import load_cluster, load_plan
    from sim.errors import SpecError
    from sim.spec.sync import is_default_sync
    from trainsim.commands.profile import with_profile_options

    plan = load_plan(args.plan)
    if args.task or not is_default_sync(plan):
        from trainsim.commands.execute_sync import cmd_compare_sync

        return cmd_compare_sync(args, plan)
    model = _model(args)
    cluster = with_profile_options(load_cluster(args.cluster), args)
    if args.calibration_out and not args.calibrate:
        raise SpecError("--calibration-out", "only with --calibrate")
    if args.calibrate:  # a bad target is refused before the run, not after
        calibration_target(cluster, args.calibration_out)
    from executor.compare import compare_graph
    from sim.spec.workload import Workload

    run = compare_graph if isinstance(model, Workload) else compare
    try:
        result = run(model, plan, cluster, args.fidelity, _measured(args.measured),
                     **_run_kwargs(args))
    except ExecutionError as exc:
        return _failed(exc)
    if args.calibrate:
        result["calibration"] = calibrate(cluster, [result], args.calibration_out)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(format_comparison(result))
    if args.calibrate:
        cal = result["calibration"]
        print(f"calibrated: compute scale ({cal['compute_stat']}) {cal['compute_scale']:.3f} "
              f"(x{cal['step']:.3f} this run) written to {cal['path']}; it applies only "
              f"where --profile names {cal['profile']} (predictions from "
              f"{cal['calibrates']} are unchanged)")
    return 0


def _common(p: argparse.ArgumentParser, model_help: str) -> None:
    from trainsim.commands.profile import int_at_least, positive_seconds

    p.add_argument("--model", help=model_help)
    p.add_argument("--plan", required=True, help="plan JSON file")
    p.add_argument("--nproc", type=int_at_least(1), default=None,
                   help="ranks on this host (default: the plan's world size)")
    p.add_argument("--steps", type=int_at_least(1), default=None,
                   help="timed steps (default 5; --task: local steps a worker, default 200)")
    p.add_argument("--warmup", type=int_at_least(0), default=2,
                   help="untimed first steps (default 2)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="cpu (gloo) or cuda (NCCL); default cpu")
    p.add_argument("--threads", type=int_at_least(1), default=1,
                   help="CPU threads per rank (default 1)")
    p.add_argument("--timeout", type=positive_seconds, default=120.0,
                   help="seconds without progress before every rank is stopped (default 120)")
    p.add_argument("--scale-layers", type=int_at_least(1), metavar="N",
                   help="run N layers of the model")
    p.add_argument("--scale-hidden", type=int_at_least(1), metavar="H",
                   help="run at hidden size H (heads and FFN scaled with it)")
    p.add_argument("--inject-fault", metavar="KIND@RANK:STEP",
                   help="test fault handling: crash@1:2 or hang@1:2")
    p.add_argument("--json", action="store_true", help="print JSON")


def add_execute_parsers(sub: Any, model_help: str, cluster_help: str) -> None:
    from trainsim.commands.profile import add_profile_options

    p = sub.add_parser("execute", help="run a plan for real with torch.distributed")
    _common(p, model_help)
    from trainsim.commands.execute_sync import add_sync_execute_options

    add_sync_execute_options(p)
    p.set_defaults(func=cmd_execute)
    c = sub.add_parser("compare", help="run a plan and compare it with the simulator")
    _common(c, model_help)
    c.add_argument("--cluster", required=True, help=cluster_help)
    add_profile_options(c, "profile DB (default: the cluster's)")
    c.add_argument("--fidelity", choices=("analytic", "des"), default="analytic",
                   help="simulator tier (default analytic)")
    c.add_argument("--measured", metavar="FILE", help="compare with this earlier "
                   "`trainsim execute --json` result of the same model and plan instead of "
                   "running it again")
    c.add_argument("--calibrate", action="store_true", help="write the measured/predicted "
                   "correction as a calibrated profile of its own (default "
                   "$TRAINSIM_HOME/profiles/DEVICE, ~/.trainsim without TRAINSIM_HOME); "
                   "it applies only where --profile names it")
    c.add_argument("--calibration-out", metavar="DIR", help="where --calibrate writes the "
                   "calibrated profile (never the measured profile or the installed package)")
    add_sync_execute_options(c)
    c.add_argument("--convergence", metavar="MODEL|CSV", help="--task: the statistical-"
                   "efficiency model that predicts updates to --target (digits-cpu, "
                   "cancer-cpu, or a CSV of measured runs)")
    c.add_argument("--target", type=float, default=0.95, help="--task: test accuracy "
                   "(0.9 or 0.95; default 0.95)")
    c.set_defaults(func=cmd_compare)
