"""MoE Hugging Face configs read by trainsim against transformers' own models and the
published totals.

Run: ``.venv/bin/python experiments/moe_configs.py``. For every config in
``experiments/data/moe_hf_configs.json`` (DeepSeek-V3, Qwen3-MoE, OLMoE, gpt-oss, DBRX,
Llama 4 text): trainsim's parameter count (``sim.layout.flops``), the parameters of the model
transformers builds from the same config on the meta device (no weights, no download), the
published total and active figures (rounded as published), and the training FLOPs per token
at 4,096 tokens by Megatron-LM's own counting (``megatron_flops_per_token``) beside
trainsim's (SC'21 convention: full attention square, router counted). DeepSeek-V3's
multi-token prediction module, which transformers does not build and the published 671B
leaves out, is left out of its totals and shown in ``mtp_params``. Writes
``experiments/results/moe_config_params.csv``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from sim.io import atomic_write_text
from sim.layout.flops import (
    active_param_count,
    megatron_flops_per_token,
    model_flops_per_token,
    mtp_params,
    param_count,
)
from sim.spec.hf_config import hf_config_to_spec

HERE = Path(__file__).resolve().parent
CONFIGS = HERE / "data" / "moe_hf_configs.json"
OUT = HERE / "results" / "moe_config_params.csv"
SEQ = 4096  # tokens per sequence for the FLOPs columns


def transformers_params(config: dict) -> int:
    """Parameters of the model transformers builds from ``config`` on the meta device."""
    import torch
    import transformers

    from profiler.graph.vision import import_torchvision

    import_torchvision()  # transformers' MoE modules import it; its ops need this torch's build

    conf = transformers.AutoConfig.for_model(**config)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(conf)
    return sum(p.numel() for p in model.parameters())


def table() -> pd.DataFrame:
    rows = []
    for entry in json.loads(CONFIGS.read_text()):
        spec = hf_config_to_spec(entry["config"], entry["name"])
        mtp = mtp_params(spec)
        ours, hf = param_count(spec) - mtp, transformers_params(entry["config"])
        ours_active = active_param_count(spec) - mtp_params(spec, active=True)
        total, active = entry["published_total"], entry["published_active"]
        rows.append({"model": entry["name"], "model_type": entry["config"]["model_type"],
                     "trainsim_params": ours, "transformers_params": hf,
                     "vs_transformers": (ours - hf) / hf, "published_total": total,
                     "vs_published": (ours - total) / total if total else None,
                     "trainsim_active": ours_active, "published_active": active,
                     "vs_published_active": (ours_active - active) / active if active else None,
                     "mtp_params": mtp,
                     "megatron_gflop_per_token": megatron_flops_per_token(spec, SEQ) / 1e9,
                     "trainsim_gflop_per_token": model_flops_per_token(spec, SEQ) / 1e9,
                     "source": entry["source"]})
    return pd.DataFrame(rows)


def main() -> None:
    df = table()
    atomic_write_text(OUT, df.to_csv(index=False, float_format="%.6g"))
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(df.drop(columns=["source"]).to_string(index=False))
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
