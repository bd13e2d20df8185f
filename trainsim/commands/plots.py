"""``trainsim plot``: the group of plot commands, and ``plot timeline``."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from trainsim.common import Parser

__all__ = ["add_plot_group"]


def cmd_plot_timeline(args: argparse.Namespace) -> int:
    from trainsim.plots.output import check_pair
    from trainsim.plots.timeline import plot_timeline

    out = check_pair(args.out, "--out")
    for path in plot_timeline(Path(args.trace), out, also_svg=True):
        print(f"wrote {path}")
    return 0


def add_plot_group(sub: Any) -> None:
    p = sub.add_parser("plot", help="plots of simulation outputs")
    psub = p.add_subparsers(dest="plot_cmd", required=True, parser_class=Parser)
    t = psub.add_parser("timeline", help="Gantt chart (PNG and SVG) of a Chrome trace from "
                        "simulate --fidelity des --trace")
    t.add_argument("trace", help="trace JSON")
    t.add_argument("--out", default="timeline.png",
                   help="PNG or SVG to write; the other goes beside it (default timeline.png)")
    t.set_defaults(func=cmd_plot_timeline)
