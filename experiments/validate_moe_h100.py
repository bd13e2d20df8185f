"""MoE training on H100 as published (NVIDIA NeMo Automodel, Megatron-LM's MoE README)
against both tiers, uncalibrated.

Run: ``.venv/bin/python experiments/validate_moe_h100.py [--des]``. Reads
``experiments/data/moe_calibration_h100.csv`` (a copy of ``../shared/data``'s, as published)
and writes ``experiments/results/moe_h100_validation.csv``: per row the plan as trainsim
writes it, the published step time (or, where only TFLOP/s is published, the step time it
implies by Megatron-LM's FLOPs counting), the predicted one per tier and the signed error.

How a row becomes a plan (assumptions, none tuned):
* ``fsdp`` is the data-parallel degree with ZeRO stage 3 (Automodel shards with FSDP2);
  without it (Megatron-LM) ``dp = gpus / (tp*pp*cp)`` with the distributed optimizer
  (ZeRO stage 1). ``ep`` splits the data-parallel ranks, as the rows do.
* ``vp`` > 1 is interleaved 1F1B; DeepSeek-V3's 61 layers over 4 x 8 virtual stages split
  two to a stage, the last three stages one (the output layer's stage lightest).
* What the published table leaves out is read from the benchmark configs the Automodel
  rows ran (NVIDIA-NeMo/Automodel ``examples/benchmark/configs/``, commits 2c236e081 and
  8d9bfb90e, 2025-10-08, the versions whose batch sizes match the table; ``CONFIGURED``):
  every Automodel row dispatches with DeepEP (its "TE + DeepEP" column, ``enable_deepep``);
  gpt-oss-120b runs EP 64 and gpt-oss-20b EP 8 (the table prints "-"); DeepSeek-V3,
  Qwen3-30B-A3B and gpt-oss-20b checkpoint every block (full recomputation), gpt-oss-120b
  none; gradients are reduced in fp32 (the MoE parallelizer's ``reduce_dtype``); under
  PP (the DeepSeek-V3 rows) FSDP keeps each layer's gathered weights from forward to
  backward (``reshard_after_forward``: ``not pp_enabled`` by default before 2c236e081, false
  in the DeepSeek-V3 config after). ``--as-published`` ignores the configs (EP as printed,
  DeepEP only where named, the least recomputation that fits in 80 GB by trainsim's memory
  model, 16-bit gradients). Megatron-LM's Mixtral row takes the least recomputation that
  fits. Flash attention, bf16, forced-balance routing (trainsim's balanced routing).
* DeepSeek-V3 without multi-token prediction (as the rows say); gpt-oss's sliding-window
  layers as full attention (trainsim warns). The Automodel rows run on the ``automodel``
  stack (``sim/data/stacks.toml``: the catalog's values but for how its code adds gpt-oss's
  expert biases).
* The implied FLOPs per token of each Automodel row (published TFLOP/s / tokens/s) is
  printed beside ``megatron_flops_per_token`` as a check of the model read.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
from collections.abc import Callable
from functools import partial
from pathlib import Path

import pandas as pd

from sim import Plan, load_cluster, simulate
from sim.errors import SpecError
from sim.io import atomic_write_text
from sim.layout.flops import megatron_flops_per_token
from sim.layout.memory import memory_report
from sim.layout.stages import even_split
from sim.spec.cluster import ClusterSpec
from sim.spec.hf_config import hf_config_to_spec
from sim.spec.model import ModelSpec
from sim.spec.plan import RECOMPUTE_MODES
from sim.spec.zoo import load_zoo

HERE = Path(__file__).resolve().parent
DATA = HERE / "data" / "moe_calibration_h100.csv"
CONFIGS = HERE / "data" / "moe_hf_configs.json"
OUT = HERE / "results" / "moe_h100_validation.csv"
# openai/gpt-oss-20b config.json (not in moe_hf_configs.json: no published total to check)
GPT_OSS_20B = {"model_type": "gpt_oss", "hidden_size": 2880, "intermediate_size": 2880,
               "num_hidden_layers": 24, "num_attention_heads": 64, "num_key_value_heads": 8,
               "head_dim": 64, "num_local_experts": 32, "num_experts_per_tok": 4,
               "vocab_size": 201088, "tie_word_embeddings": False, "sliding_window": 128,
               "max_position_embeddings": 131072}


# Automodel's benchmark configs (see the module docstring): plan fields per row
_AUTOMODEL = {"moe_dispatcher": "deepep", "grad_reduce_dtype": "fp32"}
# activation_checkpointing: each block in torch's checkpoint_wrapper (non-reentrant, torch's
# default early stop: the replay ends before DeepEP's combine)
_CHECKPOINT = {"recompute": "full", "recompute_replay": "early-stop"}
# Automodel's FSDP2 kept the weights gathered from forward to backward under PP: its
# reshard_after_forward defaulted to `not pp_enabled` before 2c236e081, and the DeepSeek-V3
# config sets it false after
_KEPT = {"reshard_after_forward": False}
CONFIGURED: dict[str, dict[str, object]] = {
    "AM-1": {**_AUTOMODEL, **_CHECKPOINT, **_KEPT},
    "AM-2": {**_AUTOMODEL, **_CHECKPOINT, **_KEPT},
    "AM-3": {**_AUTOMODEL, **_CHECKPOINT},
    "AM-4": {**_AUTOMODEL, "ep": 64, "recompute": "none"},
    "AM-5": {**_AUTOMODEL, "ep": 8, **_CHECKPOINT},
}


def models() -> dict[str, ModelSpec]:
    hf = {e["name"]: e["config"] for e in json.loads(CONFIGS.read_text())}
    dsv3 = hf_config_to_spec(hf["DeepSeek-V3"], "DeepSeek-V3")
    return {"DeepSeek-V3 (no MTP)": dataclasses.replace(dsv3, num_mtp_layers=0),
            "Qwen3-30B-A3B": hf_config_to_spec(hf["Qwen3-30B-A3B"], "Qwen3-30B-A3B"),
            "gpt-oss-120b": hf_config_to_spec(hf["gpt-oss-120b"], "gpt-oss-120b"),
            "gpt-oss-20b": hf_config_to_spec(GPT_OSS_20B, "gpt-oss-20b"),
            "Mixtral-8x7B": load_zoo("mixtral-8x7b")}


def plan_of(row: dict[str, str], model: ModelSpec, recompute: str = "none") -> Plan:
    gpus, tp, pp, cp = (int(row[k]) for k in ("gpus", "tp", "pp", "cp"))
    vp = int(row["vp"] or 1)
    fsdp = int(row["fsdp"]) if row["fsdp"] else 0
    return Plan(global_batch_size=int(row["global_batch"]), seq_len=int(row["seq_len"]),
                micro_batch_size=int(row["micro_batch"]), tp=tp, pp=pp, cp=cp,
                ep=int(row["ep"]), dp=fsdp or gpus // (tp * pp * cp), vpp=vp,
                schedule="interleaved-1f1b" if vp > 1 else "1f1b",
                zero_stage=3 if fsdp else 1, sequence_parallel=tp > 1, recompute=recompute,
                moe_dispatcher="deepep" if "DeepEP" in row["precision"] else "alltoall",
                layers_per_stage=even_split(model.num_layers, pp * vp))


def published_step(row: dict[str, str], model: ModelSpec) -> tuple[float, str]:
    """The published step time, or the one the published TFLOP/s implies (the newest
    Megatron-Core release the row names) by Megatron-LM's own FLOPs counting."""
    if row["step_s"]:
        return float(row["step_s"]), "published"
    tflops = float(row["tflops_per_gpu"].split(";")[-1].split("(")[0])
    tokens = int(row["global_batch"]) * int(row["seq_len"])
    flops = megatron_flops_per_token(model, int(row["seq_len"])) * tokens
    return flops / (int(row["gpus"]) * tflops * 1e12), f"from {tflops:g} TFLOP/s"


