"""``trainsim demo`` (``make demo``): the main job on built-in defaults — optimize
llama3-70b on 16 DGX H100 nodes, print the ranked plans, write the plots, the best plan's
trace and its Megatron-LM arguments."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

__all__ = ["run_demo", "SCENARIO", "cmd_demo", "add_demo_parser"]

SCENARIO: dict[str, str | int] = {"model": "llama3-70b", "cluster": "dgx-h100:16",
                                  "global_batch_size": 512, "seq_len": 8192}


def run_demo(out: Path, workers: int | None = None) -> int:
    from trainsim.commands.optimize import run_optimize
    from trainsim.common import check_out_dir

    s = SCENARIO
    check_out_dir(out, "--out")  # a bad --out fails before any output, creating nothing
    print(f"== optimize {s['model']} on {s['cluster']}, global batch {s['global_batch_size']}"
          f" x {s['seq_len']} tokens")
    gbs, seq = s["global_batch_size"], s["seq_len"]
    assert isinstance(gbs, int) and isinstance(seq, int)
    return run_optimize(str(s["model"]), str(s["cluster"]), gbs, seq, 8, out, False, workers)


def cmd_demo(args: argparse.Namespace) -> int:
    return run_demo(Path(args.out))


def add_demo_parser(sub: Any) -> None:
    what = ("the main job on built-in defaults: optimize llama3-70b on 16 DGX H100 nodes "
            "(global batch 512 x 8192 tokens), print the ranked plans, write the plots, the "
            "best plan's trace and its Megatron-LM arguments")
    p = sub.add_parser("demo", help=what, description=what[0].upper() + what[1:] + ".")
    p.add_argument("--out", default="runs/demo", metavar="DIR",
                   help="run folder (default runs/demo)")
    p.set_defaults(func=cmd_demo)
