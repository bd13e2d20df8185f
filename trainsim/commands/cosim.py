"""``trainsim cosim`` (jobs sharing one cluster's network) and ``trainsim plot links``."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

__all__ = ["add_cosim_parsers", "parse_job", "parse_nodes"]

_JOB_FIELDS = ("name", "model", "plan", "nodes")
_JOB_HELP = ("a job: model=MODEL,plan=PLAN.json,nodes=FIRST-LAST[,name=NAME] (nodes: a range, "
             "a number, or several joined by '+', e.g. 0-3+8-11); repeat for every job")
_SET_HELP = "edit the cluster (as simulate --set), e.g. inter_node.oversubscription=4"


# cosim ------------------------------------------------------------------------------------
def parse_nodes(text: str, where: str) -> tuple[int, ...]:
    """``0-3+8-11`` -> (0, 1, 2, 3, 8, 9, 10, 11)."""
    from sim.errors import SpecError

    out: list[int] = []
    for part in text.split("+"):
        first, _, last = part.partition("-")
        if not (_index(first) and (not last or _index(last))):
            raise SpecError(where, f"must be node numbers or ranges like 0-3 joined by '+', "
                            f"got {text!r}")
        lo, hi = int(first), int(last or first)
        if hi < lo:
            raise SpecError(where, f"range {part!r} ends before it starts")
        out += range(lo, hi + 1)
    if len(set(out)) != len(out):
        raise SpecError(where, f"names a node twice in {text!r}")
    return tuple(out)


def _index(text: str) -> bool:
    """A node number: ASCII digits only (``str.isdigit`` also takes '³', which int() does
    not)."""
    return text.isascii() and text.isdigit()


def parse_job(text: str, index: int) -> dict[str, str]:
    """The fields of one ``--job`` value, each checked for presence and known names."""
    from sim.errors import SpecError, field_name

    where, fields = f"--job[{index}]", {}
    for item in text.split(","):
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq or not value.strip():
            raise SpecError(where, f"expected KEY=VALUE items separated by ',', got {item!r}")
        if key not in _JOB_FIELDS:
            raise SpecError(f"{where}.{field_name(key)}",
                            f"unknown field (expected {', '.join(_JOB_FIELDS)})")
        if key in fields:
            raise SpecError(f"{where}.{key}", "given twice")
        fields[key] = value.strip()
    for key in ("model", "plan", "nodes"):
        if key not in fields:
            raise SpecError(f"{where}.{key}", "is required")
    return fields


def _load_job(text: str, index: int) -> Any:
    from sim import SpecError, load_model, load_plan
    from sim.des.multijob import Job

    fields = parse_job(text, index)
    nodes = parse_nodes(fields["nodes"], f"--job[{index}].nodes")
    try:
        model, plan = load_model(fields["model"]), load_plan(fields["plan"])
    except SpecError as exc:
        raise SpecError(f"--job[{index}].{exc.field}", exc.rule) from None
    return Job(fields.get("name", f"job{index}"), model, plan, nodes)


def _cluster(args: argparse.Namespace) -> Any:
    from sim import SpecError, load_cluster
    from sim.spec.scenario import apply_cluster_edits, is_cluster_key, parse_assignment

    edits = [parse_assignment(s) for s in args.set_edits]
    for key, _ in edits:
        if not is_cluster_key(key):
            raise SpecError(key, "is not a cluster field (each job's plan is its own file)")
    return apply_cluster_edits(load_cluster(args.cluster), edits)


def cmd_cosim(args: argparse.Namespace) -> int:
    from sim.des.multijob import cosimulate

    cluster = _cluster(args)
    jobs = [_load_job(text, i) for i, text in enumerate(args.job)]
    result = cosimulate(cluster, jobs, args.iterations, reduce=not args.no_reduce,
                        top_links=None if args.all_links else 10)
    print(json.dumps(result.to_dict(), indent=2) if args.json else format_cosim(result))
    return 0


def format_cosim(r: Any) -> str:
    """A table: per job its nodes, alone and together seconds, slowdown, iterations."""
    labels = [_node_label(j.nodes) for j in r.jobs]
    w = max(5, *map(len, labels))
    lines = [f"{len(r.jobs)} jobs on {r.cluster}, one shared network: window {r.window_s:.4g} s "
             f"(until every job finished {r.min_iterations} iterations; "
             f"{'symmetry-reduced' if r.reduced else 'every rank and flow'})",
             f"{'job':<16} {'nodes':<{w}} {'alone s':>10} {'together s':>11} {'slowdown':>9} "
             f"{'iterations':>10}"]
    for j, label in zip(r.jobs, labels, strict=True):
        slowdown = j.slowdown_pct if abs(j.slowdown_pct) >= 1e-6 else 0.0  # rounding noise
        lines.append(f"{j.name[:16]:<16} {label:<{w}} {j.alone_s:10.4g} "
                     f"{j.together_s:11.4g} {slowdown:+8.1f}% {len(j.iterations_s):10d}")
    if r.links:
        lines.append("busiest links over the window: " + ", ".join(
            f"{x['link']} {100 * x['utilization']:.0f}%" for x in r.links[:3]))
    return "\n".join(lines)


def _node_label(nodes: tuple[int, ...]) -> str:
    runs: list[list[int]] = []
    for n in nodes:
        if runs and n == runs[-1][1] + 1:
            runs[-1][1] = n
        else:
            runs.append([n, n])
    return "+".join(f"{a}-{b}" if b > a else str(a) for a, b in runs)


# plot links -------------------------------------------------------------------------------
def cmd_plot_links(args: argparse.Namespace) -> int:
    from sim.network.topology import build_topology
    from trainsim.plots.links import plot_links
    from trainsim.plots.output import check_out

    outs = [check_out(o, "--out") for o in (args.out or ["links.png"])]
    if args.result:
        cluster, links, title = _from_result(args)
    else:
        cluster, links, title = _from_des(args)
    topo = build_topology(cluster)
    for out in outs:
        print(f"wrote {plot_links(topo, links, out, title)}")
    return 0


def _from_des(args: argparse.Namespace) -> tuple[Any, list[dict[str, Any]], str]:
    """One DES iteration (after any --set edits), every used link kept."""
    from sim import SpecError, load_cluster, load_model, load_plan, validate
    from sim.cost.profiled import cost_model_for
    from sim.des.run import simulate_des
    from sim.spec.scenario import apply_cluster_edits, apply_plan_edits, parse_assignment

    for name in ("model", "cluster", "plan"):
        if not getattr(args, name):
            raise SpecError(f"--{name}", "is required without a saved RESULT")
    edits = [parse_assignment(s) for s in args.set_edits]
    cluster = apply_cluster_edits(load_cluster(args.cluster), edits)
    model, plan = load_model(args.model), apply_plan_edits(load_plan(args.plan), edits)
    validate(plan, model, cluster)
    t = simulate_des(model, cluster, plan, cost_model_for(cluster), top_links=None)
    return cluster, t.links, f"{model.name} on {cluster.name}: iteration {t.iteration_s:.4g} s"


def _from_result(args: argparse.Namespace) -> tuple[Any, list[dict[str, Any]], str]:
    """A saved ``simulate --json`` result (or a ``cosim --json`` one): its ``links``."""
    from sim import SpecError
    from sim.io import read_text

    if not args.cluster:
        raise SpecError("--cluster", "is required with a saved RESULT (to rebuild the "
                        "topology its links are named after)")
    if args.model or args.plan:
        raise SpecError("--model/--plan", "are for a new DES run, not a saved RESULT")
    try:
        links = json.loads(read_text(Path(args.result), "result")).get("links")
    except (json.JSONDecodeError, AttributeError):
        links = None
    if not isinstance(links, list) or not all(isinstance(x, dict) for x in links):
        raise SpecError("result", f"{args.result} is not a simulate/cosim --json result with "
                        "a links list")
    if not links:
        raise SpecError("result", f"{args.result} has no link traffic (run simulate with "
                        "--fidelity des)")
    cluster = _cluster(args)  # --set: the edits the result was run with
    return cluster, links, f"{Path(args.result).name} on {cluster.name} ({len(links)} links " \
        "recorded)"


# parsers ----------------------------------------------------------------------------------
def add_cosim_parsers(sub: Any, cluster_help: str, model_help: str) -> None:
    p = sub.add_parser("cosim", help="simulate several jobs sharing one cluster's network",
                       description="Run several training jobs, each on its own nodes, in one "
                       "discrete-event simulation with one shared network: each job's "
                       "iteration time together and alone, and its slowdown.")
    p.add_argument("--cluster", required=True, help=cluster_help)
    p.add_argument("--job", action="append", required=True, metavar="SPEC", help=_JOB_HELP)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   dest="set_edits", help=_SET_HELP)
    p.add_argument("--iterations", type=int, default=3, metavar="K", help="simulate until "
                   "every job finished K iterations; faster jobs keep running (default 3)")
    p.add_argument("--no-reduce", action="store_true", help="simulate every rank and flow "
                   "instead of one representative per symmetric set (slow)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--all-links", action="store_true", help="report every used link, not "
                   "the 10 busiest (for trainsim plot links)")
    p.set_defaults(func=cmd_cosim)
    _add_plot_links(sub, cluster_help, model_help)


def _add_plot_links(sub: Any, cluster_help: str, model_help: str) -> None:
    from trainsim.commands.sweep import plot_subparsers

    psub = plot_subparsers(sub)
    p = psub.add_parser("links", help="per-link utilisation heat map of the topology, from a "
                        "DES run or a saved simulate/cosim --json result",
                        description="Draw the topology graph with every link coloured by "
                        "its utilisation (bytes / capacity x time, the busier direction).")
    p.add_argument("result", nargs="?", help="saved simulate --fidelity des --json (busiest "
                   "links only) or cosim --json [--all-links] result; without it, run the DES")
    p.add_argument("--model", help=model_help)
    p.add_argument("--cluster", help=cluster_help)
    p.add_argument("--plan", help="plan JSON")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   dest="set_edits", help="edit the cluster or plan, as simulate --set "
                   "(with a RESULT: the cluster edits it was run with)")
    p.add_argument("--out", action="append", metavar="FILE", help="PNG or SVG to write "
                   "(by suffix; repeatable; default links.png)")
    p.set_defaults(func=cmd_plot_links)