def least_recompute(make: Callable[[str], Plan], model: ModelSpec, cluster: ClusterSpec
                    ) -> Plan:
    """``make(recompute)`` with the least activation recomputation that fits in memory (of
    those the plan allows: all-to-all overlap refuses full), else the most it allows."""
    allowed = []
    for recompute in RECOMPUTE_MODES:
        try:
            plan = make(recompute)
        except SpecError:
            continue
        if memory_report(model, cluster, plan).fits:
            return plan
        allowed.append(plan)
    if not allowed:
        return make(RECOMPUTE_MODES[0])  # raises the plan's error
    return allowed[-1]


def row_plan(row: dict[str, str], model: ModelSpec, cluster: ClusterSpec,
             as_published: bool = False) -> Plan:
    """The row's plan: its benchmark config's fields where known, else the least
    recomputation that fits."""
    fields = {} if as_published else CONFIGURED.get(row["id"], {})
    if "recompute" in fields:
        return dataclasses.replace(plan_of(row, model), **fields)
    plan = least_recompute(partial(plan_of, row, model), model, cluster)
    return dataclasses.replace(plan, **fields)


def table(tiers: tuple[str, ...], as_published: bool = False) -> pd.DataFrame:
    specs, rows = models(), []
    with DATA.open() as f:
        for row in csv.DictReader(f):
            model = specs[row["model"]]
            cluster = load_cluster(f"dgx-h100:{int(row['gpus']) // 8}")
            if row["id"].startswith("AM-"):  # NeMo Automodel's stack (its experts' biases)
                cluster = dataclasses.replace(cluster, stack="automodel")
            plan = row_plan(row, model, cluster, as_published)
            step, basis = published_step(row, model)
            out = {"id": row["id"], "model": row["model"], "gpus": int(row["gpus"]),
                   "tp": plan.tp, "pp": plan.pp, "vpp": plan.vpp, "ep": plan.ep, "dp": plan.dp,
                   "zero": plan.zero_stage, "recompute": plan.recompute,
                   "dispatcher": plan.moe_dispatcher,
                   "grad_reduce": plan.grad_reduce_dtype or "bf16",
                   "mbs": plan.micro_batch_size,
                   "gbs": plan.global_batch_size, "published_step_s": step, "basis": basis}
            if row["tokens_per_s_per_gpu"]:
                implied = float(row["tflops_per_gpu"]) * 1e12 / float(row["tokens_per_s_per_gpu"])
                out["implied_gflop_per_token"] = implied / 1e9
            out["megatron_gflop_per_token"] = megatron_flops_per_token(
                model, plan.seq_len) / 1e9
            for tier in tiers:
                res = simulate(model, cluster, plan, fidelity=tier)
                out[f"{tier}_step_s"] = res.iteration_time_s
                out[f"{tier}_error_pct"] = 100 * (res.iteration_time_s - step) / step
                out[f"{tier}_peak_gib"] = res.peak_memory_gib
            rows.append(out)
            print(f"{row['id']}: published {step:.2f} s, " + ", ".join(
                f"{t} {out[f'{t}_step_s']:.2f} s ({out[f'{t}_error_pct']:+.1f}%)"
                for t in tiers), flush=True)
    return pd.DataFrame(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--des", action="store_true", help="also run the DES tier")
    ap.add_argument("--as-published", action="store_true",
                    help="ignore the benchmark configs: only what the published table says")
    args = ap.parse_args()
    df = table(("analytic", "des") if args.des else ("analytic",), args.as_published)
    out = OUT.with_name(OUT.stem + "_as_published.csv") if args.as_published else OUT
    atomic_write_text(out, df.to_csv(index=False, float_format="%.4g"))
    with pd.option_context("display.width", 250, "display.max_columns", 30):
        print(df.round(3).to_string(index=False))
    for tier in ("analytic", "des"):
        if f"{tier}_error_pct" in df:
            err = df[f"{tier}_error_pct"]
            print(f"{tier}: mean |error| {err.abs().mean():.1f}%, worst {err.abs().max():.1f}%")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
