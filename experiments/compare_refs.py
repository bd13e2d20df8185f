"""Same numbers before and after a change: run the reference outputs in two git commits and
compare them byte for byte.

Run: ``.venv/bin/python experiments/compare_refs.py OLD [NEW]`` (NEW defaults to HEAD), e.g.
``experiments/compare_refs.py 6440c3d`` for the restructure of issue 13. Each commit is
checked out into a temporary git worktree and runs, with its own code and this virtual
environment:

* ``experiments/validate_megatron.py`` (analytic tier) and ``--fidelity des``: SC'21 Table 1;
* ``experiments/des_exactness.py``: every DES collective against its closed form;
* ``trainsim demo``: the optimizer's search on llama3-70b / dgx-h100:16, its best plan,
  ranked plans, report (less its wall time), best plan's DES trace and Megatron-LM arguments;
* 20 reference plans (TP, SP, PP + vpp, CP, EP, ZeRO-1/2/3, recompute, CPU ranks, stragglers,
  drawn scales, slowed and failed links, mixed GPUs), each in the analytic tier, the DES and
  the unreduced DES, through the public ``sim.simulate`` (their result JSON, less wall time).

Prints one line per output (``identical`` or ``DIFFERS``) and exits 1 if any differs.
``--drop moe_dispatcher,etp`` leaves out fields a change adds (JSON keys at any depth, CSV
columns), so the numbers beside them are still compared byte for byte.
Takes about 5 minutes per commit on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The reference plans, run with the public API only (any commit has it).
PLANS = """
import json, sys
from sim import Plan as P, load_cluster, load_model, simulate
try:
    from sim.spec.faults import faults_from_options
except ImportError:
    from sim.faults import faults_from_options
L8, H2 = "llama3-8b", "dgx-h100:2"
CASES = [
 (L8, H2, P(16, 2048, dp=4, tp=2, pp=2), None),
 (L8, H2, P(16, 2048, dp=2, tp=4, pp=2, sequence_parallel=True), None),
 (L8, "dgx-h100:4", P(32, 2048, dp=2, tp=4, pp=4, vpp=2, schedule="interleaved-1f1b"), None),
 (L8, H2, P(8, 8192, dp=2, tp=2, cp=2, pp=2), None),
 ("mixtral-8x7b", "dgx-h100:4", P(32, 2048, dp=8, tp=2, pp=2, ep=4, sequence_parallel=True),
  None),
 (L8, H2, P(16, 2048, dp=16, zero_stage=1), None),
 (L8, H2, P(32, 2048, dp=16, zero_stage=2), None),
 (L8, H2, P(16, 2048, dp=16, zero_stage=3), None),
 (L8, H2, P(16, 2048, dp=4, pp=4, recompute="full", schedule="gpipe"), None),
 (L8, H2, P(16, 2048, dp=8, pp=2, recompute="selective"), None),
 ("tiny", "cpu:2", P(8, 256, dp=2), None),
 ("tiny", "cpu:4", P(8, 256, dp=2, tp=2, sequence_parallel=True), None),
 ("tiny", "cpu:4", P(8, 256, dp=2, pp=2, zero_stage=3), None),
 ("tiny", "cpu:4", P(8, 256, cp=2, dp=2), None),
 ("gpt3-175b", "dgx-a100:8", P(64, 2048, tp=8, pp=8, vpp=2, schedule="interleaved-1f1b",
                               recompute="full"), None),
 (L8, H2, P(16, 2048, dp=4, tp=2, pp=2), (["gpu:3=1.5"], [], [])),
 (L8, H2, P(16, 2048, dp=4, tp=2, pp=2), ([], ["lognormal:0.1"], [])),
 (L8, H2, P(16, 2048, dp=8, tp=2), (["link:nic0.0-pod0=2"], [], [])),
 (L8, H2, P(16, 2048, dp=8, tp=2), ([], [], ["nic0.0-pod0@0.01"])),
 (L8, "dgx-a100:1+dgx-h100:1", P(16, 2048, dp=16), None),
]
def run(m, c, plan, **kw):
    r = simulate(m, c, plan, **kw).to_dict()
    r["simulation"].pop("wall_s", None)
    return r
out = []
for model, cluster, plan, f in CASES:
    m, c = load_model(model), load_cluster(cluster)
    faults = faults_from_options(f[0], f[1], 0, f[2]) if f else None
    row = {t: run(m, c, plan, fidelity=t, faults=faults) for t in ("analytic", "des")}
    if not f:
        row["des_full"] = run(m, c, plan, fidelity="des", reduce=False)
    out.append(row)
