"""``trainsim sweep`` (a grid of what-if points) and ``trainsim plot sweep|sensitivity``."""

from __future__ import annotations

import argparse
import json
import signal
import tomllib
from pathlib import Path
from typing import Any

__all__ = ["add_sweep_parsers", "spec_from_args"]

_GRID_KEYS = {"model", "cluster", "fidelity", "plan", "optimize", "top", "set", "vary"}


def _parse_vary(text: str) -> tuple[str, tuple[Any, ...]]:
    from sim.errors import SpecError
    from sim.spec.scenario import parse_value

    key, sep, values = text.partition("=")
    if not sep or not key.strip() or not values.strip():
        raise SpecError("--vary", f"must be KEY=V1,V2,... (e.g. tp=1,2,4), got {text!r}")
    return key.strip(), tuple(parse_value(v) for v in values.split(","))


def _grid_file(path: str) -> dict[str, Any]:
    """A sweep TOML file: model, cluster, fidelity, plan, optimize, top, [set], [vary]."""
    from sim.errors import SpecError, field_name
    from sim.io import read_text
    from sim.spec.scenario import flatten_edits

    p = Path(path)
    try:
        data = tomllib.loads(read_text(p, "grid"))
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(f"grid[{p.name}]", f"not valid TOML: {exc}") from None
    for key in sorted(set(data) - _GRID_KEYS):
        raise SpecError(f"{p.name}:{field_name(key)}",
                        f"unknown field (known: {', '.join(sorted(_GRID_KEYS))})")
    for key in ("set", "vary"):
        if not isinstance(data.get(key, {}), dict):
            raise SpecError(f"{p.name}:{key}", "must be a table")
    vary = flatten_edits(data.get("vary", {}))
    for key, values in vary:
        if not isinstance(values, list):
            raise SpecError(f"{p.name}:vary.{key}", f"must be a list of values, got {values!r}")
    if isinstance(data.get("plan"), str) and not Path(data["plan"]).is_absolute():
        data["plan"] = str(p.parent / data["plan"])
    data["set"] = flatten_edits(data.get("set", {}))
    data["vary"] = [(k, tuple(v)) for k, v in vary]
    return data


def spec_from_args(args: argparse.Namespace) -> Any:
    """The sweep of the command line, over the grid file's (the command line wins)."""
    from optimizer.sweep.grid import SweepSpec
    from sim.errors import SpecError
    from sim.spec.scenario import parse_assignment
    from trainsim.commands.optimize import constraints_of

    grid = _grid_file(args.grid) if args.grid else {"set": [], "vary": []}
    fixed = dict(grid["set"])
    fixed.update(dict(parse_assignment(s) for s in args.set_edits))
    for key, value in (("global_batch_size", args.global_batch_size),
                       ("seq_len", args.seq_len)):
        if value is not None:
            fixed[key] = value
    axes = dict(grid["vary"])
    axes.update(dict(_parse_vary(v) for v in args.vary))
    model, cluster = args.model or grid.get("model"), args.cluster or grid.get("cluster")
    if not isinstance(model, str) or not isinstance(cluster, str):
        raise SpecError("--model/--cluster", "are required (on the command line or in the "
                        "--grid file)")
    for name, value in (("--top", args.top), ("--workers", args.workers)):
        if value is not None and value < 1:
            raise SpecError(name, f"must be >= 1, got {value}")
    constraints = constraints_of(args)
    optimize = bool(args.optimize or grid.get("optimize", False))
    if constraints.describe() and not optimize:
        raise SpecError("--framework/--max-zero-stage/--fix/--max-memory-gib/--min-mfu",
                        "constrain the optimizer: use them with --optimize")
    return SweepSpec(model=model, cluster=cluster,
                     fidelity=args.fidelity or grid.get("fidelity", "analytic"),
                     fixed=tuple(fixed.items()), axes=tuple(axes.items()),
                     plan_file=args.plan or grid.get("plan"),
                     optimize=optimize,
                     top_k=args.top if args.top is not None else int(grid.get("top", 4)),
                     constraints=constraints)


