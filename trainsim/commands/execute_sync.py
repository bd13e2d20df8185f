"""``trainsim execute --task digits`` for a plan with a synchronisation strategy: the real
run of :mod:`executor.sync` (workers and parameter-server ranks under torchrun, gloo)."""

from __future__ import annotations

import argparse
import json
from typing import Any

__all__ = ["cmd_execute_sync", "add_sync_execute_options", "format_sync_run"]


def add_sync_execute_options(p: Any) -> None:
    from trainsim.commands.profile import int_at_least

    p.add_argument("--task", choices=("digits", "cancer"), help="plans with a sync strategy: "
                   "train this bundled scikit-learn dataset (an MLP) instead of --model")
    p.add_argument("--lr", type=float, default=0.1, help="--task: SGD learning rate "
                   "(default 0.1; asynchronous servers apply it to every push)")
    p.add_argument("--eval-every", type=int_at_least(1), default=10, metavar="N",
                   help="--task: worker 0 measures test accuracy every N steps (default 10)")


def cmd_execute_sync(args: argparse.Namespace, plan: Any) -> int:
    from executor.launch import ExecutionError
    from executor.sync.launch import execute_sync
    from sim.errors import SpecError

    if args.task is None:
        raise SpecError("--task", f"a plan with sync {plan.sync.kind!r} over "
                        f"{plan.communication.architecture!r} runs on a bundled task: give "
                        "--task digits or --task cancer")
    if args.device != "cpu":
        raise SpecError("--device", "the real sync runs use cpu (gloo) for now")
    try:
        result = execute_sync(plan, args.task, steps=args.steps or 200, lr=args.lr,
                              eval_every=args.eval_every, timeout_s=args.timeout,
                              threads=args.threads)
    except ExecutionError as exc:
        print(f"trainsim: execution failed: {exc}", file=__import__("sys").stderr)
        return 1
    print(json.dumps(result, indent=2) if args.json else format_sync_run(result))
    return 0


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
