"""``trainsim optimize`` and ``trainsim export``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from sim.errors import SpecError
from trainsim.common import EXIT_NO_PLAN, add_watch_options

__all__ = ["add_optimize_parsers", "run_optimize", "constraints_of",
           "add_constraint_options"]



def run_optimize(model_ref: str, cluster_ref: Any, gbs: int, seq: int, top: int,
                 out: Path | None, as_json: bool, workers: int | None,
                 extras: bool = True, constraints: Any = None, dtype: str = "bf16",
                 max_wall_s: float | None = None, progress: bool = True) -> int:
    """``cluster_ref`` is a preset, a TOML file, or a ClusterSpec (an edited scenario).
    ``out`` is created only once the search has found a plan. After ``max_wall_s`` the local
    moves of every search stop (the report says so)."""
    import time

    from optimizer.constraints import Constraints
    from optimizer.report import summary
    from optimizer.search import optimize
    from optimizer.space import SearchSpace
    from sim import ClusterSpec, load_cluster
    from sim.errors import NoFeasiblePlan
    from sim.spec.workload import Workload
    from sim.spec.zoo import load_any
    from trainsim.common import check_out_dir

    check_out_dir(out, "--out")  # a bad --out fails before the search, creating nothing
    for name, value in (("--top", top), ("--workers", workers)):
        if value is not None and value < 1:
            raise SpecError(name, f"must be >= 1, got {value}")
    model = load_any(model_ref)
    cluster = cluster_ref if isinstance(cluster_ref, ClusterSpec) else load_cluster(cluster_ref)
    if isinstance(model, Workload):
        return _optimize_graph(model, cluster, gbs, top, out, as_json, constraints, dtype)
    space = SearchSpace(model, cluster, gbs, seq, dtype,
                        constraints=constraints or Constraints())
    show = progress and not as_json
    deadline = None if max_wall_s is None else time.perf_counter() + max_wall_s
    try:
        rep = optimize(model, cluster, gbs, seq, top_k=top, workers=workers,
                       progress=show, space=space, deadline=deadline)
        megatron = _megatron_best(rep, space, top, workers, show, deadline) if extras \
            else None
    except NoFeasiblePlan as exc:
        print(f"trainsim: no feasible plan: {exc}", file=sys.stderr)
        return EXIT_NO_PLAN
    s = summary(rep, top, space.constraints, megatron,
                _calibrated_best(rep, space, top, workers, show, deadline) if extras else None)
    return _report(rep, s, out, as_json,
                   lambda: _extras(rep, megatron, space, out) if extras and out else {})


def _report(rep: Any, s: dict[str, Any], out: Path | None, as_json: bool,
            extras: Any) -> int:
    """Print the summary; with ``out``, write it, the ``extras()`` files and the plots."""
    from optimizer.report import format_report, write_outputs
    from trainsim.plots.search import plot_search

    print(json.dumps(s, indent=2) if as_json else format_report(s))
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        files = write_outputs(rep, s, out, extras()) + plot_search(rep, out)
        if not as_json:
            print("wrote " + ", ".join(str(f) for f in files))
    return 0


def _optimize_graph(w: Any, cluster: Any, gbs: int, top: int, out: Path | None,
                    as_json: bool, constraints: Any, dtype: str) -> int:
    """A workload graph's search (optimizer.graph): data and pipeline parallelism."""
    from optimizer.constraints import Constraints
    from optimizer.graph import optimize_graph
    from optimizer.report import summary
    from sim.errors import NoFeasiblePlan

    k = constraints or Constraints()
    try:
        rep = optimize_graph(w, cluster, gbs, top, dtype, k)
    except NoFeasiblePlan as exc:
        print(f"trainsim: no feasible plan: {exc}", file=sys.stderr)
        return EXIT_NO_PLAN
    return _report(rep, summary(rep, top, k), out, as_json, dict)


def _megatron_best(rep: Any, space: Any, top: int, workers: int | None,
                   progress: bool = False, deadline: float | None = None) -> Any:
    """The fastest plan Megatron-LM can run: the overall best when Megatron-LM expresses it,
    else a search of its own over the plans Megatron-LM expresses (not a filter of this
    search's top K). None when a framework was already asked for."""
    import dataclasses

    from optimizer.export import refusal
    from optimizer.search import optimize

    if space.constraints.framework != "any":
        return None
    if refusal("megatron", rep.best.plan, space.model) is None:
        return rep.best
    k = dataclasses.replace(space.constraints, framework="megatron")
    if progress:
        print("== the best plan is not expressible in Megatron-LM: searching the plans it "
              "expresses", file=sys.stderr)
    sub = optimize(space.model, space.cluster, space.global_batch_size, space.seq_len,
                   top_k=top, workers=workers, progress=progress,
                   space=dataclasses.replace(space, constraints=k), deadline=deadline)
    return sub.best


