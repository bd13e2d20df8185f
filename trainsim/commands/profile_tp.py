"""``trainsim profile tp``: whole TP layers and output heads timed over torchrun ranks as the
executor runs them (:mod:`executor.layer_profile`); ``trainsim profile fsdp``: FSDP2's cost
around a ZeRO-3 unit's collectives, so timed (:mod:`executor.fsdp_profile`)."""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["add_tp_parser", "add_fsdp_parser"]

_SP = {"off": [False], "on": [True], "both": [False, True]}


def cmd_tp(args: argparse.Namespace) -> int:
    from executor.layer_profile import run_tp_profile
    from sim.spec.zoo import load_model
    from trainsim.common import check_device

    check_device(args.device)
    model = load_model(args.model)
    seqs = args.seq_len or [min(512, model.max_seq_len)]
    dtype = args.dtype or ("fp32" if args.device == "cpu" else "bf16")
    folder, rows = run_tp_profile(model, args.tp, args.micro_batch or [1, 2, 4], seqs,
                                  _SP[args.sp], args.db, args.device, dtype, args.passes,
                                  timeout_s=args.timeout)
    for r in rows:
        print(f"{r['op']:<12} tokens {r['m']:>7} hidden {r['n']:>6} {r['variant'][:24]:<24} "
              f"forward {r['fwd_median_s'] * 1e3:9.2f} ms  backward "
              f"{r['bwd_median_s'] * 1e3:9.2f} ms")
    print(f"wrote {len(rows)} rows to {folder / 'compute.csv'}")
    return 0


def add_tp_parser(psub: Any, int_list: Any, int_at_least: Any, positive_seconds: Any,
                  default_db: str) -> None:
    t = psub.add_parser("tp", help="time whole tensor-parallel layers and output heads over "
                        "torchrun ranks, as the executor runs them (DTensor, loss_parallel)")
    t.add_argument("--model", required=True, help="zoo name or config.json of a dense model")
    t.add_argument("--tp", type=int_at_least(2), default=2, help="TP degree: ranks started "
                   "(default 2)")
    t.add_argument("--micro-batch", type=int_list, help="micro-batch sizes (default 1,2,4)")
    t.add_argument("--seq-len", type=int_list, help="sequence lengths (default 512, or the "
                   "model's limit)")
    t.add_argument("--sp", choices=sorted(_SP), default="both", help="sequence parallelism "
                   "(default both)")
    _ranks_args(t, "default fp32 on cpu, bf16 on cuda", int_at_least, positive_seconds,
                default_db)
    t.set_defaults(func=cmd_tp)


def _ranks_args(p: Any, dtype_help: str, int_at_least: Any, positive_seconds: Any,
                default_db: str) -> None:
    """What every profile over torchrun ranks takes: device, dtype, passes, timeout, DB."""
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="default cpu "
                   "(gloo, one thread and core per rank); cuda uses NCCL")
    p.add_argument("--dtype", choices=["fp32", "bf16", "fp16"], help=dtype_help)
    p.add_argument("--passes", type=int_at_least(1), default=1, help="separate runs over all "
                   "shapes; each keeps its median pass (default 1)")
    p.add_argument("--timeout", type=positive_seconds, default=1800.0, help="seconds before "
                   "every rank is stopped (default 1800)")
    p.add_argument("--db", default=default_db, help=f"profile DB root (default {default_db}/)")


def cmd_fsdp(args: argparse.Namespace) -> int:
    from executor.fsdp_profile import DEFAULT_PARAMS, run_fsdp_profile
    from trainsim.common import check_device

    check_device(args.device)
    dtype = args.dtype or ("fp32" if args.device == "cpu" else "bf16")
    folder, rows = run_fsdp_profile(args.dp, args.params or DEFAULT_PARAMS, args.db,
                                    args.device, dtype, args.passes, args.samples,
                                    timeout_s=args.timeout)
    for r in rows:
        print(f"{r['op']:<11} params/unit {r['m']:>10} child units {r['n']} forward "
              f"{r['fwd_median_s'] * 1e3:9.2f} ms  backward {r['bwd_median_s'] * 1e3:9.2f} ms")
    print(f"wrote {len(rows)} rows to {folder / 'compute.csv'}")
    return 0


def add_fsdp_parser(psub: Any, int_list: Any, int_at_least: Any, positive_seconds: Any,
                    default_db: str) -> None:
    f = psub.add_parser("fsdp", help="time FSDP2 (ZeRO-3) units over torchrun ranks against "
                        "the same modules unwrapped: its cost around the collectives")
    f.add_argument("--dp", type=int_at_least(2), default=2, help="data-parallel degree: "
                   "ranks started (default 2)")
    f.add_argument("--params", type=int_list, help="parameters per unit (default 65536, "
                   "262144, 1048576, 4194304)")
    f.add_argument("--samples", type=int_at_least(3), default=25, help="timed samples per "
                   "row (default 25: the difference it keeps is small beside a "
                   "collective's spread)")
    _ranks_args(f, "training dtype (FSDP2's mixed precision); default fp32 on cpu, bf16 on "
                "cuda", int_at_least, positive_seconds, default_db)
    f.set_defaults(func=cmd_fsdp)
