"""The DES on MoE at scale: DeepSeek-V3 on 2,048 H100s (PP16, EP64), and the all-to-all's
aggregation checked against the unreduced step on a smaller cluster.

Run: ``.venv/bin/python experiments/bench_des_moe.py``. Each case runs in a fresh
interpreter (its peak RSS its own); a bare SimPy timeout loop is timed in the same run and
every case's events/s is given as a ratio to it (the machines are noisy). Writes
``experiments/results/des_moe_cases.csv``.

DeepSeek-V3 with its multi-token prediction module, 61 layers over 16 stages as
3 + 14 x 4 + 2 (MTP on the last), dp 128 with ep 64, ZeRO-1, sequences of 4,096 tokens.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

from sim.io import atomic_write_text

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_des import bare_simpy_rate  # noqa: E402 - the same bare loop as bench_des.py
from bench_des_faults import run_case  # noqa: E402 - one case in a fresh interpreter

RESULTS = Path(__file__).resolve().parent / "results"
LAYERS = [3] + [4] * 14 + [2]


def _dsv3(batch: int, recompute: str = "none") -> dict:
    return dict(global_batch_size=batch, seq_len=4096, dp=128, pp=16, ep=64, zero_stage=1,
                recompute=recompute, layers_per_stage=LAYERS)


SMALL = dict(global_batch_size=64, seq_len=4096, dp=32, pp=2, ep=32, zero_stage=1,
             layers_per_stage=[31, 30])
# (label, model, cluster, plan, stragglers, reduce, target wall seconds)
CASES = [
    ("DeepSeek-V3, 2,048 H100s, PP16 EP64, 1,024 sequences", "deepseek-v3", "dgx-h100:256",
     _dsv3(1024), [], True, 10.0),
    ("DeepSeek-V3, 2,048 H100s, PP16 EP64, 1,024 sequences, full recompute", "deepseek-v3",
     "dgx-h100:256", _dsv3(1024, "full"), [], True, None),
    ("DeepSeek-V3, 2,048 H100s, PP16 EP64, 1,024 sequences, one straggler node",
     "deepseek-v3", "dgx-h100:256", _dsv3(1024), ["node:3=1.2"], True, None),
    ("DeepSeek-V3, 64 H100s, PP2 EP32, reduced", "deepseek-v3", "dgx-h100:8", SMALL, [],
     True, None),
    ("DeepSeek-V3, 64 H100s, PP2 EP32, unreduced", "deepseek-v3", "dgx-h100:8", SMALL, [],
     False, None),
]


def main() -> None:
    bare = bare_simpy_rate()
    print(f"bare SimPy timeout loop: {bare:,.0f} events/s")
    rows = []
    for label, model, cluster, plan, stragglers, reduce, target in CASES:
        r = run_case(model, cluster, plan, stragglers, [], reduce)
        rate = r["events"] / r["wall_s"]
        met = "" if target is None else ("met" if r["wall_s"] <= target else "NOT met")
        print(f"{label}: {r['wall_s']:.2f} s wall (target {target or '-'} s {met}), "
              f"iteration {r['iteration_s']:.6f} s, {r['units']} units / {r['classes']} "
              f"classes, {r['events']:,} events, {rate / bare:.3f} of bare SimPy, peak RSS "
              f"{r['rss_mib']:.0f} MiB {r['not_reduced_because']}", flush=True)
        rows.append({"case": label, "target_s": target, **r, "events_per_s": rate,
                     "ratio_to_bare_simpy": rate / bare})
    df = pd.DataFrame(rows)
    red, full = df.iloc[-2]["iteration_s"], df.iloc[-1]["iteration_s"]
    print(f"64 GPUs: reduced {red!r} s, unreduced {full!r} s (relative difference "
          f"{abs(red - full) / full:.2e})")
    atomic_write_text(RESULTS / "des_moe_cases.csv", df.to_csv(index=False,
                                                               float_format="%.6g"))
    print(f"wrote {RESULTS / 'des_moe_cases.csv'}")


if __name__ == "__main__":
    main()
