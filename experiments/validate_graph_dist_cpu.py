"""Issue 15's distributed check: data-parallel and pipeline-parallel runs of workload graphs
on ``cpu:2`` (two ranks, gloo, one pinned core each), predicted against measured.

Per workload: ``profile comm`` of gloo on this host (all-reduce and send/recv, 1 KiB to
64 MiB) and ``profile compute --model REF`` at the micro-batch size with a busy neighbour
(the other rank shares the memory bandwidth) into one profile DB; then ``trainsim compare``
of a DP2 plan (two micro-batches per replica: DDP's buckets behind the last backward) and a
PP2 plan (four micro-batches, 1F1B, ``torch.distributed.pipelining`` split where the
simulator's balanced split can begin) with the analytic tier. Prints one line per run and
the median |error|; writes ``experiments/results/graph_dist_cpu_validation.csv``. About 10
minutes on this VM.

Run: ``.venv/bin/python experiments/validate_graph_dist_cpu.py``
"""

from __future__ import annotations

import dataclasses
import statistics
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
CASES = [("torchvision:resnet18", None, 4), ("torchvision:mobilenet_v3_small", None, 8),
         ("builtin:lstm-lm", 35, 16)]
SIZES = [4**i for i in range(5, 14)]  # 1 KiB .. 64 MiB


def main() -> int:
    from executor.compare import compare_graph
    from profiler.comm import run_comm_profile
    from profiler.graph.profile import profile_workload
    from sim import Plan, load_cluster

    rows = []
    with tempfile.TemporaryDirectory() as db:
        t0 = time.perf_counter()
        run_comm_profile(2, db, SIZES, ["all_reduce", "send_recv"], rounds=3, insitu=False,
                         accept_poor_fit=True)
        print(f"comm profile: {time.perf_counter() - t0:.0f} s", flush=True)
        cluster = dataclasses.replace(load_cluster("cpu:2"), profile=db)
        for ref, seq, mb in CASES:
            _, w, _ = profile_workload(ref, [mb], db, "cpu", 1, 3, seq_len=seq,
                                       progress=False, busy=1)
            for label, plan in (("dp2", Plan(4 * mb, 1, mb, dp=2, dtype="fp32")),
                                ("pp2", Plan(4 * mb, 1, mb, dp=1, pp=2, dtype="fp32"))):
                c = compare_graph(w, plan, cluster, "analytic", nproc=2, steps=4, warmup=2,
                                  timeout_s=300.0, device="cpu", threads=1)
                rows.append({"workload": w.name, "plan": label, "micro_batch": mb,
                             "split": "/".join(map(str, c["plan"]["layers_per_stage"] or [])),
                             "measured_s": round(c["measured_s"], 4),
                             "predicted_s": round(c["predicted_s"], 4),
                             "error_pct": round(100 * c["error"], 1)})
                print(f"{w.name:<20} {label}: measured {c['measured_s']:.4f} s, predicted "
                      f"{c['predicted_s']:.4f} s ({100 * c['error']:+.1f}%)", flush=True)
    errs = [abs(r["error_pct"]) for r in rows]
    print(f"median |error| {statistics.median(errs):.1f}%, worst {max(errs):.1f}% over "
          f"{len(rows)} runs")
    pd.DataFrame(rows).to_csv(ROOT / "experiments" / "results" /
                              "graph_dist_cpu_validation.csv", index=False)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    raise SystemExit(main())
