"""``trainsim profile ...``: the profiler's subcommands (they import torch; nothing else in
the CLI does)."""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sim.errors import SpecError

__all__ = ["add_profile_parser", "add_profile_options", "with_profile_options", "int_at_least",
           "positive_seconds"]

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


def int_at_least(low: int) -> Callable[[str], int]:
    """An argparse type: an integer >= ``low`` (else a one-line usage error, exit 2)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected an integer >= {low}, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {value}")
        return value
    return parse


def positive_seconds(text: str) -> float:
    """An argparse type: a finite number of seconds > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds > 0, got {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds > 0, got {text}")
    return value


def _compute_specs(args: argparse.Namespace) -> list[Any]:
    from profiler.grids import model_grid, preset_grid
    from sim.spec.zoo import load_model

    if not args.model:
        return preset_grid(args.device, args.dtype and [args.dtype])
    model = load_model(args.model)
    if model.is_mla:
        raise SpecError("model.kv_lora_rank", "multi-head latent attention is simulated only: "
                        "the profiler's layers build standard attention")
    seqs = args.seq_len or [s for s in (512, 1024, 2048) if s <= model.max_seq_len] \
        or [model.max_seq_len]
    tps = args.tp or ([1, 2] if args.device == "cpu" else [1, 2, 4, 8])
    tps = [t for t in tps if model.num_heads % t == 0 and model.kv_heads % t == 0]
    dtype = args.dtype or ("fp32" if args.device == "cpu" else "bf16")
    return model_grid(model, tps, args.micro_batch or [1, 2, 4], seqs, dtype)


def _graph_compute(args: argparse.Namespace) -> int:
    """A workload graph's layers, whole step and optimizer step (profiler/graph)."""
    from profiler.busy import default_busy
    from profiler.graph.profile import profile_workload

    busy = args.busy if args.busy is not None else (
        default_busy() if args.device == "cpu" else 0)
    folder, w, rows = profile_workload(
        args.model, args.batch or [4, 8], args.db, args.device, args.threads,
        args.passes or 3, args.depth, args.seq_len[0] if args.seq_len else None, busy=busy,
        dtype=args.dtype or "fp32")
    for r in rows:
        gap = 100 * (r["layers_s"] + r["optimizer_s"] - r["step_s"]) / r["step_s"]
        print(f"{w.name} batch {r['batch']}: step {r['step_s']:.4g} s measured; layers "
              f"{r['layers_s']:.4g} s + AdamW {r['optimizer_s']:.4g} s ({gap:+.1f}%)")
    print(f"wrote {folder / 'workloads' / (w.name + '.json')} (simulate --model it), "
          f"{folder / 'graph_layers.csv'}, {folder / 'graph_steps.csv'}")
    return 0


def cmd_compute(args: argparse.Namespace) -> int:
    from profiler.busy import default_busy
    from profiler.compute import run_compute_profile
    from trainsim.common import check_device

    check_device(args.device)
    if args.model and ":" in args.model:
        return _graph_compute(args)
    if args.batch or args.depth is not None:
        raise SpecError("--batch/--depth", "profile a workload graph (--model "
                        "torchvision:NAME, hf-encoder:..., builtin:... or FILE.py:FUNCTION)")
    specs = _compute_specs(args)
    busy = args.busy if args.busy is not None else (
        default_busy() if args.device == "cpu" else 0)
    folder, rows = run_compute_profile(specs, args.device, args.db, args.threads, args.force,
                                       busy=busy, passes=args.passes or 1)
    print(f"{folder}: {rows} shapes measured ({len(specs) - rows} already there)")
    return 0


def cmd_comm(args: argparse.Namespace) -> int:
    from profiler.comm import PoorFitError, default_sizes, run_comm_profile
    from profiler.comm_worker import COLLECTIVES

    colls = args.collectives.split(",") if args.collectives else list(COLLECTIVES)
    bad = sorted(set(colls) - set(COLLECTIVES))
    if bad:
        raise SpecError("--collectives", f"unknown {bad[0]!r} (known: {', '.join(COLLECTIVES)})")
    if args.max_bytes < args.min_bytes:
        raise SpecError("--max-bytes", f"must be >= --min-bytes {args.min_bytes}, got "
                        f"{args.max_bytes}")
    sizes = default_sizes(args.min_bytes, args.max_bytes)
    try:
        folder, fits = run_comm_profile(args.nproc, args.db, sizes, colls, args.timeout,
                                        args.rounds, insitu=not args.no_insitu,
                                        accept_poor_fit=args.accept_poor_fit)
    except PoorFitError as exc:
        _print_fits(exc.fits)
        raise
    _print_nccl_tests_style(folder, colls, args.nproc)
    _print_fits(fits)
    _print_insitu(folder, colls, args.nproc)
    print(f"wrote {folder}")
    return 0


def _print_fits(fits: list[dict[str, Any]]) -> None:
    """The fits, each poor one also as a warning on stderr."""
    import sys

    print("alpha-beta fits (piecewise by size; alpha >= 0; 'flat': no bandwidth measurable "
          "in the range):")
    for f in fits:
        beta = f["beta_s_per_byte"]
        bw = f"{1e-9 / beta:7.2f} GB/s" if beta > 0 else "   flat    "
        line = (f"{f['collective']:<15} x{f['group_size']} {f['min_size_bytes']:>11}-"
                f"{f['max_size_bytes']:<11} B  alpha {f['alpha_s'] * 1e6:9.1f} us  {bw}"
                f"  max err {100 * f['max_rel_error']:.1f}%")
        print(line + (f"  POOR FIT: {f['quality']}" if f["quality"] else ""))
        if f["quality"]:
            print(f"trainsim: warning: poor alpha-beta fit, {f['collective']} x"
                  f"{f['group_size']} {f['min_size_bytes']}-{f['max_size_bytes']} B: "
                  f"{f['quality']}", file=sys.stderr)


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


def _show_roots(db: str | None) -> list[Path]:
    """``--db``, or every place a profile is found: the shipped ones, ./profiles (where
    ``profile compute/comm`` write by default) and the user's (``compare --calibrate``)."""
    from sim.cost.profile_db import shipped_profiles_root, user_profiles_root

    return [Path(db)] if db else [shipped_profiles_root(), Path(DEFAULT_DB),
                                  user_profiles_root()]


def _device_folders(root: Path) -> list[Path]:
    if (root / "meta.json").is_file():
        return [root]
    return sorted(p for p in root.glob("*") if (p / "meta.json").is_file())


def _calibration_line(folder: Path, meta: dict[str, Any]) -> str:
    from sim.cost.profile_db import calibration_key, shipped_profiles_root
    from sim.spec.hardware import cpu_device_name

    if "calibrates" in meta:
        path = folder / "calibration.json"
        data = json.loads(path.read_text()) if path.is_file() else {}
        scales = ", ".join(f"{stat} x{data[calibration_key(stat)]:.3f}"
                           for stat in ("median", "p10") if calibration_key(stat) in data)
        return (f"  calibration {path} ({scales or 'none yet'}, {len(data.get('runs', []))} "
                f"runs) of {meta['calibrates']}; applies where --profile names this folder "
                "or its root")
    line = "  no calibration applies"
    if folder.resolve().parent == shipped_profiles_root() and folder.name == cpu_device_name():
        line += "; the cpu:RANKS preset reads this profile on this host"
    if (folder / "calibration.json").exists():
        line += "; its calibration.json is ignored (a calibration is a folder of its own)"
    return line


def _describe(folder: Path) -> list[str]:
    """Where a device folder is, what it is, when it was measured, what calibration
    applies."""
    from sim.cost.profile_db import shipped_profiles_root

    meta = json.loads((folder / "meta.json").read_text())
    env, runs = meta.get("environment", {}), meta.get("runs", [])
    kind = "calibrated profile" if "calibrates" in meta else \
        "shipped with trainsim" if folder.resolve().parent == shipped_profiles_root() \
        else "measured"
    date = runs[-1].get("time_utc") if runs else env.get("time_utc")
    where = f", torch {env.get('torch')}, host {env.get('host')}" if env else ""
    return [f"{folder.name}: {kind}, device {meta.get('device', folder.name)}, last "
            f"{date or 'never'}, {len(runs)} runs{where}", f"  path {folder.resolve()}",
            _calibration_line(folder, meta)]


def _fit_lines(folder: Path) -> list[str]:
    from profiler.comm import fit_problem
    from profiler.db import read_table

    out = []
    for kind, part in read_table(folder, "comm_fit").groupby("collective"):
        rows = part.to_dict("records")
        top = {(r["group_size"], r["fabric"]): max(x["min_size_bytes"] for x in rows
               if (x["group_size"], x["fabric"]) == (r["group_size"], r["fabric"]))
               for r in rows}
        poor = [f"{r['min_size_bytes']}-{r['max_size_bytes']} B: {why}" for r in rows
                if (why := r.get("quality") or fit_problem(
                    r, r["min_size_bytes"] == top[r["group_size"], r["fabric"]]))]
        out.append(f"  {kind:<15} {len(part)} size ranges, group sizes "
                   f"{sorted(set(part['group_size']))}, worst fit "
                   f"{part['max_rel_error'].max():.1%}"
                   + (f"; POOR FIT {'; '.join(poor)}" if poor else ""))
    return out


def _table_lines(folder: Path) -> list[str]:
    from profiler.db import read_table

    out = []
    comp = read_table(folder, "compute")
    for (op, dtype), part in comp.groupby(["op", "dtype"]):
        out.append(f"  {op:<10} {dtype:<5} {len(part):4d} shapes, grids: "
                   f"{', '.join(sorted(set(part['grid'])))}")
    out += _fit_lines(folder)
    insitu = read_table(folder, "comm_insitu")
    for kind, part in insitu.groupby("collective"):
        low, high = part["overhead_s"].min() * 1e6, part["overhead_s"].max() * 1e6
        out.append(f"  {kind:<15} in situ at {len(part)} sizes: overhead {low:.0f} to "
                   f"{high:.0f} us")
    return out


def cmd_show(args: argparse.Namespace) -> int:
    roots = _show_roots(args.db)
    unique = {f.resolve(): f for r in roots for f in _device_folders(r)}  # ./profiles may
    folders = list(unique.values())  # be the user's root too
    if not folders:
        raise SpecError("--db", f"no profile DB under {args.db or ', '.join(map(str, roots))}")
    for folder in folders:
        print("\n".join(_describe(folder)))
        if "calibrates" not in json.loads((folder / "meta.json").read_text()):
            print("\n".join(_table_lines(folder)))
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


def _add_compute(psub: Any) -> None:
    c = psub.add_parser("compute", help="time layer building blocks (forward and backward)")
    c.add_argument("--model", help="profile this model's shapes (zoo name or config.json), "
                   "or every layer of a workload graph (torchvision:NAME, hf-encoder:CONFIG, "
                   "builtin:lstm-lm, FILE.py:FUNCTION); default: the device's preset grid")
    c.add_argument("--batch", type=_int_list, help="workload graph: batch sizes (default 4,8)")
    c.add_argument("--depth", type=int_at_least(1), help="workload graph: layers at this "
                   "module depth (default: leaves)")
    c.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="default cpu")
    c.add_argument("--threads", type=int_at_least(1), default=1, help="CPU threads per "
                   "process (default 1, as one rank of a cpu:RANKS cluster)")
    c.add_argument("--dtype", choices=["fp32", "bf16", "fp16"],
                   help="default: fp32 and bf16 on CPU presets, fp32 for a CPU model, bf16 GPU")
    c.add_argument("--tp", type=_int_list, help="TP degrees of a model grid (e.g. 1,2,4,8)")
    c.add_argument("--micro-batch", type=_int_list, help="micro-batch sizes (default 1,2,4)")
    c.add_argument("--seq-len", type=_int_list, help="sequence lengths (default 512,1024,2048 "
                   "up to the model's limit)")
    c.add_argument("--db", default=DEFAULT_DB, help=f"profile DB root (default {DEFAULT_DB}/)")
    c.add_argument("--force", action="store_true", help="re-measure shapes already in the DB")
    c.add_argument("--passes", type=int_at_least(1), help="passes over all shapes; "
                   "each keeps its median pass, the faster middle one for an even count "
                   "(default 1; 3 on a noisy machine)")
    c.add_argument("--busy", type=int_at_least(0), help="neighbour processes kept busy "
                   "meanwhile, as the other ranks of a cpu:RANKS run (default: one per other "
                   "CPU core; 0 on cuda)")
    c.set_defaults(func=cmd_compute)