def _calibrated_best(rep: Any, space: Any, top: int, workers: int | None,
                     progress: bool = False, deadline: float | None = None) -> Any:
    """When the best plan uses ZeRO-3, whose cost model is not calibrated, the fastest plan
    without it (a search of its own, under the same constraints); else None."""
    import dataclasses

    from optimizer.search import optimize
    from sim.errors import NoFeasiblePlan

    if rep.best.plan.zero_stage < 3:
        return None
    k = dataclasses.replace(space.constraints, max_zero_stage=2)
    if progress:
        print("== the best plan uses ZeRO-3 (cost model not calibrated): searching the plans "
              "without it", file=sys.stderr)
    try:
        return optimize(space.model, space.cluster, space.global_batch_size, space.seq_len,
                        top_k=top, workers=workers, progress=progress,
                        space=dataclasses.replace(space, constraints=k),
                        deadline=deadline).best
    except NoFeasiblePlan:  # only ZeRO-3 fits: nothing calibrated to offer
        return None


def _extras(rep: Any, megatron: Any, space: Any, out: Path) -> dict[str, str]:
    """The best plan's DES trace and launch files: the asked-for framework's for the best
    plan, or else the Megatron-LM arguments of the fastest plan Megatron-LM can run."""
    from optimizer.export import export, refusal
    from optimizer.report import plan_label
    from sim import simulate

    model, cluster = space.model, space.cluster
    if rep.best.des is not None:  # a plan beyond the DES's micro-batches has no trace
        simulate(model, cluster, rep.best.plan, "des", trace=str(out / "best_trace.json"))
    if space.constraints.framework != "any":
        return export(space.constraints.framework, rep.best.plan, model, cluster)
    if megatron is None:
        return {}
    files = export("megatron", megatron.plan, model, cluster)
    if megatron is not rep.best:
        why = refusal("megatron", rep.best.plan, model)
        files["megatron_args.sh"] = files["megatron_args.sh"].replace(
            "set -euo pipefail", f"# the fastest plan Megatron-LM can run, {megatron.best_s:.4g} "
            f"s per step ({plan_label(megatron.plan)}); the overall best, "
            f"{rep.best.best_s:.4g} s, is not expressible: {why}\nset -euo pipefail", 1)
    return files


def constraints_of(args: argparse.Namespace) -> Any:
    """The search constraints of ``optimize`` / ``sweep --optimize`` options."""
    from optimizer.constraints import Constraints, parse_fix

    return Constraints(framework=args.framework, max_zero_stage=args.max_zero_stage,
                       fixed=parse_fix(args.fix or []), max_memory_gib=args.max_memory_gib,
                       min_mfu=args.min_mfu)


def add_constraint_options(p: argparse.ArgumentParser) -> None:
    from optimizer.constraints import FIXABLE, FRAMEWORK_CHOICES

    p.add_argument("--framework", choices=FRAMEWORK_CHOICES, default="any",
                   help="search only plans this framework's export expresses (default any)")
    p.add_argument("--max-zero-stage", type=int, default=3, metavar="N",
                   help="highest ZeRO stage to consider, 0-3 (default 3)")
    p.add_argument("--fix", action="append", metavar="NAME=VALUE",
                   help=f"hold a plan field fixed ({', '.join(FIXABLE)}; mbs for the "
                   "micro-batch); repeat for several")
    p.add_argument("--max-memory-gib", type=float, metavar="GIB",
                   help="memory budget per device, below the device's capacity")
    p.add_argument("--min-mfu", type=float, metavar="FRACTION",
                   help="only plans reaching this model FLOPs utilisation (0-1)")


def cmd_optimize(args: argparse.Namespace) -> int:
    from trainsim.common import max_wall_s

    return run_optimize(args.model, args.cluster, args.global_batch_size, args.seq_len,
                        args.top, Path(args.out) if args.out else None, args.json, args.workers,
                        constraints=constraints_of(args), dtype=args.dtype,
                        max_wall_s=max_wall_s(args), progress=not args.no_progress)


def cmd_export(args: argparse.Namespace) -> int:
    """The framework's main file on stdout (``> ds.json`` is the file itself); with
    ``--out`` every file is written there. An export of several files needs ``--out``."""
    from executor.export import torchrun_files
    from optimizer.export import export
    from sim import load_cluster, load_model, load_plan
    from sim.errors import SpecError
    from sim.io import atomic_write_files
    from trainsim.common import check_out_dir

    check_out_dir(Path(args.out) if args.out else None, "--out")  # before any work
    plan, model, cluster = load_plan(args.plan), load_model(args.model), \
        load_cluster(args.cluster)
    files = torchrun_files(plan, model, cluster) if args.format == "torchrun" else \
        export(args.format, plan, model, cluster)
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
    p.add_argument("--dtype", default="bf16", choices=("bf16", "fp16", "fp8", "fp32"),
                   help="training precision (default bf16)")
    add_constraint_options(p)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--out", metavar="DIR", help="write best_plan.json, plans.csv, "
                   "report.json, plots, the best plan's trace and launch files (--framework's "
                   "for the best plan; by default the Megatron-LM arguments of the fastest "
                   "plan Megatron-LM can run); created only when a plan is found")
    add_watch_options(p, "the local moves (the analytic tier and the DES shortlist always "
                      "complete)")
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
