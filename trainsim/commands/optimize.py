"""``trainsim optimize`` and ``trainsim export``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from trainsim.common import EXIT_NO_PLAN

__all__ = ["add_optimize_parsers", "run_optimize"]



def run_optimize(model_ref: str, cluster_ref: Any, gbs: int, seq: int, top: int,
                 out: Path | None, as_json: bool, workers: int | None,
                 extras: bool = True) -> int:
    """``cluster_ref`` is a preset, a TOML file, or a ClusterSpec (an edited scenario)."""
    from optimizer.report import format_report, summary, write_outputs
    from optimizer.search import optimize
    from sim import ClusterSpec, load_cluster, load_model
    from sim.errors import NoFeasiblePlan
    from trainsim.plots.search import plot_search

    model = load_model(model_ref)
    cluster = cluster_ref if isinstance(cluster_ref, ClusterSpec) else load_cluster(cluster_ref)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)  # a bad --out fails before the search
    try:
        rep = optimize(model, cluster, gbs, seq, top_k=top, workers=workers,
                       progress=not as_json)
    except NoFeasiblePlan as exc:
        print(f"trainsim: no feasible plan: {exc}", file=__import__("sys").stderr)
        return EXIT_NO_PLAN
    s = summary(rep, top)
    print(json.dumps(s, indent=2) if as_json else format_report(s))
    if out is not None:
        files = write_outputs(rep, s, out, _extras(rep, model, cluster, out) if extras else {})
        files += plot_search(rep, out)
        if not as_json:
            print("wrote " + ", ".join(str(f) for f in files))
    return 0


def _extras(rep: Any, model: Any, cluster: Any, out: Path) -> dict[str, str]:
    """The best plan's DES trace and its Megatron-LM arguments (of the best plan Megatron
    can run: ZeRO-2/3 plans, uneven micro-batches and some layer splits are not)."""
    from optimizer.export import export
    from sim import simulate
    from sim.errors import SpecError

    simulate(model, cluster, rep.best.plan, "des", trace=str(out / "best_trace.json"))
    for runnable in [c for c in rep.ranked if c.plan.zero_stage <= 1] + [rep.baseline]:
        if runnable is None:
            continue
        try:  # uneven micro-batches, or layer splits Megatron-LM cannot express, are refused
            files = export("megatron", runnable.plan, model, cluster)
        except SpecError:
            continue
        if runnable is not rep.best:
            files["megatron_args.sh"] = ("# best plan Megatron-LM can run (the overall best: "
                                         f"{_why_not(rep.best.plan)})\n"
                                         + files["megatron_args.sh"])
        return files
    return {}


def _why_not(plan: Any) -> str:
    if plan.zero_stage > 1:
        return f"ZeRO-{plan.zero_stage}"
    if plan.micro_batches_per_replica:
        return "uneven micro-batches per replica"
    return "a layer split Megatron-LM cannot express"


def cmd_optimize(args: argparse.Namespace) -> int:
    return run_optimize(args.model, args.cluster, args.global_batch_size, args.seq_len,
                        args.top, Path(args.out) if args.out else None, args.json, args.workers)


def cmd_export(args: argparse.Namespace) -> int:
    """The framework's main file on stdout (``> ds.json`` is the file itself); with
    ``--out`` every file is written there. An export of several files needs ``--out``."""
    from optimizer.export import export
    from sim import load_cluster, load_model, load_plan
    from sim.errors import SpecError
    from sim.io import atomic_write_files

    plan, model, cluster = load_plan(args.plan), load_model(args.model), \
        load_cluster(args.cluster)
    files = export(args.format, plan, model, cluster)
    if args.out:
        atomic_write_files({Path(args.out) / name: text for name, text in files.items()})
        print("wrote " + ", ".join(str(Path(args.out) / n) for n in files), file=sys.stderr)
        return 0
    if len(files) > 1:
        raise SpecError("--out", f"this export is {len(files)} files ({', '.join(files)}): "
                        "give --out DIR to write them")
    sys.stdout.write(next(iter(files.values())))
    return 0


def add_optimize_parsers(sub: Any, model_help: str, cluster_help: str) -> None:
    p = sub.add_parser("optimize", help="search the best parallel plans",
                       description="Memory filter, analytic tier over every valid plan, DES "
                       "for the top K, local moves on the bottleneck; Megatron-style baseline "
                       "and a lower bound. Exit code 3 when no plan fits.")
    p.add_argument("--model", required=True, help=model_help)
    p.add_argument("--cluster", required=True, help=cluster_help)
    p.add_argument("--global-batch-size", type=int, required=True, help="sequences per step")
    p.add_argument("--seq-len", type=int, required=True, help="tokens per sequence")
    p.add_argument("--top", type=int, default=8, help="plans simulated with the DES and "
                   "shown (default 8)")
    p.add_argument("--workers", type=int, help="processes (default: all cores)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--out", metavar="DIR", help="write best_plan.json, plans.csv, "
                   "report.json, plots, the best plan's trace and Megatron-LM arguments")
    p.set_defaults(func=cmd_optimize)
    e = sub.add_parser("export", help="launch arguments or config for a framework")
    e.add_argument("--plan", required=True, help="plan JSON")
    e.add_argument("--model", required=True, help=model_help)
    e.add_argument("--cluster", required=True, help=cluster_help)
    e.add_argument("--format", required=True,
                   choices=["megatron", "torchtitan", "deepspeed", "torchrun"],
                   help="framework: megatron (Megatron-LM core_r0.16), torchtitan (0.3.0), "
                   "deepspeed (0.19.8), torchrun (this project's executor worker); a rank "
                   "table is added when the placement needs one")
    e.add_argument("--out", metavar="DIR", help="write the files here (needed when the "
                   "export is more than one file); without it the one file goes to stdout")
    e.set_defaults(func=cmd_export)
