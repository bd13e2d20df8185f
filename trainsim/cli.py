"""``trainsim``: predict, inspect, optimise and run training plans.

Every subcommand validates its input first; bad input prints one line naming the field and
the rule and exits with code 2. Nothing is written until the inputs are valid, and every
file is written atomically.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any, NoReturn

from trainsim import __version__

EXIT_BAD_INPUT = 2


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (and exit code 2)."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_BAD_INPUT, f"trainsim: error: {message} (see {self.prog} --help)\n")


def _fail(message: str) -> int:
    one_line = message.encode("unicode_escape").decode("ascii") if not message.isprintable() \
        else message
    print(f"trainsim: error: {one_line}", file=sys.stderr)
    return EXIT_BAD_INPUT


# simulate ---------------------------------------------------------------------------------
def _write_run(out: Path, result: Any, model: Any, cluster: Any, plan: Any) -> None:
    """The run folder, all-or-nothing: the resolved inputs next to the results."""
    from sim.io import atomic_write_files
    from sim.report import format_result

    inputs = {"model": model.to_dict(), "cluster": cluster.to_dict(), "plan": plan.to_dict()}
    atomic_write_files({
        out / "inputs.json": json.dumps(inputs, indent=2) + "\n",
        out / "result.json": json.dumps(result.to_dict(), indent=2) + "\n",
        out / "summary.txt": format_result(result) + "\n"})


def cmd_simulate(args: argparse.Namespace) -> int:
    from sim import SpecError, load_cluster, load_model, load_plan, simulate
    from sim.report import format_result
    from trainsim.faults_cli import faults_of
    from trainsim.profile_cli import with_profile_options

    model, cluster = load_model(args.model), load_cluster(args.cluster)
    cluster = with_profile_options(cluster, args)
    plan = load_plan(args.plan)
    if args.fidelity != "des" and (args.trace or args.no_reduce):
        raise SpecError("--trace/--no-reduce", "need --fidelity des")
    result = simulate(model, cluster, plan, fidelity=args.fidelity, reduce=not args.no_reduce,
                      trace=args.trace, faults=faults_of(args))
    if args.out:
        _write_run(Path(args.out), result, model, cluster, plan)
    print(json.dumps(result.to_dict(), indent=2) if args.json else format_result(result))
    return 0


# plan -------------------------------------------------------------------------------------
_PLAN_INT_HELP = {
    "global_batch_size": "sequences per iteration (required)",
    "seq_len": "tokens per sequence (required)",
    "micro_batch_size": "sequences per micro-batch (default 1)",
    "dp": "data-parallel degree (default 1)", "tp": "tensor-parallel degree (default 1)",
    "pp": "pipeline-parallel degree (default 1)", "cp": "context-parallel degree (default 1)",
    "ep": "expert-parallel degree, divides dp (default 1)",
    "vpp": "virtual stages per pipeline rank, interleaved-1f1b only (default 1)",
    "zero_stage": "ZeRO stage 0-3 (default 0)",
}
_PLAN_INTS = tuple(_PLAN_INT_HELP)


def cmd_plan_new(args: argparse.Namespace) -> int:
    from sim import Plan, load_cluster, load_model, save_plan, validate

    fields = {k: getattr(args, k) for k in _PLAN_INTS if getattr(args, k) is not None}
    for k in ("schedule", "recompute", "dtype", "placement", "attention"):
        if getattr(args, k) is not None:
            fields[k] = getattr(args, k)
    fields["sequence_parallel"] = args.sequence_parallel
    plan = Plan.from_dict(fields)
    if args.model or args.cluster:
        validate(plan, load_model(args.model) if args.model else None,
                 load_cluster(args.cluster) if args.cluster else None)
    text = json.dumps(plan.to_dict(), indent=2)
    if args.out:
        save_plan(plan, args.out)
    print(text)
    return 0


def cmd_plan_check(args: argparse.Namespace) -> int:
    from sim import load_cluster, load_model, load_plan, validate

    plan = load_plan(args.plan)
    validate(plan, load_model(args.model) if args.model else None,
             load_cluster(args.cluster) if args.cluster else None)
    print(f"{args.plan}: valid ({plan.world_size} ranks, {plan.num_microbatches} micro-batches)")
    return 0


# catalogs ---------------------------------------------------------------------------------
def cmd_models(args: argparse.Namespace) -> int:
    from sim.model import load_model, zoo_names
    from sim.report import format_model

    models = [load_model(args.model)] if args.model else [load_model(n) for n in zoo_names()]
    if args.json:
        data = [m.to_dict() for m in models]
        print(json.dumps(data[0] if args.model else data, indent=2))
    else:
        print("\n".join(format_model(m) for m in models))
    return 0


def cmd_hardware(args: argparse.Namespace) -> int:
    from sim.hardware import catalog, catalog_sources

    for name, hw in sorted(catalog().items()):
        print(f"{name:<16} bf16 {hw.bf16_tflops:7.1f} TFLOP/s  {hw.memory_gib:6.1f} GiB  "
              f"HBM {hw.hbm_GBps:6.0f} GB/s  NVLink {hw.nvlink_GBps:5.0f} GB/s/dir")
        if args.sources:
            for field, source in catalog_sources(name).items():
                print(f"    {field:<14} {source}")
    return 0


def cmd_cluster(args: argparse.Namespace) -> int:
    from sim.cluster import load_cluster, preset_names

    if not args.cluster:
        print("presets: " + ", ".join(preset_names()) + "; or a TOML file (see README)")
        return 0
    c = load_cluster(args.cluster)
    print(json.dumps(c.to_dict(), indent=2) if args.json else
          f"{c.name}: {c.nodes} nodes x {c.gpus_per_node} {c.gpu.name} = {c.world_size} devices; "
          f"{c.intra_node.kind} {c.intra_node.bandwidth_GBps} GB/s/dir; "
          f"{c.inter_node.topology} {c.inter_node.nics_per_node} x {c.inter_node.nic_Gbps} Gb/s "
          f"NICs per node ({c.nic_GBps_per_gpu:.1f} GB/s per device)")
    if not args.json:
        first = 0
        for g in c.node_groups:  # a mixed cluster's groups, in node order
            print(f"  nodes {first}-{first + g.nodes - 1}: {g.gpu.name}; {g.intra_GBps:g} "
                  f"GB/s/dir node fabric; {g.nics_per_node} x {g.nic_Gbps:g} Gb/s NICs")
            first += g.nodes
    return 0


def cmd_topology(args: argparse.Namespace) -> int:
    from sim.cluster import load_cluster
    from sim.topology import bisection_Bps, build_topology

    cluster = load_cluster(args.cluster)
    topo = build_topology(cluster)
    kinds: dict[str, int] = {}
    for v in topo.graph.nodes:
        kind = "device" if isinstance(v, int) else str(v[0])
        kinds[kind] = kinds.get(kind, 0) + 1
    print(f"{cluster.name}: {cluster.inter_node.topology}, {topo.graph.number_of_nodes()} "
          f"vertices ({', '.join(f'{n} {k}' for k, n in sorted(kinds.items()))}), "
          f"{topo.graph.number_of_edges() // 2} links")
    if cluster.nodes > 1 and not args.no_bisection:
        print(f"bisection bandwidth: {bisection_Bps(topo) / 1e9:,.0f} GB/s per direction")
    if args.png:
        from sim.plots import draw_topology

        print(f"wrote {draw_topology(topo, Path(args.png))}")
    return 0


def cmd_plot_timeline(args: argparse.Namespace) -> int:
    from sim.plots import plot_timeline

    out = Path(args.out)
    for path in plot_timeline(Path(args.trace), out, also_svg=True):
        print(f"wrote {path}")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from trainsim.demo import run_demo

    return run_demo(Path(args.out))


# parser -----------------------------------------------------------------------------------
_MODEL_HELP = "zoo name (trainsim models), Hugging Face config.json (or its folder), or TOML"
_CLUSTER_HELP = "preset (dgx-a100:N, dgx-h100:N, hgx-h200:N, cpu:RANKS) or a TOML file"


def _add_simulate(sub: Any) -> None:
    from trainsim.profile_cli import add_profile_options

    p = sub.add_parser("simulate", help="predict one training iteration of a plan",
                       description="Predict one training iteration: time, throughput, MFU, "
                       "memory, bubble and a breakdown of the critical path.")
    p.add_argument("--model", required=True, help=_MODEL_HELP)
    p.add_argument("--cluster", required=True, help=_CLUSTER_HELP)
    p.add_argument("--plan", required=True, help="plan JSON (make one with: trainsim plan new)")
    p.add_argument("--fidelity", default="analytic", choices=["analytic", "des"],
                   help="simulator tier: analytic (closed form, default) or des (SimPy "
                   "discrete-event, flow-level network)")
    p.add_argument("--trace", metavar="FILE", help="des: write a Chrome trace JSON "
                   "(pid = node, tid = device stream; open in Perfetto)")
    p.add_argument("--no-reduce", action="store_true", help="des: simulate every rank and "
                   "flow instead of one representative per symmetric set (slow)")
    add_profile_options(p, "profile DB to time operations from (overrides the cluster's; "
                        "a DB root or one device folder)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--out", metavar="DIR", help="also write inputs.json, result.json and "
                   "summary.txt to this run folder")
    p.set_defaults(func=cmd_simulate)


def _add_plan(sub: Any) -> None:
    p = sub.add_parser("plan", help="create or check a plan JSON file")
    psub = p.add_subparsers(dest="plan_cmd", required=True, parser_class=_Parser)
    new = psub.add_parser("new", help="write a plan from flags",
                          description="Build a plan JSON; omitted fields take the defaults "
                          "shown here (and in the README's Plan section).")
    for k, text in _PLAN_INT_HELP.items():
        new.add_argument("--" + k.replace("_", "-"), dest=k, type=int, help=text,
                         required=k in ("global_batch_size", "seq_len"))
    new.add_argument("--schedule", choices=["gpipe", "1f1b", "interleaved-1f1b"],
                     help="pipeline schedule (default 1f1b)")
    new.add_argument("--recompute", choices=["none", "selective", "full"],
                     help="activation recomputation (default none)")
    new.add_argument("--dtype", choices=["bf16", "fp16", "fp8", "fp32"],
                     help="training precision (default bf16)")
    new.add_argument("--attention", choices=["flash", "standard"], help="flash (default) or "
                     "standard (materialises the s x s scores)")
    new.add_argument("--placement", help="rank order, innermost first (default tp-cp-ep-dp-pp)")
    new.add_argument("--sequence-parallel", action="store_true",
                     help="split norm/dropout activations over the TP group (needs tp > 1)")
    new.add_argument("--model", help="also check against this model: " + _MODEL_HELP)
    new.add_argument("--cluster", help="also check against this cluster: " + _CLUSTER_HELP)
    new.add_argument("--out", metavar="FILE", help="write the plan here (atomically)")
    new.set_defaults(func=cmd_plan_new)
    check = psub.add_parser("check", help="validate a plan, optionally against model/cluster")
    check.add_argument("plan", help="plan JSON file")
    check.add_argument("--model", help=_MODEL_HELP)
    check.add_argument("--cluster", help=_CLUSTER_HELP)
    check.set_defaults(func=cmd_plan_check)


def _add_catalogs(sub: Any) -> None:
    p = sub.add_parser("models", help="list zoo models, or show one model")
    p.add_argument("--model", help=_MODEL_HELP)
    p.add_argument("--json", action="store_true", help="print JSON (a list without --model)")
    p.set_defaults(func=cmd_models)
    p = sub.add_parser("hardware", help="list the hardware catalog")
    p.add_argument("--sources", action="store_true", help="show where each number comes from")
    p.set_defaults(func=cmd_hardware)
    p = sub.add_parser("cluster", help="list cluster presets, or show one cluster")
    p.add_argument("--cluster", help=_CLUSTER_HELP)
    p.add_argument("--json", action="store_true", help="print the resolved cluster as JSON")
    p.set_defaults(func=cmd_cluster)
    p = sub.add_parser("topology", help="summarise (and draw) a cluster's network graph")
    p.add_argument("--cluster", required=True, help=_CLUSTER_HELP)
    p.add_argument("--png", metavar="FILE", help="draw the graph to this PNG")
    p.add_argument("--no-bisection", action="store_true",
                   help="skip the max-flow bisection bandwidth (slow on large clusters)")
    p.set_defaults(func=cmd_topology)
    p = sub.add_parser("plot", help="plots of simulation outputs")
    psub = p.add_subparsers(dest="plot_cmd", required=True, parser_class=_Parser)
    t = psub.add_parser("timeline", help="Gantt chart (PNG and SVG) of a Chrome trace from "
                        "simulate --fidelity des --trace")
    t.add_argument("trace", help="trace JSON")
    t.add_argument("--out", default="timeline.png",
                   help="PNG to write; an SVG goes beside it (default timeline.png)")
    t.set_defaults(func=cmd_plot_timeline)
    p = sub.add_parser("demo", help="simulate the built-in scenarios and plot them")
    p.add_argument("--out", default="runs/demo", metavar="DIR",
                   help="run folder (default runs/demo)")
    p.set_defaults(func=cmd_demo)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="trainsim", description="Predict how fast a model trains on a "
                     "cluster under a parallel plan.")
    parser.add_argument("--version", action="version", version=f"trainsim {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    _add_simulate(sub)
    _add_plan(sub)
    _add_catalogs(sub)
    from trainsim.execute_cli import add_execute_parsers
    from trainsim.optimize_cli import add_optimize_parsers
    from trainsim.profile_cli import add_profile_parser

    add_optimize_parsers(sub, _MODEL_HELP, _CLUSTER_HELP)
    add_execute_parsers(sub, _MODEL_HELP, _CLUSTER_HELP)
    add_profile_parser(sub, _Parser)
    from trainsim.scenario_cli import add_scenario_options
    from trainsim.sweep_cli import add_sweep_parsers

    add_scenario_options(sub)
    add_sweep_parsers(sub, _MODEL_HELP, _CLUSTER_HELP, _Parser)
    from trainsim.faults_cli import add_fault_options, add_goodput_parser

    add_fault_options(sub)
    add_goodput_parser(sub, _MODEL_HELP, _CLUSTER_HELP)
    from trainsim.cosim_cli import add_cosim_parsers

    add_cosim_parsers(sub, _CLUSTER_HELP, _MODEL_HELP)
    from trainsim.breakdown_cli import add_plot_breakdown

    add_plot_breakdown(sub)
    return parser


def _run_errors() -> tuple[type[BaseException], ...]:
    """Failures of a measurement run (reported in one line, exit 1), if it was loaded."""
    comm = sys.modules.get("profiler.comm")
    return (comm.ProfileRunError,) if comm else ()


def main(argv: list[str] | None = None) -> int:
    from sim.errors import SpecError

    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except SpecError as exc:
        return _fail(str(exc))
    except _run_errors() as exc:
        print(f"trainsim: error: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # the reader (e.g. `| head`) has what it wanted
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - silence the flush at exit
        return 0
    except OSError as exc:
        return _fail(f"{exc.filename or 'file'}: {exc.strerror or exc}")
    except KeyboardInterrupt:
        return 130
