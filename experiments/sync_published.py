"""Published-shape study of issue 16: parameter servers against ring all-reduce, and
Horovod's scaling efficiency, predicted beside the published figures.

Run: ``.venv/bin/python experiments/sync_published.py`` (under a minute). Writes
``experiments/results/sync_published.csv``.

1. **BytePS vs Horovod** (the "NVLink + TCP" section of the performance page in the docs
   folder of github.com/bytedance/byteps): cloud VMs with 8 V100 16GB on NVLink each,
   20 Gb/s TCP between them, fp32, batch 64 a GPU. Published: BytePS +44% over Horovod
   (NCCL) for ResNet-50, +100% for VGG-16. The text gives one figure per model and no
   machine count: we compare at 8 machines (64 GPUs) and show 2 and 4.
   Horovod: BSP over NCCL ring all-reduce, overlapped with the backward (the one-step
   tier). BytePS: BSP over as many dedicated CPU servers as GPU machines (BytePS' advice),
   each with a 20 Gb/s NIC; each machine sums its 8 GPUs' gradients over NVLink first and
   pushes once (``aggregate = "node"``), in 4 MB partitions pipelined with the backward
   (``partition_MB = 4``, BytePS' default), :mod:`sim.strategies.byteps`.
2. **Horovod's scaling efficiency** (horovod README, early 2018: 32 servers with 4 Pascal
   GPUs on 25 Gb/s RoCE: 90% Inception V3, 90% ResNet-101, 79% VGG-16; later README and
   docs/benchmarks: 128 such servers, 90%, 90%, 68%). tf_cnn_benchmarks, synthetic data,
   fp32, batch 64 a GPU. Efficiency: images/s on N GPUs over N times one GPU's.

Clusters: ``examples/byteps-v100-tcp20.toml`` and ``examples/horovod-p100-roce25.toml``
(the machine count varied here). The V100 and P100 catalog rows are datasheet peaks with
assumed efficiencies (``sim/data/hardware.csv`` says which); TensorFlow's kernels and
its Horovod tensor fusion are not modelled; these are shapes, not calibrations.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pandas as pd

from sim.io import atomic_write_text
from sim.spec.cluster import load_cluster
from sim.spec.plan import Plan
from sim.spec.zoo import load_any
from sim.strategies import simulate_sync

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "experiments" / "results"
BATCH = 64  # images a GPU
BYTEPS = {"architecture": "ps", "placement": "dedicated", "aggregate": "node",
          "partition_MB": 4.0}
PUBLISHED_BYTEPS = {"resnet50": 0.44, "vgg16": 1.00}  # BytePS over Horovod, 8 machines
PUBLISHED_HOROVOD = {128: {"inception-v3": 0.90, "resnet101": 0.90, "vgg16": 0.79},
                     512: {"inception-v3": 0.90, "resnet101": 0.90, "vgg16": 0.68}}


def _rate(model: str, cluster_file: str, nodes: int, comm: object) -> float:
    """Images a second, BSP, ``nodes`` machines of the cluster file, one worker a GPU."""
    c = load_cluster(str(ROOT / cluster_file))
    c = dataclasses.replace(c, nodes=nodes)
    n = c.world_size
    comm = dict(comm, servers=nodes) if isinstance(comm, dict) else comm
    plan = Plan(global_batch_size=BATCH * n, seq_len=1, dp=n, dtype="fp32",
                communication=comm)  # type: ignore[arg-type]
    return simulate_sync(load_any(model), c, plan, "des", steps=12).samples_per_s


def byteps_rows() -> list[dict[str, object]]:
    rows = []
    for model, published in PUBLISHED_BYTEPS.items():
        for nodes in (2, 4, 8):
            horovod = _rate(model, "examples/byteps-v100-tcp20.toml", nodes, "allreduce")
            byteps = _rate(model, "examples/byteps-v100-tcp20.toml", nodes, BYTEPS)
            rows.append({"study": "byteps-vs-horovod", "model": model, "gpus": nodes * 8,
                         "horovod_images_per_s": horovod, "byteps_images_per_s": byteps,
                         "predicted": byteps / horovod - 1,
                         "published": published if nodes == 8 else None})
            print(f"{model:12s} {nodes * 8:3d} GPUs: Horovod {horovod:8.0f} img/s, BytePS "
                  f"{byteps:8.0f} img/s, BytePS {rows[-1]['predicted']:+.0%}"
                  + (f" (published {published:+.0%})" if nodes == 8 else ""), flush=True)
    return rows


def horovod_rows() -> list[dict[str, object]]:
    rows = []
    for model in ("inception-v3", "resnet101", "vgg16"):
        one = _one_gpu(model)
        for gpus in (8, 32, 128, 512):
            rate = _rate(model, "examples/horovod-p100-roce25.toml", gpus // 4, "allreduce")
            eff = rate / (gpus * one)
            published = PUBLISHED_HOROVOD.get(gpus, {}).get(model)
            rows.append({"study": "horovod-scaling", "model": model, "gpus": gpus,
                         "images_per_s": rate, "one_gpu_images_per_s": one,
                         "predicted": eff, "published": published})
            print(f"{model:12s} {gpus:3d} GPUs: {rate:9.0f} img/s, efficiency {eff:.0%}"
                  + (f" (published {published:.0%})" if published else ""), flush=True)
    return rows


def _one_gpu(model: str) -> float:
    c = dataclasses.replace(load_cluster(str(ROOT / "examples/horovod-p100-roce25.toml")),
                            nodes=1, gpus_per_node=1)
    plan = Plan(global_batch_size=BATCH, seq_len=1, dp=1, dtype="fp32")
    return simulate_sync(load_any(model), c, plan, "des", steps=12).samples_per_s


def main() -> int:
    df = pd.DataFrame(byteps_rows() + horovod_rows())
    atomic_write_text(RESULTS / "sync_published.csv", df.to_csv(index=False,
                                                                float_format="%.4g"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
