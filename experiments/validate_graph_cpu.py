"""Issue 15's single-process check: a training step on this CPU predicted from the per-layer
profile against the whole step measured, for six workload graphs at two batch sizes.

For each workload, ``profile_workload`` (the code behind ``trainsim profile compute --model
REF``) traces it, then per batch size alternates a step timed layer by layer and a whole
step without hooks (``--rounds`` rounds, one pinned core, one thread) and times the AdamW
step. The prediction is ``trainsim simulate`` of the profiled workload on ``cpu:1`` (one
device, dp = pp = 1, fp32): the sum of the measured layer times plus the optimizer step.
Prints one line per point and the median and worst |error|; writes
``experiments/results/graph_cpu_validation.csv``. About 8 minutes on this VM.

Run: ``.venv/bin/python experiments/validate_graph_cpu.py [--rounds 3]``
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
CASES = [("torchvision:resnet18", None, (4, 8)), ("torchvision:resnet50", None, (2, 4)),
         ("torchvision:vgg16", None, (2, 4)), ("torchvision:mobilenet_v3_small", None, (4, 8)),
         (f"hf-encoder:{ROOT}/profiler/graph/configs/bert-base-uncased.json", 128, (2, 4)),
         ("builtin:lstm-lm", 35, (8, 16))]


def main() -> int:
    from profiler.graph.profile import profile_workload
    from sim import Plan, load_cluster, simulate

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    rows, cluster = [], load_cluster("cpu:1")
    with tempfile.TemporaryDirectory() as db:
        for ref, seq, batches in CASES:
            t0 = time.perf_counter()
            _, w, steps = profile_workload(ref, list(batches), db, "cpu", 1, args.rounds,
                                           seq_len=seq, progress=False)
            for s in steps:
                plan = Plan(s["batch"], 1, s["batch"], dp=1, dtype="fp32")
                predicted = simulate(w, cluster, plan).iteration_time_s
                err = 100 * (predicted / s["step_s"] - 1)
                rows.append({"workload": w.name, "batch": s["batch"], "layers": len(w.layers),
                             "measured_step_s": round(s["step_s"], 5),
                             "predicted_step_s": round(predicted, 5), "error_pct": round(err, 2)})
                took = time.perf_counter() - t0
                print(f"{w.name:<20} batch {s['batch']:>3}: measured {s['step_s']:.4f} s, "
                      f"predicted {predicted:.4f} s ({err:+.1f}%)  [{took:.0f} s]", flush=True)
    errs = [abs(r["error_pct"]) for r in rows]
    print(f"median |error| {statistics.median(errs):.1f}%, worst {max(errs):.1f}% "
          f"over {len(rows)} points")
    out = ROOT / "experiments" / "results" / "graph_cpu_validation.csv"
    pd.DataFrame(rows).to_csv(out, index=False)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    raise SystemExit(main())
