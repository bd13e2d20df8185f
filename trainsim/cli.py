"""``trainsim``: predict, inspect, optimise and run training plans.

Every subcommand validates its input first; bad input prints one line naming the field and
the rule and exits with code 2. Nothing is written until the inputs are valid, and every
file is written atomically. The commands live in :mod:`trainsim.commands`, one module per
group; this module builds the parser and maps errors to exit codes.
"""

from __future__ import annotations

import argparse
import os
import sys

from trainsim import __version__
from trainsim.commands.catalog import add_catalog_parsers
from trainsim.commands.demo import add_demo_parser
from trainsim.commands.plan import add_plan_parser
from trainsim.commands.plots import add_plot_group
from trainsim.commands.simulate import add_simulate_parser
from trainsim.common import CLUSTER_HELP, EXIT_WALL_LIMIT, MODEL_HELP, Parser, fail

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="trainsim", description="Predict how fast a model trains on a "
                     "cluster under a parallel plan.")
    parser.add_argument("--version", action="version", version=f"trainsim {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    add_simulate_parser(sub)
    add_plan_parser(sub)
    add_catalog_parsers(sub)
    add_plot_group(sub)
    add_demo_parser(sub)
    from trainsim.commands.execute import add_execute_parsers
    from trainsim.commands.optimize import add_optimize_parsers
    from trainsim.commands.profile import add_profile_parser

    add_optimize_parsers(sub, MODEL_HELP, CLUSTER_HELP)
    add_execute_parsers(sub, MODEL_HELP, CLUSTER_HELP)
    add_profile_parser(sub, Parser)
    from trainsim.commands.scenario import add_scenario_options
    from trainsim.commands.sweep import add_sweep_parsers

    add_scenario_options(sub)
    add_sweep_parsers(sub, MODEL_HELP, CLUSTER_HELP, Parser)
    from trainsim.commands.faults import add_fault_options, add_goodput_parser

    add_fault_options(sub)
    add_goodput_parser(sub, MODEL_HELP, CLUSTER_HELP)
    from trainsim.commands.cosim import add_cosim_parsers

    add_cosim_parsers(sub, CLUSTER_HELP, MODEL_HELP)
    from trainsim.commands.breakdown import add_plot_breakdown

    add_plot_breakdown(sub)
    from trainsim.commands.trace import add_trace_parser

    add_trace_parser(sub)
    from trainsim.commands.optimize_sync import add_optimize_sync_parser

    add_optimize_sync_parser(sub, MODEL_HELP, CLUSTER_HELP)
    from trainsim.commands.fl import add_fl_parser

    add_fl_parser(sub)
    from trainsim.commands.sites import add_sites_parser

    add_sites_parser(sub, MODEL_HELP)
    from trainsim.commands.calibrate import add_calibrate_parser

    add_calibrate_parser(sub)
    return parser


def _run_errors() -> tuple[type[BaseException], ...]:
    """Failures of a measurement run (reported in one line, exit 1), if it was loaded."""
    comm = sys.modules.get("profiler.comm")
    return (comm.ProfileRunError,) if comm else ()


def main(argv: list[str] | None = None) -> int:
    from sim.des.watch import WallLimit
    from sim.errors import SpecError

    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except SpecError as exc:
        return fail(str(exc))
    except WallLimit as exc:
        print(f"trainsim: {exc}", file=sys.stderr)
        return EXIT_WALL_LIMIT
    except _run_errors() as exc:
        print(f"trainsim: error: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # the reader (e.g. `| head`) has what it wanted
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - silence the flush at exit
        return 0
    except OSError as exc:
        return fail(f"{exc.filename or 'file'}: {exc.strerror or exc}")
    except KeyboardInterrupt:
        return 130
