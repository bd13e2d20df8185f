"""Every (format x test plan) handed to the pinned framework's own front door and read back.

Run: ``.venv/bin/python experiments/exports_table.py`` (needs the ``export-check`` extra,
which ``make test`` installs).

The plans are the six of ``tests/test_export_frameworks.py`` plus the winner of
``trainsim optimize --framework megatron`` for llama3-70b on dgx-h100:16 (global batch 512 x
4096 tokens). Each export is either refused (the field its one-line error names is shown)
or accepted by the front door, and then its parsed values (degrees, micro-batch,
accumulation, vpp, layer split, ZeRO/FSDP, recompute, dtype, sequence parallelism) are
compared with the plan's: ``equal`` says whether all of them match, ``parsed`` shows them.
The front doors: megatron-core 0.16.1's configs (Megatron-LM's own parser is not on PyPI;
see ``tests/helpers/frameworks.py`` for what that leaves out), torchtitan 0.3.0's
ConfigManager + ParallelDims (and the model built on the meta device: its parameter count
against the simulator's), DeepSpeed 0.19.8's DeepSpeedConfig, torchrun's argument parser.

Writes ``experiments/results/exports_table.csv``.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from helpers.frameworks import (  # noqa: E402
    deepspeed_parsed,
    megatron_parsed,
    torchrun_parsed,
    torchtitan_parsed,
)
from test_export_frameworks import PLANS  # noqa: E402

from executor.export import torchrun_files  # noqa: E402
from optimizer.export import export  # noqa: E402
from optimizer.export.torchtitan import CONFIG_FN, MODULE  # noqa: E402
from sim import Plan, load_cluster, load_model  # noqa: E402
from sim.errors import SpecError  # noqa: E402
from sim.io import atomic_write_text  # noqa: E402
from sim.layout.flops import param_count  # noqa: E402
from sim.layout.stages import virtual_stage_layers  # noqa: E402

KEYS = ("tp", "pp", "cp", "ep", "dp", "micro_batch", "accumulation", "vpp", "layers", "zero",
        "recompute", "dtype", "sequence_parallel")


def _want(plan: Plan, model: Any) -> dict[str, Any]:
    return {"tp": plan.tp, "pp": plan.pp, "cp": plan.cp, "ep": plan.ep, "dp": plan.dp,
            "micro_batch": plan.micro_batch_size, "accumulation": plan.num_microbatches,
            "vpp": plan.vpp, "layers": virtual_stage_layers(plan, model),
            "zero": plan.zero_stage, "recompute": plan.recompute, "dtype": plan.dtype,
            "sequence_parallel": plan.sequence_parallel}


def _front_door(fmt: str, files: dict[str, str], world: int) -> dict[str, Any]:
    if fmt == "megatron":
        return megatron_parsed(files["megatron_args.sh"], world)
    if fmt == "deepspeed":
        return deepspeed_parsed(json.loads(files["deepspeed_config.json"]), world)
    if fmt == "torchrun":
        parsed = torchrun_parsed(files["torchrun.sh"])
        return Plan.from_dict(json.loads(files["executor_config.json"])["plan"]).to_dict() \
            | {"micro_batch": None, "launch": f"{parsed['script']} ({parsed['nnodes']} nodes)"}
    with tempfile.TemporaryDirectory() as tmp:
        for name, text in files.items():
            (Path(tmp) / name).write_text(text)
        return torchtitan_parsed(Path(tmp), MODULE, CONFIG_FN, world)


def _row(name: str, fmt: str, model_name: str, cluster_name: str, plan: Plan) -> dict[str, Any]:
    model, cluster = load_model(model_name), load_cluster(cluster_name)
    row: dict[str, Any] = {"plan": name, "format": fmt}
    try:
        files = torchrun_files(plan, model, cluster) if fmt == "torchrun" else \
            export(fmt, plan, model, cluster)
    except SpecError as exc:
        return row | {"outcome": f"refused: {exc.field}", "equal": None, "parsed": str(exc)}
    parsed = _front_door(fmt, files, cluster.world_size)
    if fmt == "torchrun":  # the worker reads the plan itself: compare it whole
        same = Plan.from_dict({k: v for k, v in parsed.items()
                               if k not in ("micro_batch", "launch")}) == plan
        return row | {"outcome": "accepted", "equal": same, "parsed": parsed["launch"]}
    want = _want(plan, model)
    if plan.pp == 1 and fmt != "megatron":
        want.pop("layers")
    shown = {k: parsed[k] for k in KEYS if k in parsed and k in want}
    equal = all(shown[k] == want[k] for k in shown)
    if "params" in parsed:
        equal = equal and parsed["params"] == param_count(model)
        shown["params_equal"] = parsed["params"] == param_count(model)
    return row | {"outcome": "accepted", "equal": equal,
                  "parsed": json.dumps(shown, separators=(",", ":"))}


def _optimized() -> Plan:
    from optimizer.constraints import Constraints
    from optimizer.search import optimize
    from optimizer.space import SearchSpace

    model, cluster = load_model("llama3-70b"), load_cluster("dgx-h100:16")
    space = SearchSpace(model, cluster, 512, 4096,
                        constraints=Constraints(framework="megatron"))
    return optimize(model, cluster, 512, 4096, top_k=8, progress=False, space=space).best.plan


def main() -> int:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29583", RANK="0", WORLD_SIZE="1",
                      LOCAL_RANK="0")
    import deepspeed.comm as dscomm

    dscomm.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
    cases = dict(PLANS)
    cases["optimize --framework megatron llama3-70b"] = ("llama3-70b", "dgx-h100:16",
                                                          _optimized())
    rows = []
    for name, (model_name, cluster_name, plan) in cases.items():
        for fmt in ("megatron", "torchtitan", "deepspeed", "torchrun"):
            rows.append(_row(name, fmt, model_name, cluster_name, plan))
            print(f"{name:45} {fmt:11} {rows[-1]['outcome']:28} equal={rows[-1]['equal']}")
    table = pd.DataFrame(rows)
    atomic_write_text(ROOT / "experiments/results/exports_table.csv", table.to_csv(index=False))
    bad = table[(table.outcome == "accepted") & (table.equal != True)]  # noqa: E712
    print(f"{(table.outcome == 'accepted').sum()} accepted, all parsed values equal: "
          f"{bad.empty}; {table.outcome.str.startswith('refused').sum()} refused by name")
    return 0 if bad.empty else 1


if __name__ == "__main__":
    sys.exit(main())