def _interrupt(_signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt  # workers are stopped on the way out; finished points are kept


def cmd_sweep(args: argparse.Namespace) -> int:
    from optimizer.sweep.report import format_summary
    from optimizer.sweep.run import run_sweep

    spec = spec_from_args(args)
    signal.signal(signal.SIGTERM, _interrupt)
    out = Path(args.out)
    outcome = run_sweep(spec, out, workers=args.workers, ray_address=args.ray,
                        progress=not (args.json or args.no_progress))
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(f"{outcome.computed} points run, {outcome.resumed} already in {out}")
        print(format_summary(summary))
        print("wrote " + ", ".join(str(f) for f in outcome.files))
    return 0


def _folder(results: Path) -> Path:
    return results if results.is_dir() else results.parent


def cmd_plot_sweep(args: argparse.Namespace) -> int:
    from sim.spec.scenario import parse_assignment
    from trainsim.plots.output import check_pair
    from trainsim.plots.sweep import load_rows, plot_sweep

    where = [parse_assignment(w, "--where") for w in args.where]
    results = Path(args.results)
    out = check_pair(args.out or _folder(results) / f"sweep_{args.x}.png", "--out")
    rows = load_rows(results)
    for path in plot_sweep(rows, args.x, args.y, args.hue, where, out):
        print(f"wrote {path}")
    return 0


def cmd_plot_sensitivity(args: argparse.Namespace) -> int:
    from trainsim.plots.output import check_pair
    from trainsim.plots.sweep import load_rows, plot_sensitivity

    results = Path(args.results)
    out = check_pair(args.out or _folder(results) / "sensitivity.png", "--out")
    for path in plot_sensitivity(load_rows(results), args.y, out):
        print(f"wrote {path}")
    return 0


def add_sweep_parsers(sub: Any, model_help: str, cluster_help: str, parser_class: type) -> None:
    from trainsim.commands.optimize import add_constraint_options

    p = sub.add_parser("sweep", help="simulate or optimize a grid of what-if points",
                       description="Vary cluster keys, plan keys, fidelity or model over a "
                       "grid; each finished point is appended to OUT/points.jsonl, and a "
                       "restarted sweep skips the points already there. dp fills the cluster "
                       "unless set or varied.")
    p.add_argument("--model", help=model_help)
    p.add_argument("--cluster", help=cluster_help)
    p.add_argument("--grid", metavar="FILE", help="TOML: model, cluster, fidelity, plan, "
                   "optimize, top, [set] and [vary] tables (the command line wins)")
    p.add_argument("--vary", action="append", default=[], metavar="KEY=V1,V2,...",
                   help="an axis of the grid, e.g. inter_node.nic_Gbps=100,200,400 or tp=1,2,4 "
                   "or gpu=a100-sxm4-80gb,h100-sxm5-80gb or fidelity=analytic,des or "
                   "straggler=none,node:3=1.2,node:3=1.5 (repeatable)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="set_edits",
                   help="a fixed edit of every point (cluster or plan key; repeatable)")
    p.add_argument("--plan", metavar="FILE", help="base plan JSON (default: plan defaults)")
    p.add_argument("--global-batch-size", type=int, help="sequences per step (= --set "
                   "global_batch_size=N)")
    p.add_argument("--seq-len", type=int, help="tokens per sequence (= --set seq_len=N)")
    p.add_argument("--fidelity", choices=["analytic", "des"], help="default analytic")
    p.add_argument("--optimize", action="store_true", help="run the optimizer at every point "
                   "and report its best plan")
    p.add_argument("--top", type=int, help="with --optimize: plans simulated with the DES per "
                   "point (default 4)")
    add_constraint_options(p)
    p.add_argument("--workers", type=int, help="processes (default: all cores); with --ray "
                   "local, the CPUs of the local Ray instance")
    p.add_argument("--ray", metavar="ADDRESS", help="run the points on a Ray cluster "
                   "('local' starts one here; needs the sweep-ray extra)")
    p.add_argument("--out", default="runs/sweep", metavar="DIR", help="points.jsonl, "
                   "results.json/.csv and summary.json (default runs/sweep)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_sweep)
    _add_plot_parsers(sub)


def plot_subparsers(sub: Any) -> Any:
    """The ``trainsim plot`` sub-command group, to add a plot command to."""
    plot = sub.choices["plot"]
    return next(a for a in plot._actions if isinstance(a, argparse._SubParsersAction))


def _add_plot_parsers(sub: Any) -> None:
    psub = plot_subparsers(sub)
    s = psub.add_parser("sweep", help="a metric against a swept parameter (PNG and SVG)")
    s.add_argument("results", help="a sweep folder, its results.json or points.jsonl")
    s.add_argument("--x", required=True, help="swept parameter on the x axis")
    s.add_argument("--y", default="iteration_time_s", help="metric (default iteration_time_s; "
                   "e.g. tokens_per_s, mfu, peak_memory_gib)")
    s.add_argument("--hue", help="swept parameter drawn as one line per value")
    s.add_argument("--where", action="append", default=[], metavar="KEY=VALUE",
                   help="keep only the points with this value (repeatable)")
    s.add_argument("--out", help="PNG or SVG to write; the other goes beside it (default: "
                   "sweep_X.png in the sweep's folder)")
    s.set_defaults(func=cmd_plot_sweep)
    t = psub.add_parser("sensitivity", help="spread of a metric over each swept parameter")
    t.add_argument("results", help="a sweep folder, its results.json or points.jsonl")
    t.add_argument("--y", default="iteration_time_s", help="metric (default iteration_time_s)")
    t.add_argument("--out", help="PNG or SVG to write; the other goes beside it (default: "
                   "sensitivity.png in the sweep's folder)")
    t.set_defaults(func=cmd_plot_sensitivity)