def _add_comm(psub: Any) -> None:
    m = psub.add_parser("comm", help="time collectives with torchrun (gloo on CPU, NCCL on GPU)")
    m.add_argument("--nproc", type=int_at_least(2), default=2,
                   help="ranks on this host (default 2)")
    m.add_argument("--collectives", help="comma-separated subset (default: all six)")
    m.add_argument("--min-bytes", type=int_at_least(1), default=1 << 10, help="default 1 KiB")
    m.add_argument("--max-bytes", type=int_at_least(1), default=1 << 30, help="default 1 GiB")
    m.add_argument("--rounds", type=int_at_least(1), default=9, help="passes over all sizes; "
                   "the median pass is kept (default 9; more on a noisy machine)")
    m.add_argument("--no-insitu", action="store_true", help="skip the in-situ measurement "
                   "(each collective after a compute burst, as in a training step)")
    m.add_argument("--accept-poor-fit", action="store_true", help="store a fit worse than "
                   "25%% (or without bandwidth in its last size range), flagged in "
                   "comm_fit.csv and warned about, instead of refusing the run")
    m.add_argument("--timeout", type=positive_seconds, default=1800.0, help="seconds before "
                   "every rank is stopped (default 1800)")
    m.add_argument("--db", default=DEFAULT_DB, help=f"profile DB root (default {DEFAULT_DB}/)")
    m.set_defaults(func=cmd_comm)


