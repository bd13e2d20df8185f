"""torchtitan's published H100 runs: uncalibrated with their stack, then calibrated on one run
of a family and the others predicted (issue 19).

Run: ``.venv/bin/python experiments/calibrate_torchtitan.py`` (about a minute). Writes
``experiments/results/calibrate_torchtitan.csv`` (every run) and
``experiments/results/calibrate_torchtitan_loo.csv`` (each run as the calibration) and
``experiments/results/calibrate_torchtitan_joint.csv`` (the compile family calibrated on
all its runs at once).

Data: every row of ``experiments/data/torchtitan_h100_benchmarks.csv`` (a copy of the shared
data) whose batch is published (pytorch/torchtitan
benchmarks/llama3_h100_202412_torchtitan.md and asyncTP_llama3_h100_2025-06_torchtitan.md),
on Meta's Grand Teton (``grand-teton``: H100 96 GB HBM2e at 2.4 TB/s and a 500 W power
limit, 400 Gb/s RDMA a GPU). Sequence 8,192 tokens (torchtitan's Llama 3 default; the tables
do not restate it). Plans as torchtitan runs them: FSDP as ZeRO-3 over the data-parallel
ranks; TP with sequence parallelism; the local batch as one micro-batch without a pipeline.
The stack is the row's: ``torchtitan-eager`` or ``torchtitan-compile``
(``sim/data/stacks.toml``), whose fitted value comes from the 8-GPU 8B rows' Float8/BF16
ratio (``experiments/fit_stacks.py``).

Assumed where the benchmark does not say (marked in the table):
* 405B, 126 layers on PP 8: the layers as even as they go (1F1B: 16 on the first six
  stages, 15 on the last two; interleaved with 2 stages a rank: 8 on the first fourteen, 7
  on the last two); 8 micro-batches of 4 sequences (torchtitan's default then:
  ``pipeline_parallel_microbatches`` unset gives the PP degree).
* Async TP (the "+ AsyncTP" and "async TP" rows, all 405B rows): ``tp_overlap``, each
  all-gather and reduce-scatter fused with its GEMM, the stack's ``tp_overlap_eff`` of each
  GEMM hiding it (``torchtitan-compile``'s fitted by ``experiments/fit_stacks.py`` to the
  2025-06 70B BF16 pair, async over vanilla TP; the other pairs held out). Until 2026-12-06
  they were predicted as vanilla TP.
* 405B: FSDP keeps each layer's gathered weights from forward to backward
  (``reshard_after_forward = false``: torchtitan's ``fsdp_reshard_after_forward = "default"``
  under PP, "to avoid per-microbatch all-gathers").
* The 2025-06 70B rows: the 2024-12 70B configuration (local batch 16, full AC), BF16 +
  compile.

Families share model family, stack and cluster: ``torchtitan-eager`` (the two 8B eager
rows) and ``torchtitan-compile`` (every compile row, 8B to 405B, BF16 and Float8); and, as
in the earlier study, the narrower families of the 8B FSDP rows, one precision mode each at
8 and 128 GPUs. For each run of a family: a calibration fitted to it alone (the default
factors and prior, as ``trainsim calibrate --on-one``), and the others' errors under it.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from optimizer.calibrate import Run, _errors, fit
from sim import load_cluster, simulate
from sim.errors import SpecError
from sim.io import atomic_write_text
from sim.spec.plan import Plan
from sim.spec.zoo import load_any

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "experiments" / "data" / "torchtitan_h100_benchmarks.csv"
RESULTS = ROOT / "experiments" / "results"
SEQ = 8192
MODELS = {"8B": "llama3-8b", "70B": "llama3-70b", "405B": "llama3-405b"}


def _stack(mode: str) -> tuple[str, str]:
    """(stack, dtype) of a published precision mode."""
    dtype = "fp8" if mode.startswith("Float8") else "bf16"
    return ("torchtitan-eager" if "eager" in mode else "torchtitan-compile"), dtype


def _plan(row: pd.Series, dtype: str) -> tuple[Plan, str]:
    """The run's plan and what was assumed for it."""
    gpus, par = int(row["gpus"]), str(row["parallelism"])
    ac = str(row["activation_ckpt"])
    local, recompute = int(row["local_batch"]), (
        "selective" if "selective" in ac or "SAC" in ac else "full")
    tp = 8 if "TP8" in par else 1
    pp = 8 if "PP8" in par else 1
    dp = gpus // tp // pp
    common = {"global_batch_size": local * dp, "seq_len": SEQ, "dp": dp, "tp": tp,
              "zero_stage": 3, "recompute": recompute, "dtype": dtype,
              "sequence_parallel": tp > 1}
    mode = f"{par} {row['precision_mode']}".lower()
    common["tp_overlap"] = "async" in mode
    notes: list[str] = []
    if pp == 1:
        return Plan(**common, micro_batch_size=local), "; ".join(notes)
    vpp = 2 if "interleaved" in par else 1
    stages = pp * vpp
    base, extra = divmod(126, stages)
    layers = (base + 1,) * extra + (base,) * (stages - extra)
    plan = Plan(**common, pp=pp, vpp=vpp, micro_batch_size=local // pp,
                schedule="interleaved-1f1b" if vpp > 1 else "1f1b", layers_per_stage=layers,
                reshard_after_forward=False)  # torchtitan's default under PP
    notes.append(f"{pp} micro-batches of {local // pp}, layers {layers[0]}/"
                 f"{layers[-1]} a stage")
    return plan, "; ".join(notes)


