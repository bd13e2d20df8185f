"""Every Megatron-LM export through Megatron-LM's own ``parse_args`` + ``validate_args``.

Megatron-LM's training package (``megatron/training/arguments.py``) is not on PyPI, so
``make test`` checks the exports through megatron-core's configs (``tests/helpers/
frameworks.py``). This script runs the real argument checks where a Megatron-LM checkout
is at hand:

    git clone --branch core_v0.16.1 https://github.com/NVIDIA/Megatron-LM /path/Megatron-LM
    pip install six regex   # arguments.py imports them
    .venv/bin/python experiments/megatron_validate_args.py --megatron-lm /path/Megatron-LM

Each export runs in a fresh interpreter: the script's environment (``export`` lines) is set,
``pretrain_gpt.py``'s words become ``sys.argv``, WORLD_SIZE is the cluster's, and
``validate_args`` runs with the device architecture taken as Hopper (9; this machine has no
GPU to ask). Prints one line per plan and writes
``experiments/results/megatron_validate_args.csv``.
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
sys.path.insert(0, str(ROOT / "tests"))

from helpers.frameworks import script_env_and_args  # noqa: E402
from test_export_frameworks import PLANS  # noqa: E402

from optimizer.export import export  # noqa: E402
from sim import Plan, load_cluster, load_model  # noqa: E402
from sim.io import atomic_write_text  # noqa: E402

# beyond the exports table: what the first review found refused by validate_args
EXTRA = {
    "llama3-70b tp2 dp64 zero3 (optimize --framework megatron)": (
        "llama3-70b", "dgx-h100:16", Plan(512, 4096, 1, dp=64, tp=2, zero_stage=3)),
    "llama3-70b tp2 cp2 dp32 zero3 sp (the demo's winner)": (
        "llama3-70b", "dgx-h100:16", Plan(512, 8192, 1, dp=32, tp=2, cp=2, zero_stage=3,
                                          sequence_parallel=True)),
    "llama3-8b dp16 zero3 standard attention": (
        "llama3-8b", "dgx-h100:2", Plan(64, 4096, 1, dp=16, zero_stage=3,
                                          attention="standard")),
    "gpt3-175b tp8 pp16 standard attention fp16": (
        "gpt3-175b", "dgx-a100:128", Plan(1536, 2048, 1, dp=8, tp=8, pp=16,
                                          sequence_parallel=True, zero_stage=1,
                                          recompute="full", attention="standard",
                                          dtype="fp16")),
}

CHECK = """
import json, os, sys
sys.argv = ["pretrain_gpt.py"] + json.loads(os.environ.pop("TRAINSIM_ARGS"))
import megatron.training.arguments as A
A.get_device_arch_version = lambda: 9
args = A.parse_args()
A.validate_args(args)
print(json.dumps({"tp": args.tensor_model_parallel_size, "pp":
    args.pipeline_model_parallel_size, "dp": args.data_parallel_size,
    "vpp": args.virtual_pipeline_model_parallel_size or 1}))
"""


def check(text: str, world: int, megatron_lm: Path) -> str:
    env, words = script_env_and_args(text, "pretrain_gpt.py")
    run_env = {k: v for k, v in os.environ.items() if k != "CUDA_DEVICE_MAX_CONNECTIONS"}
    run_env |= env | {"WORLD_SIZE": str(world), "RANK": "0", "TRAINSIM_ARGS": json.dumps(words),
                      "PYTHONPATH": os.pathsep.join([str(megatron_lm),
                                                     run_env.get("PYTHONPATH", "")])}
    with tempfile.TemporaryDirectory() as tmp:
        done = subprocess.run([sys.executable, "-c", CHECK], env=run_env, cwd=tmp,
                              capture_output=True, text=True, timeout=300)
    if done.returncode == 0:
        return "accepted " + done.stdout.strip().splitlines()[-1]
    last = (done.stderr.strip().splitlines() or ["?"])[-1]
    return "REFUSED " + last[:200]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--megatron-lm", required=True, type=Path,
                   help="a Megatron-LM checkout (the folder holding megatron/training)")
    a = p.parse_args()
    if not (a.megatron_lm / "megatron" / "training" / "arguments.py").is_file():
        p.error(f"--megatron-lm: no megatron/training/arguments.py under {a.megatron_lm}")
    rows = []
    for name, (model_name, cluster_name, plan) in {**PLANS, **EXTRA}.items():
        model, cluster = load_model(model_name), load_cluster(cluster_name)
        text = export("megatron", plan, model, cluster)["megatron_args.sh"]
        outcome = check(text, cluster.world_size, a.megatron_lm)
        print(f"{name:<58} {outcome}", flush=True)
        rows.append(f'"{name}","{outcome.replace(chr(34), chr(39))}"')
    atomic_write_text(ROOT / "experiments" / "results" / "megatron_validate_args.csv",
                      "plan,validate_args\n" + "\n".join(rows) + "\n")
    return 0 if all("accepted" in r for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