def add_profile_parser(sub: Any, parser_class: type) -> None:
    p = sub.add_parser("profile", help="measure kernels and collectives into a profile DB")
    psub = p.add_subparsers(dest="profile_cmd", required=True, parser_class=parser_class)
    _add_compute(psub)
    _add_comm(psub)
    from trainsim.commands.profile_tp import add_fsdp_parser, add_tp_parser

    add_tp_parser(psub, _int_list, int_at_least, positive_seconds, DEFAULT_DB)
    add_fsdp_parser(psub, _int_list, int_at_least, positive_seconds, DEFAULT_DB)
    s = psub.add_parser("show", help="list profiles: where, which device, when, calibration")
    s.add_argument("--db", help="a DB root or one device folder (default: the shipped "
                   "profiles, ./profiles and $TRAINSIM_HOME/profiles)")
    s.set_defaults(func=cmd_show)
    t = psub.add_parser("import-trace", help="per-kernel and per-collective times of a "
                        "PyTorch profiler (Kineto) Chrome trace")
    t.add_argument("trace", help="trace JSON written by torch.profiler export_chrome_trace")
    t.add_argument("--top", type=int_at_least(1), default=25,
                   help="operations to list (default 25)")
    t.add_argument("--json", action="store_true", help="print one JSON object")
    t.set_defaults(func=cmd_import_trace)
