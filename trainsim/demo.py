"""``trainsim demo``: the built-in scenarios, simulated and plotted (``make demo``)."""

from __future__ import annotations

import json
from pathlib import Path

from sim import Plan, load_cluster, load_model, simulate
from sim.io import atomic_write_text
from sim.report import format_result

__all__ = ["SCENARIOS", "run_demo"]

# (label, model, cluster, plan): well-known published-style plans, one per family.
SCENARIOS = [
    ("gpt3-175b Megatron PTD-P", "gpt3-175b", "dgx-a100:128",
     Plan(global_batch_size=1536, seq_len=2048, dp=16, tp=8, pp=8, vpp=4,
          schedule="interleaved-1f1b", recompute="full", dtype="fp16", attention="standard")),
    ("llama3-70b TP8 PP4 SP", "llama3-70b", "dgx-h100:16",
     Plan(global_batch_size=512, seq_len=8192, dp=4, tp=8, pp=4, vpp=5,
          schedule="interleaved-1f1b", sequence_parallel=True)),
    ("llama3-8b FSDP", "llama3-8b", "dgx-h100:4",
     Plan(global_batch_size=256, seq_len=8192, dp=32, zero_stage=3)),
    ("mixtral-8x7b EP8 TP2", "mixtral-8x7b", "hgx-h200:8",
     Plan(global_batch_size=512, seq_len=4096, dp=16, tp=2, pp=2, ep=8, zero_stage=1,
          sequence_parallel=True)),
    ("tiny on this CPU", "tiny", "cpu:2", Plan(global_batch_size=8, seq_len=256, dp=2)),
]


def run_demo(out: Path) -> int:
    out.mkdir(parents=True, exist_ok=True)  # fail on a bad --out before any work
    results = []
    for label, model, cluster, plan in SCENARIOS:
        res = simulate(load_model(model), load_cluster(cluster), plan)
        results.append((label, res))
        print(f"== {label}\n{format_result(res)}\n")
    payload = [{"scenario": label, "plan": plan.to_dict(), "result": res.to_dict()}
               for (label, res), (_, _, _, plan) in zip(results, SCENARIOS, strict=True)]
    atomic_write_text(out / "results.json", json.dumps(payload, indent=2) + "\n")
    from sim.plots import plot_breakdown

    png = plot_breakdown(results, out / "breakdown.png")
    print(f"wrote {out / 'results.json'} and {png}")
    return 0
