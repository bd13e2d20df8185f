"""``trainsim sites``: a plan across sites joined by WAN links: each way to synchronise
(:mod:`sim.strategies.sites`) against one site's throughput, over a sweep of WAN
bandwidths, and the way the optimizer picks (:mod:`optimizer.sites`)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

__all__ = ["add_sites_parser", "parse_site_sync"]

DEFAULT_SYNCS = ("flat", "hierarchical", "diloco:H=50", "diloco:H=500",
                 "streaming-diloco:H=50,fragments=5,overlap=5")


def parse_site_sync(text: str) -> Any:
    """``KIND[:k=v,...]``, e.g. ``diloco:H=500,dtype=bf16``."""
    from sim.errors import SpecError
    from sim.strategies.sites import SiteSync

    kind, _, rest = text.partition(":")
    kw: dict[str, Any] = {}
    for part in filter(None, rest.split(",")):
        key, eq, value = part.partition("=")
        if not eq or key not in ("H", "fragments", "overlap", "dtype", "fraction"):
            raise SpecError("--sync", f"{part!r}: write KEY=VALUE with KEY one of H, "
                            "fragments, overlap, dtype, fraction")
        if key == "dtype":
            kw[key] = value
        elif key == "fraction":
            try:
                kw[key] = float(value)
            except ValueError:
                raise SpecError("--sync fraction", f"must be a number, got {value!r}") from None
        else:
            try:
                kw[key] = int(value)
            except ValueError:
                raise SpecError(f"--sync {key}", f"must be an integer, got {value!r}") from None
    return SiteSync(kind, **kw)


def _gbps(text: str) -> list[float]:
    import math

    from sim.errors import SpecError

    try:
        out = [float(x) for x in text.split(",") if x]
    except ValueError:
        raise SpecError("--wan-gbps", f"a comma-separated list of Gb/s, got {text!r}") from None
    if not out or any(not (math.isfinite(x) and x > 0) for x in out):
        raise SpecError("--wan-gbps", f"every rate must be a positive number, got {text!r}")
    return out


def cmd_sites(args: argparse.Namespace) -> int:
    from optimizer.sites import choose_site_sync
    from sim import load_cluster, load_plan
    from sim.spec.zoo import load_any
    from sim.strategies.sites import at_hour, over_a_day, simulate_sites, wan_sweep
    from trainsim.common import check_out_dir

    check_out_dir(args.out, "--out")
    if args.convergence is not None:
        from sim.strategies.accuracy import loss_model

        loss_model(args.convergence, args.lr)  # checked before anything runs
    model, cluster, plan = load_any(args.model), load_cluster(args.cluster), load_plan(args.plan)
    if args.balance:
        from optimizer.sites import balance_sites
        from sim.strategies.sites import batch_split

        plan = balance_sites(model, cluster, plan)
        if not args.json:
            print(f"batch over the sites: {batch_split(cluster, plan)} micro-batches a "
                  "replica")
    syncs = [parse_site_sync(s) for s in (args.sync or DEFAULT_SYNCS)]
    rates = _gbps(args.wan_gbps) if args.wan_gbps else [None]
    rows: list[dict[str, Any]] = []
    if rates == [None] and any(w.bandwidth_by_hour for w in cluster.wan):
        for s in syncs:  # the WAN's day: tokens over the day, and its worst hour
            day = over_a_day(model, cluster, plan, s, args.fidelity)
            rows.append({"wan_Gbps": "by hour", **day,
                         **_to_loss(s, day["of_single_site"], args)})
        if args.choose:  # chosen for the day's worst hour: it holds all day
            worst = min(range(24), key=lambda h: sum(w.Gbps_at(h) for w in cluster.wan))
            ch = choose_site_sync(model, at_hour(cluster, worst), plan, args.floor,
                                  args.fidelity, args.convergence, args.lr)
            rows.append({"wan_Gbps": f"hour {worst}", "chosen": True, "met_floor": ch.met,
                         **ch.chosen.to_dict(),
                         **_to_loss(ch.chosen.sync, ch.chosen.of_single_site, args),
                         "choice_notes": ch.notes})
        rates = []
    for g in rates:
        c = cluster if g is None else wan_sweep(cluster, g)
        for s in syncs:
            r = simulate_sites(model, c, plan, s, args.fidelity)
            rows.append({"wan_Gbps": g if g is not None else "file", **r.to_dict(),
                         **_to_loss(s, r.of_single_site, args)})
        if args.choose:
            ch = choose_site_sync(model, c, plan, args.floor, args.fidelity, args.convergence,
                                  args.lr)
            rows.append({"wan_Gbps": g if g is not None else "file", "chosen": True,
                         "met_floor": ch.met, **ch.chosen.to_dict(),
                         **_to_loss(ch.chosen.sync, ch.chosen.of_single_site, args),
                         "choice_notes": ch.notes})
    if args.out is not None:
        _write(args.out, rows, cluster, plan, model)
    if args.json:
        print(json.dumps(rows, indent=2, default=str))
        return 0
    _print(rows, args, len(cluster.sites))
    if args.out is not None:
        print(f"wrote {args.out}")
    return 0


def _print(rows: list[dict[str, Any]], args: argparse.Namespace, sites: int) -> None:
    loss = args.convergence is not None
    print(f"{'WAN Gb/s':>9}  {'sync':52s} {'tokens/s':>11} {'of one site':>11}"
          + (f" {'time to loss':>12}" if loss else ""))
    for row in rows:
        mark = " <- chosen" if row.get("chosen") else ""
        t = row.get("time_to_loss_x")
        extra = "" if not loss else f" {'not measured':>12}" if t is None else f" {t:11.2f}x"
        extra += "*" if row.get("loss_notes") else ""
        print(f"{row['wan_Gbps']!s:>9}  {row['sync'][:52]:52s} {row['tokens_per_s']:11.4g} "
              f"{row['of_single_site']:11.1%}{extra}{mark}")
    if loss:
        print("time to loss: to BSP's loss, as a multiple of one site's time; DiLoCo's "
              f"inner steps over BSP's from {args.convergence} at lr {args.lr:g} (a small "
              "model's runs: see docs/guide/sites.md)")
        for note in sorted({n for row in rows for n in row.get("loss_notes") or ()}):
            print(f"* extrapolated: {note}")
        from sim.strategies.accuracy import replicas_note

        chosen = {n for row in rows for n in row.get("choice_notes") or ()}
        for note in replicas_note(args.convergence, sites):
            if note not in chosen:  # (printed with the choice's notes below)
                print(f"note: {note}")
    for note in sorted({n for row in rows for n in row.get("choice_notes") or ()}):
        print(f"choice: {note}")
    for note in dict.fromkeys(n for row in rows for n in row.get("notes") or ()):
        print(f"note: {note}")  # (the sites' warnings, how long the faster sites idle)


def _to_loss(sync: Any, of_single_site: float, args: argparse.Namespace) -> dict[str, Any]:
    """With ``--convergence``: the inner steps to the runs' loss over BSP's and the time to
    that loss as a multiple of one site's (None where no real runs measured the way)."""
    if args.convergence is None:
        return {}
    from sim.strategies.accuracy import steps_over_bsp

    notes: list[str] = []
    if sync.kind in ("flat", "hierarchical"):
        ratio: float | None = 1.0
    elif sync.kind == "diloco" and sync.dtype == "fp32":  # what the real runs sent
        pred = steps_over_bsp(sync.H, args.convergence, args.lr)
        ratio, notes = pred["ratio"], pred["extrapolated"]
    else:
        ratio = None
    return {"steps_over_bsp": ratio, "loss_notes": notes,
            "time_to_loss_x": None if ratio is None else ratio / of_single_site}


