"""``trainsim execute --task digits`` for a plan with a synchronisation strategy: the real
run of :mod:`executor.sync` (workers and parameter-server ranks under torchrun, gloo)."""

from __future__ import annotations

import argparse
import json
from typing import Any

__all__ = ["cmd_execute_sync", "cmd_compare_sync", "add_sync_execute_options",
           "format_sync_run", "format_sync_comparison"]

# executor.sync.task.CLI_TASKS, written out: that module imports torch, the parser must not
TASKS = ("digits", "cancer", "digits-resnet18")


def add_sync_execute_options(p: Any) -> None:
    from trainsim.commands.profile import int_at_least

    p.add_argument("--task", choices=TASKS,
                   help="plans with a sync strategy: train this bundled scikit-learn dataset "
                   "(an MLP; digits-resnet18: the digits on ResNet-18) instead of --model")
    p.add_argument("--lr", type=float, default=0.1, help="--task: SGD learning rate "
                   "(default 0.1; asynchronous servers apply it to every push)")
    p.add_argument("--eval-every", type=int_at_least(1), default=None, metavar="N",
                   help="--task: worker 0 measures test accuracy every N steps (default 10; "
                   "compare --task digits-resnet18: at the start and the end only)")


def cmd_execute_sync(args: argparse.Namespace, plan: Any) -> int:
    from executor.launch import ExecutionError
    from executor.sync.launch import execute_sync

    _sync_inputs(args, plan)
    try:
        result = execute_sync(plan, args.task, steps=args.steps or 200, lr=args.lr,
                              eval_every=args.eval_every or 10, timeout_s=args.timeout,
                              threads=args.threads)
    except ExecutionError as exc:
        print(f"trainsim: execution failed: {exc}", file=__import__("sys").stderr)
        return 1
    print(json.dumps(result, indent=2) if args.json else format_sync_run(result))
    return 0


def _sync_inputs(args: argparse.Namespace, plan: Any) -> None:
    from sim.errors import SpecError

    if args.task is None:
        raise SpecError("--task", f"a plan with sync {plan.sync.kind!r} over "
                        f"{plan.communication.architecture!r} runs on a bundled task: give "
                        f"--task {' | '.join(TASKS)}")
    if args.device != "cpu":
        raise SpecError("--device", "the real sync runs use cpu (gloo) for now")


def cmd_compare_sync(args: argparse.Namespace, plan: Any) -> int:
    """``trainsim compare --task``: profile, run and predict a sync plan on this CPU."""
    from executor.launch import ExecutionError
    from executor.sync.compare import compare_sync
    from sim.errors import SpecError

    _sync_inputs(args, plan)
    if not str(args.cluster).startswith("cpu"):
        raise SpecError("--cluster", f"the real sync runs use this host's CPU: give cpu:"
                        f"{plan.dp}, got {args.cluster!r}")
    if args.measured or args.calibrate:
        raise SpecError("--measured" if args.measured else "--calibrate", "not with --task "
                        "(a sync plan is profiled and run in one start)")
    try:
        result = compare_sync(plan, args.task, steps=args.steps, lr=args.lr,
                              eval_every=args.eval_every, timeout_s=args.timeout,
                              threads=args.threads, convergence=args.convergence,
                              target=args.target)
    except ExecutionError as exc:
        print(f"trainsim: execution failed: {exc}", file=__import__("sys").stderr)
        return 1
    print(json.dumps(result, indent=2, default=str) if args.json
          else format_sync_comparison(result, args.target))
    return 0


def format_sync_comparison(c: dict[str, Any], target: float) -> str:
    from executor.sync.launch import updates_to

    m, p, e = c["measured"], c["predicted"], c["errors"]

    def row(name: str, mv: Any, pv: Any, key: str) -> str:
        err = e.get(key)
        show = [f"{v:.4g}" if isinstance(v, float) else ("-" if v is None else str(v))
                for v in (mv, pv)]
        return f"  {name:18s} {show[0]:>12s} {show[1]:>12s}" + (
            f" {err:+8.1%}" if err is not None else "")

    band = p["updates_band"]
    lines = [f"{c['task']}: {m['strategy']['kind']} over {m['architecture']}, "
             f"{m['workers']} workers" + (f" + {m['servers']} servers" if m["servers"] else ""),
             f"  {'':18s} {'measured':>12s} {'predicted':>12s} {'error':>8s}",
             row(f"updates/s ({m['update_scope']})", m["updates_per_s"], p["updates_per_s"],
                 "updates_per_s"),
             row("mean staleness", m["staleness"]["mean"], p["staleness_mean"],
                 "staleness_mean"),
             row(f"updates to {target:.0%}", updates_to(m, target),
                 "diverges" if p["diverges"] else p["updates_to_target"], "updates_to_target")]
    if band:
        lines.append(f"  (predicted band {band[0]:.0f}-{band[1]:.0f} updates)")
    lines += [f"  note: {w}" for w in p["warnings"]]
    return "\n".join(lines)


def format_sync_run(r: dict[str, Any]) -> str:
    from executor.sync.launch import updates_to

    unit = {"global": "steps", "server": "server updates", "local": "local steps a worker"}
    last = r["evals"][-1]
    lines = [f"{r['task']} (MLP {r['hidden']}): {r['strategy']['kind']} over "
             f"{r['architecture']}, {r['workers']} workers"
             + (f" + {r['servers']} servers" if r["servers"] else "")
             + f", {r['steps']} steps each, lr {r['lr']:g}",
             f"  updates/s      {r['updates_per_s']:.4g} ({unit[r['update_scope']]})",
             f"  samples/s      {r['samples_per_s']:.4g}",
             f"  compute        {r['compute_s'] * 1e3:.3g} ms a step (median)",
             f"  test accuracy  {last['accuracy']:.3f} after {last['updates']} updates, "
             f"{last['time_s']:.2f} s"]
    for target in (0.9, 0.95):
        u = updates_to(r, target)
        lines.append(f"  to {target:.0%}         " + (f"{u} updates" if u is not None
                                                      else "not reached"))
    if r["servers"]:
        hist = ", ".join(f"{k}: {v}" for k, v in r["staleness"]["histogram"].items())
        lines.append(f"  staleness      mean {r['staleness']['mean']:.2f} ({hist})")
    return "\n".join(lines)
