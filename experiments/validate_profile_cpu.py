"""Held-out check of the CPU profile: whole transformer layers at shapes not in the grid.

Run: ``.venv/bin/python experiments/validate_profile_cpu.py [--db DIR]``. For each of ten
layer shapes (widths, heads, sequence lengths and micro-batches that are not grid points),
the script measures forward + backward of a real torch layer (``profiler/layer.py``, one
thread, fp32, median of 7 after warm-up, the other cores kept busy as when the profile was
taken: ``--busy``) and predicts it from the profile DB's preset grid through the simulator's
cost model, restricted to the preset grid (interpolated, never extrapolated: any
extrapolation is reported). The prediction is the sum of the layer's operations times the
whole-layer correction the profile measured on its own grid of layers. The DB defaults to
the one trainsim ships for this CPU; if it lacks the preset grid, run ``trainsim profile
compute --device cpu --db DIR`` first. ``--fresh`` takes the fp32 preset grid into a new
DB first (about 5 min here), so profile and check are minutes apart rather than hours.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import torch

from profiler.busy import busy_neighbours, default_busy
from profiler.layer import ReferenceLayer
from sim.cluster import shipped_cpu_profile
from sim.compute import layer_time
from sim.hardware import get_hardware
from sim.io import atomic_write_text
from sim.model import ModelSpec
from sim.plan import Plan
from sim.profiled import load_cost_model

OUT = Path(__file__).resolve().parent / "results" / "profile_heldout_cpu.csv"
LLAMA = dict(gated_mlp=True, norm="rmsnorm", position_embedding="rope", tied_embeddings=False)
GPT = dict(linear_bias=True, dropout=True)
# (name, hidden, heads, kv heads, ffn, seq, micro-batch, style)
SHAPES = [
    ("llama-192", 192, 3, 3, 512, 384, 1, LLAMA), ("llama-320", 320, 5, 5, 864, 256, 3, LLAMA),
    ("llama-384", 384, 6, 2, 1024, 640, 1, LLAMA), ("llama-448", 448, 7, 7, 1216, 192, 4, LLAMA),
    ("llama-512", 512, 8, 4, 1408, 320, 3, LLAMA), ("llama-640", 640, 10, 2, 1728, 448, 2, LLAMA),
    ("llama-768", 768, 12, 4, 2048, 384, 2, LLAMA), ("llama-896", 896, 14, 2, 1984, 576, 1, LLAMA),
    ("gpt-320", 320, 5, 5, 1280, 320, 2, GPT), ("gpt-576", 576, 9, 9, 2304, 704, 1, GPT),
]


def measure_layer(m: ModelSpec, seq: int, mb: int, repeats: int = 7) -> float:
    """Median seconds of one forward + backward of the layer."""
    layer = ReferenceLayer(m, seq)
    x = torch.randn(mb, seq, m.hidden_size, requires_grad=True)
    grad = torch.randn(mb, seq, m.hidden_size)

    def step() -> None:
        layer(x).backward(grad)

    for _ in range(2):
        step()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def table(db: str, busy: int) -> pd.DataFrame:
    torch.set_num_threads(1)
    rows = []
    with busy_neighbours(busy):
        for spec in SHAPES:
            rows.append(_row(db, *spec))
    return pd.DataFrame(rows)


def _row(db: str, name: str, h: int, heads: int, kv: int, ffn: int, seq: int, mb: int,
         style: dict) -> dict:
    m = ModelSpec(name, 1, h, heads, ffn, 1000, num_kv_heads=kv, max_seq_len=seq,
                  **style)  # type: ignore[arg-type]
    cost = load_cost_model(db, get_hardware("cpu"), grid="preset-cpu")
    lt = layer_time(cost, m, Plan(global_batch_size=mb, seq_len=seq, micro_batch_size=mb,
                                  dtype="fp32"))
    measured = measure_layer(m, seq, mb)
    predicted = lt.forward + lt.backward
    return {"layer": name, "hidden": h, "heads": heads, "kv_heads": kv, "ffn": ffn,
            "seq": seq, "micro_batch": mb, "measured_ms": 1e3 * measured,
            "predicted_ms": 1e3 * predicted,
            "error_pct": 100 * (predicted - measured) / measured,
            "extrapolated": "; ".join(sorted(cost.extrapolated))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", default=shipped_cpu_profile(), help="profile DB (device folder)")
    ap.add_argument("--busy", type=int, default=default_busy(),
                    help="neighbour processes kept busy (default: one per other core, as "
                    "trainsim profile compute)")
    ap.add_argument("--fresh", action="store_true", help="profile the fp32 preset grid into a "
                    "new DB first and check against it")
    args = ap.parse_args()
    if args.fresh and args.db != shipped_cpu_profile():
        raise SystemExit("--fresh profiles a new DB: leave out --db")
    with tempfile.TemporaryDirectory() as tmp:
        if args.fresh:
            t0 = time.time()
            subprocess.run([str(Path(sys.executable).with_name("trainsim")), "profile",
                            "compute", "--device", "cpu", "--dtype", "fp32", "--db", tmp],
                           check=True)
            args.db = str(next(Path(tmp).iterdir()))
            print(f"profiled the fp32 preset grid in {time.time() - t0:.0f} s")
        if not args.db:
            raise SystemExit("no shipped profile for this CPU: give --db or --fresh")
        df = table(args.db, args.busy)
    atomic_write_text(OUT, df.to_csv(index=False, float_format="%.4g"))
    print(df.drop(columns="extrapolated").round(2).to_string(index=False))
    err = df["error_pct"].abs()
    print(f"\nmedian |error| {err.median():.1f}%, worst {err.max():.1f}% "
          f"({df.loc[err.idxmax(), 'layer']}); extrapolated ops: "
          f"{sum(bool(e) for e in df['extrapolated'])} layers")


if __name__ == "__main__":
    main()
