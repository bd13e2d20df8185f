"""``trainsim trace``: any torch model as a workload graph JSON (needs torch)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

__all__ = ["add_trace_parser", "cmd_trace", "TRACE_MODEL_HELP"]

TRACE_MODEL_HELP = ("torchvision:NAME (a classification builder, no weights), "
                    "hf-encoder:CONFIG.json (BERT or RoBERTa), builtin:lstm-lm, or "
                    "FILE.py:FUNCTION (returning (module, example_input); dimension 0 of the "
                    "input is the batch)")


def cmd_trace(args: argparse.Namespace) -> int:
    from sim.errors import SpecError
    from sim.io import atomic_write_text
    from trainsim.plots.output import check_out

    out = check_out(Path(args.out), "--out", (".json",)) if args.out else None  # before work
    if args.seq_len is not None and args.seq_len < 1:
        raise SpecError("--seq-len", f"must be >= 1, got {args.seq_len}")
    from profiler.graph.sources import build
    from profiler.graph.trace import trace_module

    module, example, name = build(args.model, args.batch, args.seq_len)
    w = trace_module(module, example, args.name or name, args.model, args.depth)
    text = json.dumps(w.to_dict(), indent=1) + "\n"
    if out is not None:
        atomic_write_text(out, text)
    if args.json or out is None:
        print(text, end="")
    if out is not None:
        print(_summary(w) + f"\nwrote {out}")
    return 0


def _summary(w: Any) -> str:
    saved = sum(layer.saved_bytes for layer in w.layers)
    return (f"{w.name}: {len(w.layers)} layers, {w.param_count:,} trainable parameters, "
            f"{w.forward_flops_per_sample / 1e9:.3f} GFLOP forward and "
            f"{w.backward_flops_per_sample / 1e9:.3f} GFLOP backward per sample "
            f"({w.sample}), {saved / 2**20:.1f} MiB saved for backward per sample")


def add_trace_parser(sub: Any) -> None:
    p = sub.add_parser("trace", help="trace a torch model into a workload graph (JSON)",
                       description="Trace any torch model on the meta device (nothing is "
                       "allocated or downloaded) into the layers the simulator runs: "
                       "parameters, forward and backward FLOPs, activation bytes.")
    p.add_argument("--model", required=True, help=TRACE_MODEL_HELP)
    p.add_argument("--out", metavar="FILE.json", help="write the workload here (else print it)")
    p.add_argument("--name", help="the workload's name (default: from --model)")
    p.add_argument("--depth", type=int, metavar="N",
                   help="one layer per module at this depth of the module tree (default: "
                   "every leaf module)")
    p.add_argument("--batch", type=int, metavar="B",
                   help="batch of the traced input (default 2, or the example's of a "
                   "FILE.py:FUNCTION without a batch parameter; the figures are per sample)")
    p.add_argument("--seq-len", type=int, metavar="S",
                   help="tokens per sample for hf-encoder (default 128) and builtin:lstm-lm "
                   "(default 35)")
    p.add_argument("--json", action="store_true", help="print the workload even with --out")
    p.set_defaults(func=cmd_trace)
