"""What every ``trainsim`` command shares: the one-line error convention, exit codes, the
argument parser class, help texts, and the run folder a simulation writes."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, NoReturn

__all__ = ["EXIT_BAD_INPUT", "EXIT_NO_PLAN", "EXIT_WALL_LIMIT", "Parser", "fail", "write_run",
           "MODEL_HELP", "CLUSTER_HELP", "check_out_dir", "add_watch_options", "max_wall_s",
           "DesProgress", "progress_after_s", "check_device"]

EXIT_BAD_INPUT = 2
EXIT_NO_PLAN = 3
EXIT_WALL_LIMIT = 4  # a run stopped at --max-wall-s (it says how far it got)
MODEL_HELP = "zoo name (trainsim models), Hugging Face config.json (or its folder), or TOML"
CLUSTER_HELP = "preset (dgx-a100:N, dgx-h100:N, hgx-h200:N, cpu:RANKS) or a TOML file"


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (and exit code 2)."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_BAD_INPUT, f"trainsim: error: {message} (see {self.prog} --help)\n")


def check_device(device: str) -> None:
    """Refuse ``--device cuda`` where torch sees no CUDA device (imports torch)."""
    import torch

    from sim.errors import SpecError

    if device == "cuda" and not torch.cuda.is_available():
        raise SpecError("--device", "cuda requested but torch sees no CUDA device here")


def fail(message: str) -> int:
    """Print ``message`` as one line on stderr; the bad-input exit code."""
    one_line = message.encode("unicode_escape").decode("ascii") if not message.isprintable() \
        else message
    print(f"trainsim: error: {one_line}", file=sys.stderr)
    return EXIT_BAD_INPUT


def check_out_dir(out: Path | None, field: str) -> None:
    """A run folder that can be created later: not a file, under a writable folder. Nothing
    is created here, so a command that fails afterwards leaves no empty folder behind."""
    import os

    from sim.errors import SpecError

    if out is None:
        return
    if out.exists() and not out.is_dir():
        raise SpecError(field, f"{str(out)!r} is a file, not a folder")
    parent = out
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise SpecError(field, f"cannot create {str(out)!r}: {str(parent)!r} is not a "
                        "writable folder")


def write_run(out: Path, result: Any, model: Any, cluster: Any, plan: Any,
              faults: Any = None) -> None:
    """The run folder, all-or-nothing: the resolved inputs next to the results."""
    from sim.io import atomic_write_files
    from trainsim.report import format_result

    inputs = {"model": model.to_dict(), "cluster": cluster.to_dict(), "plan": plan.to_dict()}
    atomic_write_files({
        out / "inputs.json": json.dumps(inputs, indent=2) + "\n",
        out / "result.json": json.dumps(result.to_dict(), indent=2) + "\n",
        out / "summary.txt": format_result(result, plan, faults) + "\n"})


def add_watch_options(p: argparse.ArgumentParser, what: str) -> None:
    """``--max-wall-s`` and ``--no-progress``; ``what`` the limit stops."""
    p.add_argument("--max-wall-s", type=float, metavar="SECONDS",
                   help=f"stop {what} after this much wall time and say what was learned "
                   "(a DES step stopped this way exits with code 4)")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress bar (shown on stderr once a DES run takes 3 s)")


def max_wall_s(args: argparse.Namespace) -> float | None:
    """``--max-wall-s``, checked: a positive, finite number of seconds."""
    import math

    from sim.errors import SpecError

    limit = args.max_wall_s
    if limit is not None and not (math.isfinite(limit) and limit > 0):
        raise SpecError("--max-wall-s", f"must be a positive number of seconds, got {limit:g}")
    return limit


def progress_after_s() -> float:
    """Wall seconds before a DES run shows progress: 3, or ``TRAINSIM_PROGRESS_AFTER_S``."""
    import math
    import os

    from sim.errors import SpecError

    text = os.environ.get("TRAINSIM_PROGRESS_AFTER_S", "3")
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        raise SpecError("TRAINSIM_PROGRESS_AFTER_S", f"must be a number of seconds >= 0, "
                        f"got {text!r}")
    return value


class DesProgress:
    """A DES run's progress bar on stderr (events simulated / estimated), made on its first
    report (:class:`sim.des.watch.Watch` reports once a run has taken 3 s)."""

    def __init__(self) -> None:
        self.bar: Any = None

    def __call__(self, events: int, estimated: int) -> None:
        if self.bar is None:
            from tqdm import tqdm

            self.bar = tqdm(total=estimated, initial=events, desc="des", unit="event",
                            file=sys.stderr)
        self.bar.total = estimated
        self.bar.update(events - self.bar.n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
