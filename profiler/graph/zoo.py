"""The workload presets shipped in ``sim/data/workloads/`` and how each was traced.

``python -m profiler.graph.zoo`` traces them all again (a few seconds; needs torchvision and
transformers: ``pip install -e '.[trace]'``); a test checks that the shipped files equal a
fresh trace.
"""

from __future__ import annotations

import json
import sys
from importlib import resources
from pathlib import Path

from sim.spec.workload import Workload

__all__ = ["ZOO", "trace_preset", "main"]

_CONFIGS = resources.files("profiler").joinpath("graph", "configs")
# preset name -> (--model reference, --seq-len)
ZOO: dict[str, tuple[str, int | None]] = {
    **{name.replace("_", "-"): (f"torchvision:{name}", None) for name in (
        "resnet18", "resnet50", "resnet101", "resnet152", "vgg16", "vgg19", "inception_v3",
        "mobilenet_v2", "mobilenet_v3_large", "mobilenet_v3_small", "efficientnet_b0",
        "vit_b_16")},
    "bert-base": (f"hf-encoder:{_CONFIGS.joinpath('bert-base-uncased.json')}", 128),
    "roberta-base": (f"hf-encoder:{_CONFIGS.joinpath('roberta-base.json')}", 128),
    "lstm-lm": ("builtin:lstm-lm", 35),
}


def trace_preset(name: str) -> Workload:
    from profiler.graph.sources import build
    from profiler.graph.trace import trace_module

    ref, seq = ZOO[name]
    module, example, _ = build(ref, 2, seq)
    source = ref if not ref.startswith("hf-encoder:") else f"hf-encoder:{Path(ref).name}"
    return trace_module(module, example, name, source)


def main(argv: list[str] | None = None) -> int:
    from sim.io import atomic_write_files

    folder = Path(str(resources.files("sim").joinpath("data", "workloads")))
    names = argv or list(ZOO)
    files = {}
    for i, name in enumerate(names, 1):
        w = trace_preset(name)
        files[folder / f"{name}.json"] = json.dumps(w.to_dict(), indent=1) + "\n"
        print(f"[{i}/{len(names)}] {name}: {len(w.layers)} layers, {w.param_count:,} params",
              file=sys.stderr)
    atomic_write_files(files)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