json.dump(out, open(sys.argv[1], "w"), indent=1, sort_keys=True, default=str)
"""
RESULTS = ["experiments/results/megatron_table1_validation.csv",
           "experiments/results/megatron_table1_validation_des.csv",
           "experiments/results/des_exactness.csv"]
DEMO = ["best_plan.json", "plans.csv", "report.json", "best_trace.json", "megatron_args.sh"]


def _run(tree: Path, args: list[str]) -> None:
    env = os.environ | {"PYTHONPATH": str(tree)}
    subprocess.run([sys.executable, *args], cwd=tree, env=env, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def outputs(tree: Path, out: Path) -> dict[str, bytes]:
    """Run every reference output in the checkout ``tree``; name -> bytes."""
    print(f"running the reference outputs in {tree.name} ...", flush=True)
    _run(tree, ["experiments/validate_megatron.py"])
    _run(tree, ["experiments/validate_megatron.py", "--fidelity", "des"])
    _run(tree, ["experiments/des_exactness.py"])
    _run(tree, ["-m", "trainsim", "demo", "--out", str(out / "demo")])
    (out / "plans.py").write_text(PLANS)
    _run(tree, [str(out / "plans.py"), str(out / "plans.json")])
    got = {name: (tree / name).read_bytes() for name in RESULTS}
    report = json.loads((out / "demo" / "report.json").read_text())
    report.pop("wall_s", None)
    got |= {f"demo/{n}": (out / "demo" / n).read_bytes() for n in DEMO if n != "report.json"}
    got["demo/report.json (less wall_s)"] = json.dumps(report, sort_keys=True).encode()
    got["20 reference plans x tiers"] = (out / "plans.json").read_bytes()
    return got


def _without(data: bytes, name: str, drop: set[str]) -> bytes:
    """An output less the keys (JSON, at any depth) or columns (CSV) named in ``drop``: the
    fields a change adds at their defaults, so that the numbers can still be compared."""
    if not drop:
        return data
    if name.endswith(".csv"):
        import io

        import pandas as pd

        df = pd.read_csv(io.BytesIO(data), dtype=str, keep_default_na=False)
        return df.drop(columns=[c for c in df.columns if c in drop]).to_csv(
            index=False).encode()

    def strip(v: object) -> object:
        if isinstance(v, dict):
            return {k: strip(x) for k, x in v.items() if k not in drop}
        if isinstance(v, list):
            return [strip(x) for x in v]
        return v
    try:
        return json.dumps(strip(json.loads(data)), sort_keys=True).encode()
    except ValueError:
        return data


def compare(old: str, new: str, drop: frozenset[str] = frozenset()) -> bool:
    with tempfile.TemporaryDirectory() as d:
        trees = {ref: Path(d) / f"tree-{i}" for i, ref in enumerate((old, new))}
        for ref, tree in trees.items():
            subprocess.run(["git", "worktree", "add", "--detach", str(tree), ref], cwd=ROOT,
                           check=True, capture_output=True)
        try:
            got = {ref: outputs(tree, Path(d) / f"out-{i}")
                   for i, (ref, tree) in enumerate(trees.items())}
        finally:
            for tree in trees.values():
                subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT,
                               check=True, capture_output=True)
    same = True
    for name, raw in got[old].items():
        data = _without(raw, name, set(drop))
        ok = _without(got[new][name], name, set(drop)) == data
        same &= ok
        print(f"{name}: {'identical' if ok else 'DIFFERS'} ({len(data):,} bytes)"
              + ("" if ok else _json_keys_that_differ(data, got[new][name])))
    return same


def _json_keys_that_differ(a: bytes, b: bytes) -> str:
    """For a JSON object: which top-level keys differ, and how (short)."""
    try:
        x, y = json.loads(a), json.loads(b)
    except ValueError:
        return ""
    if not (isinstance(x, dict) and isinstance(y, dict)):
        return ""
    keys = sorted(k for k in set(x) | set(y) if x.get(k) != y.get(k))
    return "".join(f"\n    {k}: {json.dumps(x.get(k))[:160]} -> {json.dumps(y.get(k))[:160]}"
                   for k in keys)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old", help="the commit before the change")
    ap.add_argument("new", nargs="?", default="HEAD", help="the commit after (default HEAD)")
    ap.add_argument("--drop", default="", metavar="KEY,...",
                    help="leave out these JSON keys (at any depth) and CSV columns: fields the "
                    "change adds, so the numbers beside them are still compared")
    args = ap.parse_args()
    drop = frozenset(k for k in args.drop.split(",") if k)
    sys.exit(0 if compare(args.old, args.new, drop) else 1)


if __name__ == "__main__":
    main()
