"""``trainsim calibrate``: fit a few named factors of the hardware catalog to measured runs
(:mod:`optimizer.calibrate`) and write a calibration file that ``--calibration`` applies."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

__all__ = ["add_calibrate_parser"]


def cmd_calibrate(args: argparse.Namespace) -> int:
    from optimizer.calibrate import calibrate_on_one, fit, leave_one_out, load_runs
    from sim.errors import SpecError
    from sim.io import atomic_write_text
    from sim.spec.calibration import FACTORS

    if args.out is not None and args.out.is_dir():
        raise SpecError("--out", f"{str(args.out)!r} is a folder; give a .json file name")
    factors = tuple(f for f in (args.factors or ",".join(FACTORS)).split(",") if f)
    if not (args.prior >= 0):
        raise SpecError("--prior", f"must be a number >= 0, got {args.prior!r}")
    runs = load_runs(args.runs)
    kw = {"factors": factors, "prior": args.prior, "fidelity": args.fidelity}
    cal = fit(runs, **kw)  # refuses (nothing written) when a factor would leave its bounds
    report: dict[str, Any] = {"calibration": cal}
    if args.loo:
        report["leave_one_out"] = leave_one_out(runs, **kw)
    if args.on_one:
        report["calibrate_on_one"] = calibrate_on_one(runs, **kw)
    if args.out is not None:
        atomic_write_text(args.out, json.dumps(cal, indent=2) + "\n")
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(_text(report, args.out))
    return 0


def _text(report: dict[str, Any], out: Path | None) -> str:
    cal = report["calibration"]
    lines = [f"calibration of {cal['device']} on {cal['fitted_on']} run(s), prior "
             f"{cal['prior']:g}:"]
    lines += [f"  {k} = {v:.4g}" for k, v in cal["factors"].items()]
    lines.append(f"  {'run':40s} {'error before':>13s} {'after':>8s}")
    lines += [f"  {r['run'][:40]:40s} {r['error_before']:12.1%} {r['error_after']:8.1%}"
              for r in cal["fit"]]
    if "leave_one_out" in report:
        errs = [abs(r["held_out_error"]) for r in report["leave_one_out"]]
        lines.append(f"leave-one-out: mean |error| {sum(errs) / len(errs):.1%}, worst "
                     f"{max(errs):.1%}")
    if "calibrate_on_one" in report:
        for r in report["calibrate_on_one"]:
            lines.append(f"calibrated on {r['calibrated_on'][:30]}: others mean "
                         f"{r['mean_error']:.1%}, worst {r['worst_error']:.1%}")
    if out is not None:
        lines.append(f"wrote {out} (apply it: trainsim simulate ... --calibration {out})")
    return "\n".join(lines)


def add_calibrate_parser(sub: Any) -> None:
    p = sub.add_parser("calibrate", help="fit catalog factors to measured runs",
                       description="Fit a few named factors of the hardware catalog (GEMM, "
                       "attention, HBM and collective efficiencies) to measured iteration "
                       "times by least squares in relative error with a prior toward the "
                       "catalog; write a calibration file for --calibration.")
    p.add_argument("runs", type=Path, help="CSV: model, cluster, plan and "
                   "measured_iteration_s, a Megatron-LM/torchtitan log or a torch profiler "
                   "trace [, label]; paths relative to the CSV")
    p.add_argument("--out", type=Path, help="calibration file to write (.json)")
    p.add_argument("--factors", metavar="LIST", help="which to fit (default all: "
                   "gemm_eff_max,attention_eff,hbm_eff,comm_eff)")
    p.add_argument("--prior", type=float, default=0.05,
                   help="weight pulling each factor toward the catalog (default 0.05)")
    p.add_argument("--fidelity", default="analytic", choices=["analytic", "des"],
                   help="tier the runs are predicted with")
    p.add_argument("--loo", action="store_true", help="also each run held out of the fit")
    p.add_argument("--on-one", action="store_true",
                   help="also each run alone as the calibration, the others predicted")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=cmd_calibrate)
