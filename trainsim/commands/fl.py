"""``trainsim fl``: simulate a federated job on a virtual clock (:mod:`sim.federated`):
round times with the server's link shared (or FedScale's scalar model), participation, and
the files and figures of a run folder."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Any

__all__ = ["add_fl_parser"]

_OVERRIDES = ("strategy", "rounds", "clients_per_round", "overcommit", "deadline_s",
              "network", "seed", "buffer", "concurrency")


def _job(args: argparse.Namespace) -> Any:
    from sim.spec.federated import load_fl

    job = load_fl(args.job)
    changes = {k: getattr(args, k) for k in _OVERRIDES if getattr(args, k) is not None}
    if changes:
        job = dataclasses.replace(job, training=dataclasses.replace(job.training, **changes))
    return job


def _progress(total: int, quiet: bool) -> Any:
    if quiet:
        return None
    from tqdm import tqdm

    bar = tqdm(total=total, desc="fl", unit="round", delay=3.0, leave=False)

    def step(done: int) -> None:
        bar.update(done - bar.n)
        if done >= total:
            bar.close()

    return step


def cmd_fl(args: argparse.Namespace) -> int:
    from sim.federated import simulate_fl
    from trainsim.common import check_out_dir

    check_out_dir(args.out, "--out")
    job = _job(args)
    results = {job.training.network: simulate_fl(
        job, _progress(job.training.rounds, args.no_progress))}
    if args.compare_networks:
        other = "scalar" if job.training.network == "shared" else "shared"
        twin = dataclasses.replace(job, training=dataclasses.replace(job.training,
                                                                     network=other))
        results[other] = simulate_fl(twin, _progress(job.training.rounds, args.no_progress))
    summaries = {k: r.summary() for k, r in results.items()}
    if args.out is not None:
        _write(args.out, job, results)
    if args.json:
        print(json.dumps(summaries if len(results) > 1 else summaries[job.training.network],
                         indent=2))
        return 0
    for name, s in summaries.items():
        print(_line(name, s))
    if args.out is not None:
        print(f"wrote {args.out}")
    return 0


def _line(network: str, s: dict[str, Any]) -> str:
    r = s["round_s"]
    unit = "server step" if s["strategy"] == "fedbuff" else "round"
    extra = f", staleness {s['staleness_mean']:.2f}" if "staleness_mean" in s else ""
    return (f"{s['job']} {s['strategy']} ({network} network): {s['rounds']} {unit}s of "
            f"{s['clients']:,} clients in {s['total_s'] / 3600:.3g} h virtual; {unit} "
            f"median {r['median']:.4g} s (p10 {r['p10']:.4g}, p90 {r['p90']:.4g}), "
            f"{s['updates_per_round']:.4g} updates each, {s['failed_rounds']} failed{extra}; "
            f"simulated in {s['wall_s']:.2f} s")


def _write(out: Path, job: Any, results: dict[str, Any]) -> None:
    from sim.io import atomic_write_files
    from trainsim.plots.federated import participation_figure, round_time_figure

    files = {out / "inputs.json": json.dumps(job.to_dict(), indent=2, default=str) + "\n"}
    for name, res in results.items():
        files[out / f"rounds-{name}.csv"] = res.table().to_csv(index=False)
        files[out / f"summary-{name}.json"] = json.dumps(res.summary(), indent=2) + "\n"
    atomic_write_files(files)
    tr = job.training
    round_time_figure({f"{k} server link": r for k, r in results.items()},
                      out / "round_times.png", f"{job.name}: {tr.strategy} round times, "
                      f"{tr.clients_per_round} clients a round")
    first = next(iter(results.values()))
    participation_figure(first, out / "participation.png",
                         f"{job.name}: participation over time ({tr.strategy})")


def add_fl_parser(sub: Any) -> None:
    from trainsim.commands.profile import int_at_least

    p = sub.add_parser("fl", help="simulate federated training rounds on a virtual clock",
                       description="Simulate a federated job: a client population (drawn or "
                       "from a trace CSV), a server whose link the clients' uploads share "
                       "max-min fairly, FedAvg / FedProx rounds or FedBuff. Prints round "
                       "times; --out writes the rounds, a summary and figures.")
    p.add_argument("job", nargs="?", default="fl:mobile",
                   help="job TOML file or preset fl:mobile[:CLIENTS] (default fl:mobile, "
                   "10,000 clients)")
    p.add_argument("--strategy", choices=("fedavg", "fedprox", "fedbuff"),
                   help="fedavg or fedprox rounds, or fedbuff (asynchronous, buffered)")
    p.add_argument("--rounds", type=int_at_least(1), help="rounds (fedbuff: server steps)")
    p.add_argument("--clients-per-round", type=int_at_least(1),
                   help="updates a round waits for")
    p.add_argument("--overcommit", type=float, help="sample this many times the clients "
                   "a round waits for (e.g. 1.3)")
    p.add_argument("--deadline-s", type=float, help="a round ends by then (0: none)")
    p.add_argument("--network", choices=("shared", "scalar"),
                   help="shared: uploads share the server's link max-min fairly; scalar: "
                   "FedScale's contention-free model")
    p.add_argument("--buffer", type=int_at_least(1), help="fedbuff: updates a server step")
    p.add_argument("--concurrency", type=int_at_least(1),
                   help="fedbuff: clients training at once")
    p.add_argument("--seed", type=int_at_least(0), help="draws of the population, the "
                   "samples and the dropouts")
    p.add_argument("--compare-networks", action="store_true",
                   help="also run the other network model and show both")
    p.add_argument("--out", type=Path, help="run folder: inputs, rounds CSV, summary, figures")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_fl)
