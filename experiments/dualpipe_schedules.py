"""DualPipeV (DeepSeek's DualPipe cut in half) and DualPipe (both directions): their programs
against DeepSeek's published bubble and activation figures, and what the tiers make of
them on two models.

Part 1 (``dualpipe_bubble.csv``): every rank's program (``sim/layout/dualpipe.py``) run pass
by pass with uniform stages (F, B a full backward, W its weight part, F&B = F + B: no
overlap inside a pair), for pp 2-16 ranks and m = 2 pp .. 8 pp micro-batches: DualPipeV
(2 pp stages in a V) and DualPipe (pp stages, each held twice). The bubble (time past a
rank's work) beside DeepSeek's published ``(PP/2 - 1)(F&B + B - 3W)`` (PP the stages) and
the 1F1B family's over the same stages, ``(pp - 1)(F + B)`` (interleaved 1F1B, vpp 2, for
DualPipeV's; 1F1B for DualPipe's); the most chunk activations a rank holds beside the
published ``PP + 1``.

Part 2 (``dualpipe_models.csv``): both tiers on Llama-3 70B (64 H100, TP 8, PP 8)
and DeepSeek-V3 (2,048 H100, PP 16, EP 64; 32 virtual stages of 2 layers, the first 1, the
last none but the MTP module and the loss; DualPipe and 1F1B on 16 stages of 4, the first
3, the last 2 and the MTP module) under 1F1B, interleaved 1F1B (vpp 2), DualPipeV and
DualPipe, on DeepSeek-V3 with and without the all-to-all overlap: iteration time, bubble,
peak memory. Nothing is fitted.

    python experiments/dualpipe_schedules.py
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from sim import Plan, load_cluster, load_model, simulate
from sim.layout.dualpipe import peak_activations
from sim.layout.dualpipe_time import makespan, published_bubble, uniform

RESULTS = Path(__file__).resolve().parent / "results"
PROPORTIONS = [(1.0, 2.0, 1.0), (1.0, 2.0, 0.5), (1.0, 3.0, 1.0), (1.0, 1.5, 0.7)]


def bubble_table() -> pd.DataFrame:
    rows = []
    for mirrored in (False, True):
        for pp in (2, 4, 8, 16):
            for m in (2 * pp, 4 * pp, 8 * pp):
                for f, b, w in PROPORTIONS:
                    rows.append(_bubble_row(pp, m, f, b, w, mirrored))
    return pd.DataFrame(rows)


def _bubble_row(pp: int, m: int, f: float, b: float, w: float, mirrored: bool) -> dict:
    """One case: a rank's work is 2m chunk passes in a V, m (half of each chain) under
    DualPipe; the 1F1B family's bubble over the same stages."""
    t, _ = makespan(pp, m, uniform(f, b, w), mirrored=mirrored)
    stages = pp if mirrored else 2 * pp
    return {"schedule": "dualpipe" if mirrored else "dualpipev", "pp_ranks": pp,
            "stages": stages, "microbatches": m, "F": f, "B": b, "W": w,
            "bubble_programs": round(t - (1 if mirrored else 2) * m * (f + b), 6),
            "bubble_published": published_bubble(pp, f, b, w, f + b, mirrored),
            "bubble_1f1b_family": (pp - 1) * (f + b),
            "peak_chunk_activations": max(peak_activations(pp, m, r, mirrored)
                                          for r in range(pp)),
            "published_activations": stages + 1}


DSV3_V = [1] + [2] * 30 + [0]  # 32 virtual stages, rank 0: stage 0 and the MTP + loss
DSV3_16 = [3] + [4] * 14 + [2]
CASES = [
    ("Llama-3 70B, 64 H100, TP8 PP8 DP1", "llama3-70b", "dgx-h100:8",
     dict(global_batch_size=64, seq_len=4096, tp=8, pp=8, sequence_parallel=True), None),
    ("DeepSeek-V3, 2,048 H100, PP16 EP64 DP128", "deepseek-v3", "dgx-h100:256",
     dict(global_batch_size=4096, seq_len=4096, dp=128, pp=16, ep=64, zero_stage=1),
     (DSV3_16, DSV3_V)),
    ("DeepSeek-V3, 2,048 H100, PP16 EP64 DP128, a2a overlap", "deepseek-v3", "dgx-h100:256",
     dict(global_batch_size=4096, seq_len=4096, dp=128, pp=16, ep=64, zero_stage=1,
          moe_overlap="a2a"), (DSV3_16, DSV3_V)),
]


def _plans(fields: dict, layers: tuple[list[int], list[int]] | None) -> dict[str, Plan]:
    one, two = (None, None) if layers is None else (tuple(layers[0]), tuple(layers[1]))
    plans = {} if fields.get("moe_overlap") == "a2a" else {  # Megatron-LM's rule: not 1F1B
        "1f1b": Plan(**fields, micro_batch_size=1, layers_per_stage=one)}
    plans["interleaved-1f1b x2"] = Plan(**fields, micro_batch_size=1, vpp=2,
                                        schedule="interleaved-1f1b", layers_per_stage=two)
    plans["dualpipev"] = Plan(**fields, micro_batch_size=1, vpp=2, schedule="dualpipev",
                              layers_per_stage=two)
    plans["dualpipe"] = Plan(**fields, micro_batch_size=1, vpp=2, schedule="dualpipe",
                             layers_per_stage=one)
    return plans


def model_table() -> pd.DataFrame:
    rows = []
    for label, model, cluster, fields, layers in CASES:
        m, c = load_model(model), load_cluster(cluster)
        for name, plan in _plans(fields, layers).items():
            for fid in ("analytic", "des"):
                r = simulate(m, c, plan, fidelity=fid)
                rows.append({"case": label, "schedule": name, "fidelity": fid,
                             "microbatches": plan.num_microbatches,
                             "iteration_s": round(r.iteration_time_s, 3),
                             "bubble_s": round(r.breakdown["bubble"], 3),
                             "bubble_fraction": round(r.bubble_fraction, 4),
                             "peak_memory_gib": round(r.peak_memory_gib, 1),
                             "mfu": round(r.mfu, 4)})
                print(f"{label}: {name} ({fid}) {rows[-1]['iteration_s']} s", flush=True)
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    bubbles = bubble_table()
    bubbles.to_csv(args.out / "dualpipe_bubble.csv", index=False)
    for name, rows in bubbles.groupby("schedule"):
        exact = rows[(rows.F == 1.0) & (rows.B == 2.0) & (rows.W == 1.0)]
        print(f"{name}, B = 2F, W = F: programs' bubble equals the published one in "
              f"{int((exact.bubble_programs == exact.bubble_published).sum())} of "
              f"{len(exact)} cases; peak activations = PP + 1 in "
              f"{int((rows.peak_chunk_activations == rows.published_activations).sum())} "
              f"of {len(rows)}")
    models = model_table()
    models.to_csv(args.out / "dualpipe_models.csv", index=False)
    print(models.to_string(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