def _write(out: Path, rows: list[dict[str, Any]], cluster: Any, plan: Any, model: Any) -> None:
    import pandas as pd

    from sim.io import atomic_write_files
    from trainsim.plots.output import save_figure

    df = pd.DataFrame([{**{k: v for k, v in r.items() if k not in ("notes", "site_step_s")},
                        **{f"step_s_{n}": t for n, t in (r.get("site_step_s") or {}).items()}}
                       for r in rows])
    atomic_write_files({
        out / "inputs.json": json.dumps({"cluster": cluster.to_dict(), "plan": plan.to_dict(),
                                         "model": model.name}, indent=2) + "\n",
        out / "sites.csv": df.to_csv(index=False)})
    plain = df[~df.get("chosen", pd.Series(False, index=df.index)).fillna(False).astype(bool)]
    if plain["wan_Gbps"].map(lambda x: isinstance(x, float)).all() and len(
            plain["wan_Gbps"].unique()) > 1:
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 4.2))
        for sync, sub in plain.groupby("sync", sort=False):
            ax.plot(sub["wan_Gbps"], sub["of_single_site"], marker="o", label=sync)
        ax.set_xscale("log")
        ax.set_xlabel("WAN bandwidth per direction (Gb/s)")
        ax.set_ylabel("Throughput (fraction of one site's)")
        ax.set_title(f"{model.name} across {len(cluster.sites)} sites: {cluster.name}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        save_figure(fig, out / "sites.png")


def add_sites_parser(sub: Any, model_help: str) -> None:
    p = sub.add_parser("sites", help="a plan across sites joined by WAN links",
                       description="Throughput of a plan whose data parallelism spans sites "
                       "joined by WAN links, for each way to synchronise (flat BSP, "
                       "hierarchical BSP, DiLoCo, streaming DiLoCo), against one site "
                       "holding every node; --choose picks the most synchronous way within "
                       "--floor of it.")
    p.add_argument("--model", required=True, help=model_help)
    p.add_argument("--cluster", required=True, help="cluster TOML with [[sites]] and [[wan]] "
                   "or a region preset (regions2-dgx-h100:N, regions3-dgx-h100:N)")
    p.add_argument("--plan", required=True, help="plan JSON; its dp is split over the sites")
    p.add_argument("--sync", action="append", metavar="KIND[:k=v,...]",
                   help="flat, hierarchical, two-stage:fraction=0.1, diloco:H=500,dtype=bf16 "
                   "or streaming-diloco:H=50,fragments=5,overlap=5 (repeat; default: five)")
    p.add_argument("--wan-gbps", metavar="LIST", help="sweep every WAN link over these Gb/s "
                   "(e.g. 1,10,100,400), latencies kept")
    p.add_argument("--choose", action="store_true", help="also pick a way (optimizer.sites; "
                   "with hourly WAN rates, for the day's slowest hour; with --convergence, "
                   "the least time to BSP's loss)")
    p.add_argument("--floor", type=float, default=0.95,
                   help="--choose: least share of one site's throughput (default 0.95)")
    p.add_argument("--fidelity", default="analytic", choices=["analytic", "des"],
                   help="tier for the steps and the WAN exchanges (des: flows on the "
                   "topology; slower)")
    p.add_argument("--convergence", metavar="MODEL", help="also the time to BSP's loss: "
                   "text-cpu (DiLoCo against BSP measured on a small language model here) "
                   "or a CSV of such runs")
    p.add_argument("--lr", type=float, default=2e-3, help="--convergence: the inner "
                   "learning rate the model predicts at (default 2e-3)")
    p.add_argument("--balance", action="store_true", help="first split the global batch "
                   "over the sites by their speed (sites of different GPUs, fabrics or "
                   "sizes: optimizer.sites.balance_sites), and print the split")
    p.add_argument("--out", type=Path, help="folder: inputs, sites.csv, sites.png")
    p.add_argument("--json", action="store_true", help="print the rows as JSON")
    p.set_defaults(func=cmd_sites)
