"""``trainsim profile ...``: the profiler's subcommands (they import torch; nothing else in
the CLI does)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from sim.errors import SpecError

__all__ = ["add_profile_parser", "add_profile_options", "with_profile_options"]

DEFAULT_DB = "profiles"


def add_profile_options(p: argparse.ArgumentParser, profile_help: str) -> None:
    """``--profile DIR`` and ``--compute-stat`` on a command that simulates a cluster."""
    from sim.spec.cluster import COMPUTE_STATS

    p.add_argument("--profile", metavar="DIR", help=profile_help)
    p.add_argument("--compute-stat", choices=COMPUTE_STATS, help="which statistic of "
                   "each profiled compute time to read (overrides the cluster's "
                   "compute_stat; default median). p10 leaves out most interference from "
                   "other work on a shared machine")


def with_profile_options(cluster: Any, args: argparse.Namespace) -> Any:
    """``cluster`` with the ``--profile`` and ``--compute-stat`` given on the command line."""
    import dataclasses

    changes = {k: getattr(args, k, None) for k in ("profile", "compute_stat")}
    changes = {k: v for k, v in changes.items() if v}
    return dataclasses.replace(cluster, **changes) if changes else cluster


def _int_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def _check_device(device: str) -> None:
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        raise SpecError("--device", "cuda requested but torch sees no CUDA device here")


def _compute_specs(args: argparse.Namespace) -> list[Any]:
    from profiler.grids import model_grid, preset_grid
    from sim.spec.zoo import load_model

    if not args.model:
        return preset_grid(args.device, args.dtype and [args.dtype])
    model = load_model(args.model)
    seqs = args.seq_len or [s for s in (512, 1024, 2048) if s <= model.max_seq_len] \
        or [model.max_seq_len]
    tps = args.tp or ([1, 2] if args.device == "cpu" else [1, 2, 4, 8])
    tps = [t for t in tps if model.num_heads % t == 0 and model.kv_heads % t == 0]
    dtype = args.dtype or ("fp32" if args.device == "cpu" else "bf16")
    return model_grid(model, tps, args.micro_batch or [1, 2, 4], seqs, dtype)


def cmd_compute(args: argparse.Namespace) -> int:
    from profiler.compute import run_compute_profile

    _check_device(args.device)
    specs = _compute_specs(args)
    from profiler.busy import default_busy

    busy = args.busy if args.busy is not None else (
        default_busy() if args.device == "cpu" else 0)
    if busy < 0:
        raise SpecError("--busy", f"must be >= 0, got {busy}")
    if args.passes < 1:
        raise SpecError("--passes", f"must be >= 1, got {args.passes}")
    folder, rows = run_compute_profile(specs, args.device, args.db, args.threads, args.force,
                                       busy=busy, passes=args.passes)
    print(f"{folder}: {rows} shapes measured ({len(specs) - rows} already there)")
    return 0


def cmd_comm(args: argparse.Namespace) -> int:
    from profiler.comm import default_sizes, run_comm_profile
    from profiler.comm_worker import COLLECTIVES

    colls = args.collectives.split(",") if args.collectives else list(COLLECTIVES)
    bad = sorted(set(colls) - set(COLLECTIVES))
    if bad:
        raise SpecError("--collectives", f"unknown {bad[0]!r} (known: {', '.join(COLLECTIVES)})")
    if args.min_bytes < 1:
        raise SpecError("--min-bytes", f"must be >= 1, got {args.min_bytes}")
    if args.max_bytes < args.min_bytes:
        raise SpecError("--max-bytes", f"must be >= --min-bytes {args.min_bytes}, got "
                        f"{args.max_bytes}")
    sizes = default_sizes(args.min_bytes, args.max_bytes)
    folder, fits = run_comm_profile(args.nproc, args.db, sizes, colls, args.timeout,
                                    args.rounds, insitu=not args.no_insitu)
    _print_nccl_tests_style(folder, colls, args.nproc)
    print("alpha-beta fits (piecewise by size):")
    for f in fits:
        print(f"{f['collective']:<15} x{f['group_size']} {f['min_size_bytes']:>11}-"
              f"{f['max_size_bytes']:<11} B  alpha {f['alpha_s'] * 1e6:9.1f} us  "
              f"{1e-9 / f['beta_s_per_byte'] if f['beta_s_per_byte'] else float('inf'):7.2f}"
              f" GB/s  max err {100 * f['max_rel_error']:.1f}%")
    _print_insitu(folder, colls, args.nproc)
    print(f"wrote {folder}")
    return 0


def _print_insitu(folder: Path, collectives: list[str], nproc: int) -> None:
    from profiler.db import read_table

    rows = read_table(folder, "comm_insitu")
    rows = rows[rows["collective"].isin(collectives) & (rows["group_size"] == nproc)]
    if rows.empty:
        return
    print("in situ (after a compute burst, as in a training step; the simulator adds the "
          "overhead):")
    for r in rows.itertuples(index=False):
        print(f"{r.collective:<15} {r.size_bytes:>12} B  back to back {r.isolated_s * 1e6:9.1f} us"
              f"  in situ {r.insitu_s * 1e6:9.1f} us  overhead {r.overhead_s * 1e6:9.1f} us")


def _print_nccl_tests_style(folder: Path, collectives: list[str], nproc: int) -> None:
    from profiler.db import read_table

    comm = read_table(folder, "comm")
    comm = comm[comm["collective"].isin(collectives) & (comm["group_size"] == nproc)]
    print(f"{'collective':<15} {'size (B)':>12} {'time (us)':>12} {'algbw (GB/s)':>13} "
          f"{'busbw (GB/s)':>13}")
    for r in comm.itertuples(index=False):
        print(f"{r.collective:<15} {r.size_bytes:>12} {r.time_median_s * 1e6:>12.1f} "
              f"{r.algbw_GBps:>13.3f} {r.busbw_GBps:>13.3f}")


def cmd_show(args: argparse.Namespace) -> int:
    from profiler.db import read_table

    root = Path(args.db)
    folders = [root] if (root / "meta.json").is_file() else \
        sorted(p for p in root.glob("*") if (p / "meta.json").is_file())
    if not folders:
        raise SpecError("--db", f"no profile DB under {root}")
    for folder in folders:
        meta = json.loads((folder / "meta.json").read_text())
        env = meta.get("environment", {})
        print(f"{folder.name}: torch {env.get('torch')}, host {env.get('host')}, "
              f"{len(meta.get('runs', []))} runs, last {env.get('time_utc')}")
        comp = read_table(folder, "compute")
        for (op, dtype), part in comp.groupby(["op", "dtype"]):
            print(f"  {op:<10} {dtype:<5} {len(part):4d} shapes, grids: "
                  f"{', '.join(sorted(set(part['grid'])))}")
        fit = read_table(folder, "comm_fit")
        for kind, part in fit.groupby("collective"):
            print(f"  {kind:<15} {len(part)} size ranges, group sizes "
                  f"{sorted(set(part['group_size']))}, worst fit {part['max_rel_error'].max():.1%}")
        insitu = read_table(folder, "comm_insitu")
        for kind, part in insitu.groupby("collective"):
            low, high = part["overhead_s"].min() * 1e6, part["overhead_s"].max() * 1e6
            print(f"  {kind:<15} in situ at {len(part)} sizes: overhead {low:.0f} to "
                  f"{high:.0f} us")
    return 0


def cmd_import_trace(args: argparse.Namespace) -> int:
    from profiler.trace import summarize_trace

    s = summarize_trace(args.trace)
    if args.json:
        print(json.dumps(s.to_dict(args.top), indent=2))
        return 0
    print(f"{s.source}: {s.span_us / 1e3:.2f} ms traced")
    for table in ("compute", "collectives"):
        print(f"{table} ({s.compute_kind if table == 'compute' else 'by kind'}):")
        for r in s.rows(table, args.top):
            sizes = f"  bytes {r['bytes'][:4]}" if r["bytes"] else ""
            print(f"  {r['name'][:60]:<60} {r['count']:6d} x {r['mean_us']:10.1f} us = "
                  f"{r['total_ms']:9.3f} ms{sizes}")
    return 0


def add_profile_parser(sub: Any, parser_class: type) -> None:
    p = sub.add_parser("profile", help="measure kernels and collectives into a profile DB")
    psub = p.add_subparsers(dest="profile_cmd", required=True, parser_class=parser_class)
    c = psub.add_parser("compute", help="time layer building blocks (forward and backward)")
    c.add_argument("--model", help="profile this model's shapes (zoo name or config.json); "
                   "default: the device's preset grid")
    c.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="default cpu")
    c.add_argument("--threads", type=int, default=1, help="CPU threads per process "
                   "(default 1, as one rank of a cpu:RANKS cluster)")
    c.add_argument("--dtype", choices=["fp32", "bf16", "fp16"],
                   help="default: fp32 and bf16 on CPU presets, fp32 for a CPU model, bf16 GPU")
    c.add_argument("--tp", type=_int_list, help="TP degrees of a model grid (e.g. 1,2,4,8)")
    c.add_argument("--micro-batch", type=_int_list, help="micro-batch sizes (default 1,2,4)")
    c.add_argument("--seq-len", type=_int_list, help="sequence lengths (default 512,1024,2048 "
                   "up to the model's limit)")
    c.add_argument("--db", default=DEFAULT_DB, help=f"profile DB root (default {DEFAULT_DB}/)")
    c.add_argument("--force", action="store_true", help="re-measure shapes already in the DB")
    c.add_argument("--passes", type=int, default=1, help="passes over all shapes; each "
                   "keeps its median pass, the faster middle one for an even count (default "
                   "1; 3 on a noisy machine)")
    c.add_argument("--busy", type=int, help="neighbour processes kept busy meanwhile, as the "
                   "other ranks of a cpu:RANKS run (default: one per other CPU core; 0 on "
                   "cuda)")
    c.set_defaults(func=cmd_compute)
    m = psub.add_parser("comm", help="time collectives with torchrun (gloo on CPU, NCCL on GPU)")
    m.add_argument("--nproc", type=int, default=2, help="ranks on this host (default 2)")
    m.add_argument("--collectives", help="comma-separated subset (default: all six)")
    m.add_argument("--min-bytes", type=int, default=1 << 10, help="default 1 KiB")
    m.add_argument("--max-bytes", type=int, default=1 << 30, help="default 1 GiB")
    m.add_argument("--rounds", type=int, default=9, help="passes over all sizes; the median "
                   "pass is kept (default 9; more on a noisy machine)")
    m.add_argument("--no-insitu", action="store_true", help="skip the in-situ measurement "
                   "(each collective after a compute burst, as in a training step)")
    m.add_argument("--timeout", type=float, default=1800.0, help="seconds before every rank "
                   "is stopped (default 1800)")
    m.add_argument("--db", default=DEFAULT_DB, help=f"profile DB root (default {DEFAULT_DB}/)")
    m.set_defaults(func=cmd_comm)
    s = psub.add_parser("show", help="summarise a profile DB")
    s.add_argument("--db", default=DEFAULT_DB, help="a DB root or one device folder")
    s.set_defaults(func=cmd_show)
    t = psub.add_parser("import-trace", help="per-kernel and per-collective times of a "
                        "PyTorch profiler (Kineto) Chrome trace")
    t.add_argument("trace", help="trace JSON written by torch.profiler export_chrome_trace")
    t.add_argument("--top", type=int, default=25, help="operations to list (default 25)")
    t.add_argument("--json", action="store_true", help="print one JSON object")
    t.set_defaults(func=cmd_import_trace)
