"""What ``trainsim optimize`` prints and writes: the ranked table, the files, the plots."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from optimizer.scoring import Candidate, SearchReport
from sim.io import atomic_write_files
from sim.layout.stages import dualpipe_family
from sim.spec.plan import Plan

__all__ = ["plan_label", "summary", "format_report", "write_outputs"]


def plan_label(p: Plan) -> str:
    parts = [f"tp{p.tp}", f"pp{p.pp}", f"dp{p.dp}"]
    parts += [f"cp{p.cp}" + ("" if p.cp_comm == "p2p" else f"-{p.cp_comm}")] if p.cp > 1 else []
    parts += [f"ep{p.ep}"] if p.ep > 1 else []
    parts += [f"etp{p.etp}"] if p.etp is not None and p.etp != p.tp else []
    parts += [f"{p.moe_dispatcher}"] if p.moe_dispatcher != "alltoall" else []
    parts += [f"overlap-{p.moe_overlap}"] if p.moe_overlap != "none" else []
    modules = f"({'+'.join(p.recompute_modules)})" if p.recompute_modules else ""
    zero = f"zero{p.zero_stage}" + ("" if p.reshard_after_forward else "-keep")
    parts += [f"mb{p.micro_batch_size}", zero, f"rc-{p.recompute}{modules}"]
    parts += ["sp"] if p.sequence_parallel else []
    paired = dualpipe_family(p)  # always two stages a rank
    parts += [f"{p.schedule}" + (f"x{p.vpp}" if p.vpp > 1 and not paired else "")] \
        if p.pp > 1 else []
    parts += ["pp-inner"] if p.placement != "tp-cp-ep-dp-pp" else []
    parts += [f"{g}:{a}" for g, a in p.collectives]
    parts += ["layers:" + "/".join(map(str, p.layers_per_stage))] if p.layers_per_stage else []
    parts += ["mbs:" + "/".join(map(str, p.micro_batches_per_replica))] \
        if p.micro_batches_per_replica else []
    return " ".join(parts)


ZERO3_WARNING = ("ZeRO-3 plans (marked !) are ranked by a cost model that is not calibrated: "
                 "1.6-4.9x optimistic against SC'21 Table 2 (docs/compute/analytic.md, known "
                 "limits)")


def _row(rank: int, c: Candidate) -> dict[str, Any]:
    r = c.des
    exposed = sum(v["exposed_s"] for v in r.communication.values()) if r else float("nan")
    return {"rank": rank, "plan": plan_label(c.plan), "tier": "des" if r else "analytic",
            "iteration_s": c.best_s, "analytic_s": c.analytic_s,
            "mfu": r.mfu if r else float("nan"), "peak_memory_gib": c.peak_gib,
            "bubble": r.bubble_fraction if r else float("nan"), "exposed_comm_s": exposed,
            "origin": c.origin, "uncalibrated": c.plan.zero_stage == 3}


def summary(rep: SearchReport, top: int, constraints: Any = None,
            megatron: Candidate | None = None,
            calibrated: Candidate | None = None) -> dict[str, Any]:
    """The report as one JSON object. ``megatron``: the fastest plan Megatron-LM can run
    (searched for when the overall best is not one); ``calibrated``: the fastest plan
    without ZeRO-3 (searched for when the overall best uses it)."""
    best = rep.best
    out: dict[str, Any] = {
        "model": rep.model, "cluster": rep.cluster, "space_size": rep.space_size,
        "feasible": rep.feasible, "des_evaluated": rep.des_evaluated, "wall_s": rep.wall_s,
        "screened_out": rep.screened_out,
        "best_plan": best.plan.to_dict(), "best_iteration_s": best.best_s,
        "lower_bound_s": rep.lower_bound_s,
        "optimality_gap": best.best_s / rep.lower_bound_s - 1, "moves": rep.moves,
        "ranked": [_row(i + 1, c) for i, c in enumerate(rep.ranked[:top])], "warnings": []}
    if rep.baseline is not None:
        out["baseline"] = _row(0, rep.baseline) | {"plan_json": rep.baseline.plan.to_dict()}
        out["speedup_over_baseline"] = rep.baseline.best_s / best.best_s
    if rep.homogeneous is not None and rep.balanced is not None:
        out["heterogeneous"] = {
            "homogeneous_assumption": _row(0, rep.homogeneous)
            | {"plan_json": rep.homogeneous.plan.to_dict()},
            "balanced": _row(0, rep.balanced) | {"plan_json": rep.balanced.plan.to_dict()},
            "gain_pct": 100 * (rep.homogeneous.best_s / rep.balanced.best_s - 1)}
    out["constraints"] = constraints.describe() if constraints is not None else []
    if megatron is not None:
        out["megatron_best"] = _row(0, megatron) | {"plan_json": megatron.plan.to_dict()}
    if calibrated is not None:
        out["best_without_zero3"] = _row(0, calibrated) | {
            "plan_json": calibrated.plan.to_dict()}
    if any(r["uncalibrated"] for r in out["ranked"]):
        out["warnings"].append(ZERO3_WARNING)
    return out


def format_report(s: dict[str, Any]) -> str:
    lines = [f"{s['model']} on {s['cluster']}: {s['space_size']} plans, {s['feasible']} fit "
             f"in memory, {s['des_evaluated']} simulated with the DES ({s['wall_s']:.1f} s)",
             f"{'#':>3} {'plan':<58} {'tier':<8} {'iter s':>8} {'MFU':>6} {'GiB':>6} "
             f"{'bubble':>6} {'comm s':>7}"]
    if s.get("screened_out"):
        lines[0] += (f"; {s['screened_out']} DualPipeV plans not timed (a lower bound on "
                     "each above the ranked plans')")
    if s.get("constraints"):
        lines.insert(1, "searched within: " + ", ".join(s["constraints"]))
    rows = s["ranked"] + ([s["baseline"]] if "baseline" in s else [])
    for r in rows:
        rank = "base" if r["origin"] == "baseline" and r["rank"] == 0 else str(r["rank"])
        label = ("! " if r.get("uncalibrated") else "") + r["plan"]
        lines.append(f"{rank:>3} {label[:58]:<58} {r['tier']:<8} {r['iteration_s']:8.4g} "
                     f"{100 * r['mfu']:5.1f}% {r['peak_memory_gib']:6.1f} "
                     f"{100 * r['bubble']:5.1f}% {r['exposed_comm_s']:7.3g}")
    if "speedup_over_baseline" in s:
        lines.append(f"speed-up over the Megatron-style baseline: "
                     f"{s['speedup_over_baseline']:.2f}x")
    lines.append(f"lower bound {s['lower_bound_s']:.4g} s (all FLOPs at the best GEMM rate): "
                 f"optimality gap {100 * s['optimality_gap']:.1f}%")
    lines += [f"local move: {m}" for m in s["moves"]]
    if "megatron_best" in s:
        m = s["megatron_best"]
        lines.append(f"fastest plan Megatron-LM can run: {m['iteration_s']:.4g} s  {m['plan']}"
                     + ("" if m["plan_json"] != s["best_plan"] else " (the overall best)"))
    if "best_without_zero3" in s:
        c = s["best_without_zero3"]
        lines.append(f"fastest plan without ZeRO-3 (calibrated cost model): "
                     f"{c['iteration_s']:.4g} s  {c['plan']} (the ZeRO-3 winner is "
                     f"{100 * (c['iteration_s'] / s['best_iteration_s'] - 1):.1f}% faster if "
                     "its cost model holds)")
    if "heterogeneous" in s:
        h = s["heterogeneous"]
        even, bal = h["homogeneous_assumption"], h["balanced"]
        lines += [f"mixed cluster, homogeneous assumption (even split): {even['iteration_s']:.4g} "
                  f"s  {even['plan']}",
                  f"mixed cluster, balanced: {bal['iteration_s']:.4g} s  {bal['plan']}",
                  f"gain of balancing: {h['gain_pct']:.1f}% (both simulated on the mixed "
                  f"cluster, {bal['tier']})"]
    lines += [f"warning: {w}" for w in s["warnings"]]
    return "\n".join(lines)


def _csv(rep: SearchReport) -> str:
    import pandas as pd

    simulated = {id(c): c for c in rep.ranked}
    rows = []
    for c in rep.candidates + [c for c in rep.ranked if c.origin.startswith("move")]:
        d = simulated.get(id(c))
        rows.append({**{k: v for k, v in c.plan.to_dict().items() if k != "schema_version"},
                     "analytic_s": c.analytic_s, "peak_memory_gib": c.peak_gib,
                     "des_s": d.des.iteration_time_s if d and d.des else None,
                     "tokens_per_s": c.plan.global_batch_size * c.plan.seq_len / c.best_s,
                     "origin": c.origin})
    return pd.DataFrame(rows).to_csv(index=False, float_format="%.6g")


def write_outputs(rep: SearchReport, s: dict[str, Any], out: Path, extra: dict[str, str]
                  ) -> list[Path]:
    """best_plan.json, plans.csv, report.json and ``extra`` files (the front door adds the
    plots: :func:`trainsim.plots.search.plot_search`)."""
    files = {out / "best_plan.json": json.dumps(rep.best.plan.to_dict(), indent=2) + "\n",
             out / "report.json": json.dumps(s, indent=2) + "\n", out / "plans.csv": _csv(rep)}
    files.update({out / name: text for name, text in extra.items()})
    atomic_write_files(files)
    return list(files)
