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

    changes = {k: getattr(args, k) for k in _OVERRIDES if getattr(args, k) is not None}
    return load_fl(args.job, changes)  # the overrides checked with the job, not after


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


def _variants(job: Any, args: argparse.Namespace) -> dict[str, Any]:
    """The job, and its twins for --compare-networks / --compare-strategies, by label."""
    tr = job.training
    jobs = {f"{tr.strategy}, {tr.network}": job}
    if args.compare_networks:
        other = "scalar" if tr.network == "shared" else "shared"
        jobs[f"{tr.strategy}, {other}"] = dataclasses.replace(
            job, training=dataclasses.replace(tr, network=other))
    if args.compare_strategies:
        for s in ("fedavg", "fedprox", "fedbuff"):
            if s != tr.strategy:
                jobs[f"{s}, {tr.network}"] = dataclasses.replace(
                    job, training=dataclasses.replace(tr, strategy=s))
    return jobs


def _targets(args: argparse.Namespace, results: dict[str, Any]) -> dict[str, Any]:
    """Time to --target for each result that has a measured model (else the reason)."""
    import math

    from sim.errors import SpecError
    from sim.federated.accuracy import BUNDLED_FL, fit_fl, load_fl_observations, time_to_target

    if args.target is None:
        return {}
    if not (isinstance(args.target, float) and 0 < args.target < 1 and math.isfinite(
            args.target)):
        raise SpecError("--target", f"must be an accuracy in (0, 1), got {args.target!r}")
    path = args.convergence or BUNDLED_FL
    model = fit_fl(load_fl_observations(path), str(path))
    if args.target not in model.targets:
        raise SpecError("--target", f"the measured runs give targets "
                        f"{', '.join(f'{t:g}' for t in model.targets)}, got {args.target:g}")
    out: dict[str, Any] = {}
    for label, res in results.items():
        try:
            out[label] = {"at": time_to_target(res, model, args.target), "curve": [
                time_to_target(res, model, t) for t in model.targets
                if model.has(res.job.training.strategy, t)]}
        except SpecError as exc:
            out[label] = {"error": exc.rule}
    return out


def cmd_fl(args: argparse.Namespace) -> int:
    from sim.federated import simulate_fl
    from trainsim.common import check_out_dir

    check_out_dir(args.out, "--out")
    job = _job(args)
    jobs = _variants(job, args)
    results = {k: simulate_fl(j, _progress(j.training.rounds, args.no_progress))
               for k, j in jobs.items()}
    tta = _targets(args, results)
    summaries = {k: r.summary() | ({"to_target": tta[k].get("at", tta[k].get("error"))}
                                   if k in tta else {}) for k, r in results.items()}
    if args.out is not None:
        _write(args.out, job, results, tta, args.target)
    if args.json:
        print(json.dumps(summaries if len(results) > 1 else next(iter(summaries.values())),
                         indent=2, default=str))
        return 0
    for name, s in summaries.items():
        print(_line(name, s))
        if name in tta:
            print("  " + _tta_line(tta[name], args.target))
    if args.out is not None:
        print(f"wrote {args.out}")
    return 0


def _tta_line(t: dict[str, Any], target: float) -> str:
    if "error" in t:
        return f"to {target:g}: not predicted ({t['error']})"
    a = t["at"]
    lo, hi = a["time_band_s"]
    notes = "; ".join(a["notes"])
    return (f"to {target:g} test accuracy: {a['rounds']:.0f} rounds, {a['time_s'] / 3600:.3g} h "
            f"({lo / 3600:.3g}-{hi / 3600:.3g} h)" + (f" [{notes}]" if notes else ""))


def _line(label: str, s: dict[str, Any]) -> str:
    r = s["round_s"]
    unit = "server step" if s["strategy"] == "fedbuff" else "round"
    extra = f", staleness {s['staleness_mean']:.2f}" if "staleness_mean" in s else ""
    return (f"{s['job']} ({label} network): {s['rounds']} {unit}s of "
            f"{s['clients']:,} clients in {s['total_s'] / 3600:.3g} h virtual; {unit} "
            f"median {r['median']:.4g} s (p10 {r['p10']:.4g}, p90 {r['p90']:.4g}), "
            f"{s['updates_per_round']:.4g} updates each, {s['failed_rounds']} failed{extra}; "
            f"simulated in {s['wall_s']:.2f} s")


def _write(out: Path, job: Any, results: dict[str, Any], tta: dict[str, Any],
           target: float | None) -> None:
    import numpy as np

    from sim.io import atomic_write_files
    from trainsim.plots.federated import participation_figure, round_time_figure, tta_figure

    files = {out / "inputs.json": json.dumps(job.to_dict(), indent=2, default=str) + "\n"}
    for name, res in results.items():
        slug = name.replace(", ", "-")
        files[out / f"rounds-{slug}.csv"] = res.table().to_csv(index=False)
        files[out / f"summary-{slug}.json"] = json.dumps(res.summary(), indent=2) + "\n"
    atomic_write_files(files)
    tr = job.training
    round_time_figure(results, out / "round_times.png", f"{job.name}: round times, "
                      f"{tr.clients_per_round} clients a round")
    first = next(iter(results.values()))
    participation_figure(first, out / "participation.png",
                         f"{job.name}: participation over time ({tr.strategy})")
    curves = {k: (np.array([p["time_s"] / 3600 for p in v["curve"]]),
                  np.array([p["target"] for p in v["curve"]]))
              for k, v in tta.items() if v.get("curve")}
    if curves and target is not None:
        tta_figure(curves, target, out / "time_to_accuracy.png",
                   f"{job.name}: when each accuracy is reached (measured-run model)")


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
    p.add_argument("--compare-strategies", action="store_true",
                   help="also run the other strategies (fedavg, fedprox, fedbuff) on the job")
    p.add_argument("--target", type=float, metavar="ACCURACY",
                   help="test accuracy (one the measured runs give, e.g. 0.9): rounds and "
                   "time to it from the fitted rounds-to-accuracy model")
    p.add_argument("--convergence", type=Path, metavar="CSV",
                   help="real runs to fit instead of the bundled fl-digits-cpu ones")
    p.add_argument("--out", type=Path, help="run folder: inputs, rounds CSV, summary, figures")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_fl)
