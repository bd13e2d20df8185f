"""Narayanan et al. SC'21 (arXiv:2104.04473), Table 1, as trainsim inputs.

The rows are in ``experiments/data/megatron_table1.csv`` (copied from the project's shared
data, with each row's source). Assumptions for what the paper does not publish, applied to
every row alike:

* micro-batch size 1;
* interleaved 1F1B wherever pp > 1, with ``vpp`` = the smallest divisor > 1 of the layers
  per pipeline stage (2 where that count is even; 3 for the 530B model's 3 layers/stage);
* as the paper states: full activation recomputation, mixed precision (fp16), no sequence
  parallelism (it came later), materialised attention (no FlashAttention in 2021), data-
  parallel all-reduce after the backward pass, not overlapped with it;
* the cluster is Selene-like: DGX A100 nodes, 8 x 200 Gb/s HDR InfiniBand, fat tree.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

from sim.spec.cluster import ClusterSpec, load_cluster
from sim.spec.hf_config import hf_config_to_spec
from sim.spec.model import ModelSpec
from sim.spec.plan import Plan

__all__ = ["load_rows", "row_model", "row_plan", "row_cluster", "eq3_flops", "DATA"]

DATA = Path(__file__).resolve().parent / "data" / "megatron_table1.csv"


def load_rows(path: Path = DATA) -> list[dict[str, Any]]:
    with path.open() as f:
        return list(csv.DictReader(f))


def row_model(row: dict[str, Any]) -> ModelSpec:
    """The row's GPT model as a gpt2-style Hugging Face config."""
    cfg = {"model_type": "gpt2", "n_embd": int(row["hidden"]), "n_layer": int(row["layers"]),
           "n_head": int(row["attn_heads"]), "n_positions": int(row["seq_len"]),
           "vocab_size": int(row["vocab"])}
    return hf_config_to_spec(cfg, name=f"gpt-{row['params_B']}B")


def _vpp(layers_per_stage: int) -> int:
    return next(d for d in range(2, layers_per_stage + 1) if layers_per_stage % d == 0)


def row_plan(row: dict[str, Any], micro_batch_size: int = 1) -> Plan:
    tp, pp, dp = int(row["TP"]), int(row["PP"]), int(row["DP_derived"])
    interleaved = pp > 1
    return Plan(global_batch_size=int(row["global_batch_seqs"]), seq_len=int(row["seq_len"]),
                micro_batch_size=micro_batch_size, dp=dp, tp=tp, pp=pp,
                vpp=_vpp(int(row["layers"]) // pp) if interleaved else 1,
                schedule="interleaved-1f1b" if interleaved else "1f1b",
                recompute="full", sequence_parallel=False, dtype="fp16",
                attention="standard", overlap_grad_reduce=False)


def row_cluster(row: dict[str, Any]) -> ClusterSpec:
    return load_cluster(f"dgx-a100:{int(row['gpus']) // 8}")


def eq3_flops(row: dict[str, Any]) -> float:
    """The paper's Eq. 3: FLOPs per iteration with full recomputation."""
    b, s, n_l = int(row["global_batch_seqs"]), int(row["seq_len"]), int(row["layers"])
    h, v = int(row["hidden"]), int(row["vocab"])
    return 96 * b * s * n_l * h**2 * (1 + s / (6 * h) + v / (16 * n_l * h))
