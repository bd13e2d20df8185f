"""Benchmark of the analytic tier: CLI wall time and the ``simulate`` call itself.

Run: ``.venv/bin/python experiments/bench_analytic.py``. Targets (issue "Foundation"):
``trainsim simulate --fidelity analytic`` on gpt3-175b / dgx-a100:128 under 1 s including
interpreter start; one analytic call under 1 ms.

``--against REF`` (a git commit or branch) also times the same call and command in a
checkout of REF, alternating with this tree round by round in fresh interpreters so that
both see the same machine, and prints the ratio this/REF (a restructure must not slow the
analytic tier: a ratio near 1).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import timeit
from pathlib import Path

from sim import Plan, load_cluster, load_model, save_plan, simulate
from sim.layout.placement import _group_span

PLAN = Plan(global_batch_size=1536, seq_len=2048, dp=16, tp=8, pp=8, vpp=4,
            schedule="interleaved-1f1b", recompute="full", dtype="fp16", attention="standard")
TRAINSIM = Path(sys.executable).with_name("trainsim")


def cli_wall_times(runs: int = 10) -> list[float]:
    with tempfile.TemporaryDirectory() as d:
        plan_path = Path(d) / "plan.json"
        save_plan(PLAN, plan_path)
        cmd = [str(TRAINSIM), "simulate", "--model", "gpt3-175b", "--cluster", "dgx-a100:128",
               "--plan", str(plan_path), "--fidelity", "analytic", "--json"]
        times = []
        for _ in range(runs):
            t0 = time.perf_counter()
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            times.append(time.perf_counter() - t0)
        json.loads(out)
    return times


def call_times(repeat: int = 7, number: int = 200, cold: bool = False) -> list[float]:
    """Seconds per call; ``cold`` empties the placement memo before every call (the first
    plan of a search pays that; later plans with the same degrees do not)."""
    model, cluster = load_model("gpt3-175b"), load_cluster("dgx-a100:128")

    def call() -> None:
        if cold:
            _group_span.cache_clear()
        simulate(model, cluster, PLAN)

    timer = timeit.Timer(call)
    return [t / number for t in timer.repeat(repeat=repeat, number=number)]


# One timing in a fresh interpreter, with only the public API (any checkout has it).
_SNIPPET = """
import json, sys, time, timeit
t0 = time.perf_counter()
from sim import Plan, load_cluster, load_model, simulate
import_s = time.perf_counter() - t0
plan = Plan(global_batch_size=1536, seq_len=2048, dp=16, tp=8, pp=8, vpp=4,
            schedule="interleaved-1f1b", recompute="full", dtype="fp16", attention="standard")
m, c = load_model("gpt3-175b"), load_cluster("dgx-a100:128")
calls = timeit.Timer(lambda: simulate(m, c, plan)).repeat(repeat=5, number=200)
print(json.dumps({"import_s": import_s, "call_s": min(calls) / 200}))
"""


def _time_in(tree: Path) -> dict[str, float]:
    env = os.environ | {"PYTHONPATH": str(tree)}
    out = subprocess.run([sys.executable, "-c", _SNIPPET], env=env, cwd=tree, check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out)


def compare(ref: str, rounds: int = 6) -> None:
    """This tree against a checkout of ``ref``, alternating, ``rounds`` times each."""
    root = Path(__file__).resolve().parents[1]
    with tempfile.TemporaryDirectory() as d:
        other = Path(d) / "ref"
        subprocess.run(["git", "worktree", "add", "--detach", str(other), ref], cwd=root,
                       check=True, capture_output=True)
        try:
            runs: dict[str, list[dict[str, float]]] = {"this": [], ref: []}
            for i in range(rounds):
                order = [("this", root), (ref, other)] if i % 2 == 0 else \
                    [(ref, other), ("this", root)]
                for name, tree in order:
                    runs[name].append(_time_in(tree))
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(other)], cwd=root,
                           check=True, capture_output=True)
    for key, unit, scale in (("call_s", "us", 1e6), ("import_s", "ms", 1e3)):
        a, b = (statistics.median(r[key] for r in runs[n]) for n in ("this", ref))
        print(f"{key}: this tree {a * scale:.1f} {unit}, {ref} {b * scale:.1f} {unit}: "
              f"ratio this/{ref} {a / b:.3f} (median of {rounds} alternating rounds)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--against", metavar="REF", help="also compare with git commit REF")
    args = ap.parse_args()
    if args.against:
        compare(args.against)
    cli = cli_wall_times()
    call = call_times()
    cold = call_times(cold=True)
    print(f"trainsim simulate (gpt3-175b, dgx-a100:128), wall incl. interpreter start: "
          f"median {statistics.median(cli) * 1e3:.0f} ms, max {max(cli) * 1e3:.0f} ms "
          f"over {len(cli)} runs (target < 1000 ms)")
    print(f"simulate(..., fidelity='analytic') call: median {statistics.median(call) * 1e6:.0f} "
          f"us, max {max(call) * 1e6:.0f} us over {len(call)} x 200 calls (target < 1000 us); "
          f"with a cold placement memo: median {statistics.median(cold) * 1e6:.0f} us, "
          f"max {max(cold) * 1e6:.0f} us")


if __name__ == "__main__":
    main()