def runs() -> tuple[list[Run], list[str], list[str]]:
    """Every run with a published batch, its family and its assumptions."""
    df = pd.read_csv(DATA)
    out, families, notes = [], [], []
    for _, row in df.iterrows():
        if not str(row["local_batch"]).isdigit() or not str(row["gpus"]).isdigit():
            continue  # batch not published
        size = str(row["model"]).split()[2]  # Llama 3.1 8B, Llama 3 70B (2025-06)
        stack, dtype = _stack(str(row["precision_mode"]))
        plan, note = _plan(row, dtype)
        gpus = int(row["gpus"])
        cluster = dataclasses.replace(load_cluster(f"grand-teton:{gpus // 8}"), stack=stack)
        # a step's tokens a GPU (a data-parallel rank's batch over its tp x pp GPUs) over
        # the published tokens a second a GPU
        measured = int(row["local_batch"]) * SEQ / (plan.tp * plan.pp) \
            / float(row["tokens_per_s_per_gpu"])
        label = f"{size} {row['parallelism']} {gpus} GPUs {row['precision_mode']}"
        out.append(Run(load_any(MODELS[size]), cluster, plan, measured, label))
        families.append(stack)
        notes.append(note)
    return out, families, notes


def _on_one(rs: list[Run], families: list[str], grouping: str) -> list[dict[str, object]]:
    """Each run of a family (of two or more) as the calibration, the others predicted."""
    out: list[dict[str, object]] = []
    for fam in sorted(set(families) - {""}):
        members = [r for r, f in zip(rs, families, strict=True) if f == fam]
        for i, run in enumerate(members if len(members) > 1 else []):
            row = {"grouping": grouping, "family": fam, "calibrated_on": run.label}
            try:
                cal = fit([run])
            except SpecError as e:
                out.append({**row, "refused": str(e).split(":")[0]})
                continue
            errs = np.abs(_errors(members[:i] + members[i + 1:], cal, "analytic"))
            out.append({**row, "others_mean_pct": 100 * errs.mean(),
                        "others_worst_pct": 100 * errs.max(), "refused": "",
                        **{f"factor_{k}": v for k, v in cal["factors"].items()}})
    return out


def main() -> int:
    rs, families, notes = runs()
    table = pd.DataFrame({"run": [r.label for r in rs], "family": families,
                          "measured_s": [r.measured_s for r in rs],
                          "predicted_s": [simulate(r.model, r.cluster, r.plan).iteration_time_s
                                          for r in rs], "assumed": notes})
    table["error_pct"] = 100 * (table["predicted_s"] / table["measured_s"] - 1)
    # the 8B FSDP rows also in the narrower families of the earlier study: one precision mode
    narrow = ["8B " + r.label.split('GPUs ')[1].replace('torch.compile', 'compile')
              if r.label.startswith("8B FSDP ")
              else "" for r in rs]
    loo_df = pd.DataFrame(_on_one(rs, families, "stack") + _on_one(rs, narrow, "8B mode"))
    atomic_write_text(RESULTS / "calibrate_torchtitan.csv",
                      table.to_csv(index=False, float_format="%.4g"))
    atomic_write_text(RESULTS / "calibrate_torchtitan_loo.csv",
                      loo_df.to_csv(index=False, float_format="%.4g"))
    print(table.drop(columns="assumed").to_string(index=False, float_format="%.3g"))
    for fam, part in table.groupby("family"):
        print(f"{fam}: uncalibrated mean |error| {part['error_pct'].abs().mean():.1f}%, "
              f"worst {part['error_pct'].abs().max():.1f}%")
    print(loo_df[["grouping", "family", "calibrated_on", "others_mean_pct",
                  "others_worst_pct", "refused"]].to_string(index=False, float_format="%.1f"))
    for (grouping, fam), part in loo_df.groupby(["grouping", "family"], sort=False):
        ok = part[part["refused"] == ""]
        print(f"{grouping} family {fam}, calibrated on one run: others' mean |error| "
              f"{ok['others_mean_pct'].mean():.1f}% over {len(ok)} calibrations (worst "
              f"{ok['others_worst_pct'].max():.1f}%); {len(part) - len(ok)} refused")
    narrow_ok = loo_df[(loo_df["grouping"] == "8B mode") & (loo_df["refused"] == "")]
    print(f"the 8B families together: {narrow_ok['others_mean_pct'].mean():.1f}% mean")
    _joint([r for r, f in zip(rs, families, strict=True) if f == "torchtitan-compile"])
    return 0


def _joint(members: list[Run]) -> None:
    """The bound on any calibration of the family: one fitted to all its runs at once (in
    sample). What that leaves is a difference between the runs none of the factors moves."""
    cal = fit(members)
    errs = 100 * _errors(members, cal, "analytic")
    atomic_write_text(RESULTS / "calibrate_torchtitan_joint.csv", pd.DataFrame(
        {"run": [r.label for r in members], "error_pct": errs,
         **{f"factor_{k}": v for k, v in cal["factors"].items()}}).to_csv(
        index=False, float_format="%.4g"))
    factors = ", ".join(f"{k} {v:.3g}" for k, v in cal["factors"].items())
    print(f"torchtitan-compile calibrated on all its {len(members)} runs at once (in sample; "
          f"{factors}): mean |error| {np.abs(errs).mean():.1f}%, worst {np.abs(errs).max():.1f}%")
    for run, e in zip(members, errs, strict=True):
        print(f"  {e:+6.1f}%  {run.label}")


if __name__ == "__main__":
    sys.exit(main())
