"""``trainsim simulate`` for a plan with a synchronisation strategy other than BSP over
all-reduce: many steps, a clock per worker (:mod:`sim.strategies`)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

__all__ = ["run_sync", "add_sync_options", "format_sync", "plan_sections"]


def add_sync_options(p: Any) -> None:
    """``--steps`` and ``--jitter`` of ``trainsim simulate``."""
    from trainsim.commands.profile import int_at_least

    p.add_argument("--steps", type=int_at_least(1), default=None, metavar="N",
                   help="plans with a sync strategy: local steps each worker runs (default "
                   "200, or 20 averaging periods when longer)")
    p.add_argument("--convergence", metavar="MODEL|CSV", help="plans with a sync strategy: "
                   "time to --target accuracy from a statistical-efficiency model fitted to "
                   "measured runs: digits-cpu or cancer-cpu (bundled) or a CSV of your runs "
                   "(docs/guide/sync.md)")
    p.add_argument("--lr", type=float, metavar="LR", help="--convergence: the learning rate")
    p.add_argument("--target", type=float, default=0.95, metavar="ACC",
                   help="--convergence: test accuracy to reach, 0.9 or 0.95 (default 0.95)")
    p.add_argument("--jitter", metavar="DIST", help="plans with a sync strategy: a per-step "
                   "slow-down of every worker's compute drawn from DIST (lognormal:SIGMA or "
                   "uniform:LO:HI), seeded by --seed")


def plan_sections(p: Any) -> None:
    """``--sync``, ``--communication`` and ``--compression`` of ``trainsim plan new``."""
    p.add_argument("--sync", metavar="KIND[:NAME=VALUE,...]", help="how data-parallel "
                   "workers synchronise: bsp (default), asp, ssp:staleness=S, "
                   "local-sgd:period=H, diloco:period=H, two-stage:important_fraction=F, "
                   "gossip:graph=ring, backup-workers:backups=B (docs/guide/sync.md)")
    p.add_argument("--communication", metavar="ARCH[:NAME=VALUE,...]", help="auto (default), "
                   "allreduce or ps:servers=N,placement=dedicated|colocated,"
                   "sharding=size-balanced|round-robin,server_cpu_GBps=X")
    p.add_argument("--compression", metavar="KIND[:NAME=VALUE,...]", help="gradient "
                   "compression: none (default), fp16, int8, topk:ratio=R, powersgd:rank=R, "
                   "onebit; error_feedback=true|false")


def section_fields(args: argparse.Namespace) -> dict[str, Any]:
    from sim.spec.sync import parse_section

    out = {}
    for name, key in (("sync", "kind"), ("communication", "architecture"),
                      ("compression", "kind")):
        text = getattr(args, name, None)
        if text:
            out[name] = parse_section(f"--{name}", text, key)
    return out


def run_sync(args: argparse.Namespace, model: Any, cluster: Any, plan: Any, faults: Any
             ) -> int:
    from sim.errors import SpecError
    from sim.spec.faults import parse_dist
    from sim.strategies import covering_steps, simulate_sync

    if args.no_reduce:
        raise SpecError("--no-reduce", "is for one-step DES runs, not a sync strategy's")
    jitter = parse_dist(args.jitter, "--jitter") if args.jitter else None
    if args.lr is not None and args.convergence is None:
        raise SpecError("--lr", "is the learning rate of --convergence's time to target: "
                        "give --convergence too")
    result = simulate_sync(model, cluster, plan, args.fidelity,
                           steps=covering_steps(plan, 200) if args.steps is None else args.steps,
                           faults=faults,
                           jitter=jitter, seed=args.seed, trace=args.trace,
                           convergence=args.convergence, lr=args.lr, target=args.target)
    if args.out:
        from sim.io import atomic_write_text

        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        inputs = {"model": model.name, "cluster": cluster.to_dict(), "plan": plan.to_dict(),
                  "steps": result.steps, "jitter": args.jitter, "seed": args.seed}
        atomic_write_text(out / "inputs.json", json.dumps(inputs, indent=2) + "\n")
        atomic_write_text(out / "result.json", json.dumps(result.to_dict(), indent=2) + "\n")
        atomic_write_text(out / "summary.txt", format_sync(result) + "\n")
    print(json.dumps(result.to_dict(), indent=2) if args.json else format_sync(result))
    return 0


def format_sync(r: Any) -> str:
    """The text summary of a :class:`sim.strategies.result.SyncResult`."""
    unit = {"global": "steps", "server": "server updates", "local": "local steps a worker"}
    lines = [f"{r.model} on {r.cluster}: {r.strategy}, {r.workers} workers, fidelity "
             f"{r.fidelity}" + (f" ({r.steps} steps each)" if r.steps else " (closed form)"),
             f"  updates/s             {r.updates_per_s:.4g} ({unit[r.update_scope]})",
             f"  samples/s             {r.samples_per_s:.4g}",
             f"  time per update       {r.step_time_s:.4g} s"
             + (" (a worker's)" if r.update_scope == "server" else ""),
             f"  BSP iteration         {r.bsp_iteration_s:.4g} s (one-step tier, for reference)"]
    st = r.staleness
    if r.update_scope == "server" and st["mean"] is not None:  # None: no closed form
        lines.append(f"  staleness             mean {st['mean']:.2f}" + (
            f", p99 {st['p99']:.0f}, max {st['max']}" if "p99" in st else "") + " updates")
    if r.idle_fraction:
        idle = r.idle_fraction
        lines.append(f"  idle (not computing)  mean {sum(idle) / len(idle):.1%}, worst "
                     f"{max(idle):.1%}")
    for srv in r.servers:
        lines.append(f"  server {srv['server']}              CPU {srv['cpu']:.1%}, ingress "
                     f"{srv['ingress']:.1%}")
    if r.dropped_fraction:
        lines.append(f"  dropped pushes        {r.dropped_fraction:.1%} (backup workers)")
    if r.warmup_updates_dropped:
        lines.append(f"  warm-up dropped       {r.warmup_updates_dropped} updates (MSER-5)")
    lines += _time_lines(r.time_to_target)
    lines += [f"  note: {w}" for w in r.warnings]
    return "\n".join(lines)


def _time_lines(t: dict[str, Any]) -> list[str]:
    if not t:
        return []
    head = f"  to {t['target']:.0%} accuracy   "
    if t["diverges"]:
        out = [head + f"diverges (lr {t['lr']:g} x (1 + {t['k']:.3g})^"
               f"{t['model']['gamma']:g} over the measured threshold "
               f"{t['model']['threshold']:.3g})"]
    else:
        out = [head + f"{t['updates']:.0f} updates ({t['updates_low']:.0f}-"
               f"{t['updates_high']:.0f}), {t['seconds']:.4g} s ({t['seconds_low']:.4g}-"
               f"{t['seconds_high']:.4g})"]
    out.append(f"  statistical efficiency from: {t['task']}")
    out += [f"  note: {x} (extrapolated)" for x in t["extrapolated"]]
    return out
