"""``--set KEY=VALUE`` and ``--scenario FILE.toml`` on ``trainsim simulate`` and ``optimize``.

The options are added to the existing subcommands; without them a command runs unchanged.
With one scenario the command runs on the edited inputs and prints what it always prints;
with several (a file with ``[scenario.NAME]`` tables) it runs the base and every scenario and
prints one comparison table (or one JSON object).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["add_scenario_options"]

_SET_HELP = ("edit the cluster (nodes, gpu, gpus_per_node, intra_node.KEY, inter_node.KEY) "
             "or, for simulate, the plan (tp, dp, micro_batch_size, ...); repeatable, e.g. "
             "--set inter_node.nic_Gbps=800 --set gpu=h200-sxm-141gb")
_FILE_HELP = ("TOML file of the same edits, or of several [scenario.NAME] tables: each "
              "scenario is run and compared with the base")


def add_scenario_options(sub: Any) -> None:
    """Add ``--set``/``--scenario`` to the ``simulate`` and ``optimize`` parsers."""
    for name, runner in (("simulate", _simulate), ("optimize", _optimize)):
        parser = sub.choices[name]
        parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                            dest="set_edits", help=_SET_HELP)
        parser.add_argument("--scenario", metavar="FILE", help=_FILE_HELP)
        parser.set_defaults(func=_wrap(parser.get_default("func"), runner))


def _wrap(plain: Callable[[argparse.Namespace], int],
          runner: Callable[[argparse.Namespace, list[Any]], int]
          ) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        if not args.set_edits and not args.scenario:
            return plain(args)
        from sim.spec.scenario import scenarios_from_args

        return runner(args, scenarios_from_args(args.set_edits, args.scenario))
    return run


def _base_cluster(args: argparse.Namespace) -> Any:
    from sim import load_cluster
    from trainsim.commands.profile import with_profile_options

    return with_profile_options(load_cluster(args.cluster), args)


def _scenario_inputs(args: argparse.Namespace, s: Any, base: Any, plan: Any) -> tuple[Any, Any]:
    from sim.spec.scenario import apply_cluster_edits, apply_plan_edits

    name = f"{base.name}[{s.name}]" if s.edits else base.name
    return apply_cluster_edits(base, s.cluster_edits, name), apply_plan_edits(plan, s.plan_edits)


# simulate -----------------------------------------------------------------------------------
def _simulate(args: argparse.Namespace, scenarios: list[Any]) -> int:
    from sim import SpecError, load_model, load_plan
    from sim.spec.faults import with_edits
    from sim.spec.scenario import Scenario
    from trainsim.commands.faults import faults_of

    if args.fidelity != "des" and (args.trace or args.no_reduce):
        raise SpecError("--trace/--no-reduce", "need --fidelity des")
    if args.trace and len(scenarios) > 1:
        raise SpecError("--trace", "writes one scenario's trace; the file has "
                        f"{len(scenarios)} scenarios")
    model, base, plan = load_model(args.model), _base_cluster(args), load_plan(args.plan)
    faults = [with_edits(faults_of(args), s.fault_edits) for s in scenarios]  # bad ones fail
    inputs = [_scenario_inputs(args, s, base, plan) for s in scenarios]  # all valid first
    if len(scenarios) == 1:
        return _simulate_one(args, model, *inputs[0], faults[0])
    runs = [("base", Scenario("base"), _try_simulate(args, model, base, plan, faults_of(args)))]
    runs += [(s.name, s, _try_simulate(args, model, c, p, f))
             for s, (c, p), f in zip(scenarios, inputs, faults, strict=True)]
    if args.out:
        _write_scenario_runs(Path(args.out), model, runs, [(base, plan), *inputs],
                             [faults_of(args), *faults])
    print(json.dumps(_runs_json(runs), indent=2) if args.json else _runs_table(runs))
    return 0


def _simulate_one(args: argparse.Namespace, model: Any, cluster: Any, plan: Any,
                  faults: Any = None) -> int:
    from sim import simulate
    from trainsim.common import write_run
    from trainsim.report import format_result

    result = simulate(model, cluster, plan, fidelity=args.fidelity, reduce=not args.no_reduce,
                      trace=args.trace, faults=faults)
    if args.out:
        write_run(Path(args.out), result, model, cluster, plan, faults)
    print(json.dumps(result.to_dict(), indent=2) if args.json
          else format_result(result, plan, faults))
    return 0


def _try_simulate(args: argparse.Namespace, model: Any, cluster: Any, plan: Any,
                  faults: Any = None) -> Any:
    """The result, or the one-line error when the plan does not suit this scenario."""
    from sim import SpecError, simulate

    try:
        return simulate(model, cluster, plan, fidelity=args.fidelity, reduce=not args.no_reduce,
                        faults=faults)
    except SpecError as exc:
        return str(exc)


def _runs_json(runs: list[tuple[str, Any, Any]]) -> dict[str, Any]:
    return {"scenarios": [{"name": name, "edits": dict(s.edits)}
                          | ({"error": r} if isinstance(r, str) else {"result": r.to_dict()})
                          for name, s, r in runs]}


def _runs_table(runs: list[tuple[str, Any, Any]]) -> str:
    base = runs[0][2]
    lines = [f"{'scenario':<24} {'iter s':>9} {'vs base':>8} {'tokens/s':>12} {'MFU':>6} "
             f"{'GiB':>6}  edits"]
    for name, s, r in runs:
        edits = ", ".join(f"{k}={v}" for k, v in s.edits) or "-"
        if isinstance(r, str):
            lines.append(f"{name[:24]:<24} {'-':>9} {'-':>8} {'-':>12} {'-':>6} {'-':>6}  "
                         f"{edits}  (not run: {r})")
            continue
        vs = f"{r.iteration_time_s / base.iteration_time_s:7.3f}x" \
            if not isinstance(base, str) else "-"
        lines.append(f"{name[:24]:<24} {r.iteration_time_s:9.4g} {vs:>8} "
                     f"{r.tokens_per_s:12,.0f} {100 * r.mfu:5.1f}% {r.peak_memory_gib:6.1f}"
                     f"{'' if r.fits_in_memory else '!'}  {edits}"
                     + (f"  (cannot complete: {r.simulation['cannot_complete']})"
                        if "cannot_complete" in r.simulation else ""))
    return "\n".join(lines)


def _write_scenario_runs(out: Path, model: Any, runs: list[tuple[str, Any, Any]],
                         inputs: list[tuple[Any, Any]], faults: list[Any]) -> None:
    """A folder per scenario that ran; ``inputs`` and ``faults`` line up with ``runs``."""
    from sim.io import atomic_write_files
    from trainsim.report import format_result

    files = {out / "scenarios.json": json.dumps(_runs_json(runs), indent=2) + "\n",
             out / "summary.txt": _runs_table(runs) + "\n"}
    for (name, _, r), (cluster, p), f in zip(runs, inputs, faults, strict=True):
        if isinstance(r, str):
            continue
        echoed = {"model": model.to_dict(), "cluster": cluster.to_dict(), "plan": p.to_dict()}
        files[out / name / "inputs.json"] = json.dumps(echoed, indent=2) + "\n"
        files[out / name / "result.json"] = json.dumps(r.to_dict(), indent=2) + "\n"
        files[out / name / "summary.txt"] = format_result(r, p, f) + "\n"
    atomic_write_files(files)


# optimize -----------------------------------------------------------------------------------
def _optimize(args: argparse.Namespace, scenarios: list[Any]) -> int:
    from sim import SpecError
    from trainsim.commands.optimize import run_optimize

    for s in scenarios:
        if s.plan_edits:
            key = s.plan_edits[0][0]
            raise SpecError(key, "is a plan field: optimize chooses the plan (edit the "
                            "cluster, or use simulate)")
    base = _base_cluster(args)
    clusters = [_scenario_inputs(args, s, base, None)[0] for s in scenarios]
    if len(scenarios) == 1:
        return run_optimize(args.model, clusters[0], args.global_batch_size, args.seq_len,
                            args.top, Path(args.out) if args.out else None, args.json,
                            args.workers)
    return _optimize_many(args, [("base", base)] + [
        (s.name, c) for s, c in zip(scenarios, clusters, strict=True)])


def _optimize_many(args: argparse.Namespace, named: list[tuple[str, Any]]) -> int:
    from optimizer.report import summary, write_outputs
    from optimizer.search import optimize
    from sim import load_model
    from sim.errors import NoFeasiblePlan
    from trainsim.plots.search import plot_search

    model, rows = load_model(args.model), []
    for name, cluster in named:
        try:
            rep = optimize(model, cluster, args.global_batch_size, args.seq_len, top_k=args.top,
                           workers=args.workers, progress=not args.json)
        except NoFeasiblePlan as exc:
            rows.append({"name": name, "cluster": cluster.to_dict(), "no_feasible_plan": str(exc)})
            continue
        s = summary(rep, args.top)
        rows.append({"name": name, "cluster": cluster.to_dict(), "summary": s})
        if args.out:
            write_outputs(rep, s, Path(args.out) / name, {})
            plot_search(rep, Path(args.out) / name)
    print(json.dumps({"scenarios": rows}, indent=2) if args.json else _optimize_table(rows))
    return 0


def _optimize_table(rows: list[dict[str, Any]]) -> str:
    from optimizer.report import plan_label
    from sim.spec.plan import Plan

    base = rows[0].get("summary", {}).get("best_iteration_s")
    lines = [f"{'scenario':<24} {'best s':>9} {'vs base':>8}  best plan"]
    for r in rows:
        if "summary" not in r:
            lines.append(f"{r['name'][:24]:<24} {'-':>9} {'-':>8}  no feasible plan: "
                         f"{r['no_feasible_plan']}")
            continue
        t = r["summary"]["best_iteration_s"]
        vs = f"{t / base:7.3f}x" if base else "-"
        label = plan_label(Plan.from_dict(r["summary"]["best_plan"]))
        lines.append(f"{r['name'][:24]:<24} {t:9.4g} {vs:>8}  {label}")
    return "\n".join(lines)
