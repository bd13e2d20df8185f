"""Stragglers and failures on the command line: ``--straggler``, ``--straggler-dist``,
``--seed`` and ``--fail-link`` on ``trainsim simulate``, and ``trainsim goodput``."""

from __future__ import annotations

import argparse
import json
import math
from typing import Any

__all__ = ["add_fault_options", "add_goodput_parser", "faults_of"]

_STRAGGLER_HELP = ("slow-down factor of a GPU, node or link, e.g. gpu:5=1.3, node:3=1.2, "
                   "link:nic3.0-pod0=2 (capacity / 2; a vertex alone, link:nic3.0, means all "
                   "its links); repeatable, factors multiply")
_DIST_HELP = ("draw factors per GPU (default), node or link, seeded: lognormal:SIGMA "
              "(exp(SIGMA z)), uniform:LO:HI, e.g. node:uniform:1:1.3; repeatable")
_FAIL_HELP = ("des: the link (A-B) or every link of a vertex (a NIC: nic3.0) fails at "
              "SECONDS into the step; flows re-route around it or the step cannot complete; "
              "repeatable")


def add_fault_options(sub: Any) -> None:
    """Add the straggler and failure options to ``trainsim simulate``."""
    p = sub.choices["simulate"]
    p.add_argument("--straggler", action="append", default=[], metavar="SCOPE:NAME=FACTOR",
                   help=_STRAGGLER_HELP)
    p.add_argument("--straggler-dist", action="append", default=[], metavar="[SCOPE:]DIST",
                   help=_DIST_HELP)
    p.add_argument("--seed", type=int, default=0, help="seed of --straggler-dist draws "
                   "(default 0; same seed, same factors)")
    p.add_argument("--fail-link", action="append", default=[], metavar="LINK@SECONDS",
                   help=_FAIL_HELP)


def faults_of(args: argparse.Namespace) -> Any:
    """The parsed :class:`sim.spec.faults.Faults` of ``args`` (None without fault options)."""
    names = ("straggler", "straggler_dist", "fail_link")
    if not any(getattr(args, n, None) for n in names):
        return None
    from sim.errors import SpecError
    from sim.spec.faults import faults_from_options

    if args.fail_link and args.fidelity != "des":
        raise SpecError("--fail-link", "needs --fidelity des")
    return faults_from_options(args.straggler, args.straggler_dist, args.seed, args.fail_link)


# goodput ------------------------------------------------------------------------------------
def add_goodput_parser(sub: Any, model_help: str, cluster_help: str) -> None:
    p = sub.add_parser(
        "goodput", help="expected training time and goodput under GPU failures",
        description="Restart-from-checkpoint model: expected time to train N iterations, "
        "goodput, the optimal checkpoint interval (Young/Daly) and a seeded Monte Carlo. "
        "The iteration time is given or simulated (--model --cluster --plan).")
    p.add_argument("--iteration-s", type=float, help="seconds per iteration (else simulated)")
    p.add_argument("--model", help="simulate the iteration: " + model_help)
    p.add_argument("--cluster", help=cluster_help + " (also gives --gpus)")
    p.add_argument("--plan", help="plan JSON to simulate")
    p.add_argument("--fidelity", default="analytic", choices=["analytic", "des"],
                   help="tier of the simulated iteration (default analytic)")
    p.add_argument("--gpus", type=int, help="GPUs that can fail (default: the cluster's)")
    p.add_argument("--mtbf-hours", type=float, help="mean time between failures per GPU")
    p.add_argument("--mtbf-node-hours", type=float, help="... or per node (8 GPUs unless "
                   "the cluster says otherwise)")
    p.add_argument("--iterations", type=int, required=True, help="iterations to train")
    p.add_argument("--checkpoint-every", required=True, metavar="N|SECONDSs|MINm|Hh",
                   help="checkpoint interval: iterations (100) or time (1800s, 30m, 2h)")
    p.add_argument("--ckpt-write-s", type=float, required=True,
                   help="seconds the job stops to write a checkpoint")
    p.add_argument("--restart-s", type=float, required=True,
                   help="seconds from a failure until training resumes (the lost work "
                   "since the checkpoint is counted separately)")
    p.add_argument("--monte-carlo", type=int, default=200, metavar="TRIALS",
                   help="simulated runs to check the closed form (default 200; 0: none)")
    p.add_argument("--seed", type=int, default=0, help="Monte Carlo seed (default 0)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_goodput)


def _interval(text: str, iteration_s: float) -> int:
    """``--checkpoint-every`` in iterations (a time is rounded to whole iterations)."""
    from sim.errors import SpecError

    units = {"s": 1.0, "m": 60.0, "h": 3600.0}
    try:
        if text[-1:] in units:
            seconds = float(text[:-1]) * units[text[-1]]
            value = max(1, round(seconds / iteration_s)) if seconds > 0 else 0
        else:
            value = int(text)
    except (ValueError, OverflowError):  # not a number, NaN or infinite
        value = 0
    if value < 1:
        raise SpecError("--checkpoint-every", f"must be a positive number of iterations or a "
                        f"time like 1800s, 30m, 2h, got {text!r}")
    return value


def _iteration(args: argparse.Namespace) -> tuple[float, int | None, int]:
    """(seconds per iteration, cluster GPUs, GPUs per node)."""
    from sim import SpecError, load_cluster, load_model, load_plan, simulate

    if args.iteration_s is not None:
        if args.model or args.plan:
            raise SpecError("--iteration-s", "give it or --model/--plan to simulate, not both")
        if not args.cluster:
            return args.iteration_s, None, 8
        cluster = load_cluster(args.cluster)
        return args.iteration_s, cluster.world_size, cluster.gpus_per_node
    if not (args.model and args.cluster and args.plan):
        raise SpecError("--iteration-s", "is required unless --model, --cluster and --plan "
                        "are given")
    cluster = load_cluster(args.cluster)
    result = simulate(load_model(args.model), cluster, load_plan(args.plan), args.fidelity)
    return result.iteration_time_s, cluster.world_size, cluster.gpus_per_node


_OPTION = {"iteration_s": "--iteration-s", "iterations": "--iterations", "gpus": "--gpus",
           "checkpoint_write_s": "--ckpt-write-s", "restart_s": "--restart-s",
           "checkpoint_every": "--checkpoint-every", "trials": "--monte-carlo", "seed": "--seed"}


def cmd_goodput(args: argparse.Namespace) -> int:
    from sim import SpecError
    from sim.analytic.goodput import GoodputInputs, goodput_report

    if (args.mtbf_hours is None) == (args.mtbf_node_hours is None):
        raise SpecError("--mtbf-hours", "give exactly one of --mtbf-hours (per GPU) and "
                        "--mtbf-node-hours")
    if args.monte_carlo < 0 or args.monte_carlo == 1:
        raise SpecError("--monte-carlo", f"must be 0 or at least 2, got {args.monte_carlo}")
    iteration_s, world, per_node = _iteration(args)
    if not (math.isfinite(iteration_s) and iteration_s > 0):
        raise SpecError("--iteration-s", f"must be a positive number, got {iteration_s!r}")
    gpus = args.gpus if args.gpus is not None else world
    if gpus is None:
        raise SpecError("--gpus", "is required without --cluster")
    given, field = (args.mtbf_hours, "--mtbf-hours") if args.mtbf_hours is not None else \
        (args.mtbf_node_hours, "--mtbf-node-hours")
    if not (math.isfinite(given) and given > 0):
        raise SpecError(field, f"must be a positive number, got {given:g}")
    hours = given if args.mtbf_hours is not None else given * per_node
    try:
        x = GoodputInputs(iteration_s, args.iterations, gpus, hours * 3600.0,
                          _interval(args.checkpoint_every, iteration_s), args.ckpt_write_s,
                          args.restart_s)
        report = goodput_report(x, args.monte_carlo, args.seed)
    except SpecError as exc:
        raise SpecError(_OPTION.get(exc.field, exc.field), exc.rule) from None
    print(json.dumps(report, indent=2) if args.json else format_goodput(report))
    return 0


def format_goodput(r: dict[str, Any]) -> str:
    x = r["inputs"]
    lines = [
        f"{x['iterations']:,} iterations of {x['iteration_s']:.4g} s on {x['gpus']:,} GPUs "
        f"(MTBF {x['mtbf_gpu_s'] / 3600:,.0f} h per GPU -> {r['job_mtbf_s'] / 3600:.3g} h "
        f"for the job)",
        f"  checkpoint every {x['checkpoint_every']} iterations "
        f"({x['checkpoint_every'] * x['iteration_s']:.4g} s), write {x['checkpoint_write_s']:g}"
        f" s, restart {x['restart_s']:g} s",
        f"  useful time           {r['useful_s'] / 3600:.4g} h",
        f"  expected time         {r['expected_time_s'] / 3600:.4g} h   "
        f"(goodput {100 * r['goodput']:.2f}%, {r['expected_failures']:.3g} failures expected)",
        f"  optimal interval      {r['optimal_interval_s']:.4g} s = every "
        f"{r['optimal_checkpoint_every']} iterations (Daly; Young {r['young_interval_s']:.4g}"
        f" s): {r['expected_time_at_optimum_s'] / 3600:.4g} h, goodput "
        f"{100 * r['goodput_at_optimum']:.2f}%"]
    if "monte_carlo" in r:
        mc = r["monte_carlo"]
        lines.append(f"  Monte Carlo           {mc['mean_time_s'] / 3600:.4g} h +- "
                     f"{mc['stderr_s'] / 3600:.2g} ({mc['trials']} runs, seed {mc['seed']}; "
                     f"{100 * mc['relative_difference']:+.2f}% vs closed form)")
    return "\n".join(lines)
