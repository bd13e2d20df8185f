"""One rank of ``trainsim profile fsdp`` (started by torchrun; see :mod:`executor.fsdp_profile`).

Builds a root module holding parameters of its own and ``units`` child modules, every one of
them ``params`` parameters in ``tensors`` matrices of 256 columns, and times a forward and
a backward of it twice, for each requested shape:

* ``fsdp-plain``: the modules as they are, on every rank;
* ``fsdp-units``: each child and then the root wrapped by FSDP2 ``fully_shard`` over all
  ranks, resharding after the forward, with the executor's mixed-precision policy
  (:func:`executor.parallel._fsdp`: bf16 on the wire for bf16, fp32 otherwise): every
  unit is all-gathered in the forward and again in the backward, and its gradients are
  reduce-scattered (checked: :func:`_check_collectives`).

The work inside the modules (a sum over every parameter, and its gradient) is the same in
both, so the difference is FSDP2's: its collectives, and the host-side work around them
(copies into and out of the collectives' buffers, the hooks and their bookkeeping), which
the cost model takes as what remains once it has charged the collectives itself
(:mod:`sim.cost.fsdp`). Gradients are dropped before every sample, as an optimizer step
leaves them. Each sample starts after a barrier and is the slowest rank's time; a row
keeps the median sample with its 10th and 90th percentiles. Rank 0 returns the rows.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from executor.fsdp_profile import COLUMNS
from executor.layer_worker import run_shapes, slowest, stats, sync
from executor.rank import rank_main

__all__ = ["main"]


class _Unit(nn.Module):
    def __init__(self, params: int, tensors: int) -> None:
        super().__init__()
        rows = params // (tensors * COLUMNS)  # a whole number (executor.fsdp_profile)
        self.weights = nn.ParameterList(
            nn.Parameter(torch.randn(rows, COLUMNS) * 0.02) for _ in range(tensors))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for w in self.weights:
            x = x + w.sum()
        return x


class _Root(_Unit):
    def __init__(self, params: int, tensors: int, units: int) -> None:
        super().__init__(params, tensors)
        self.units = nn.ModuleList(_Unit(params, tensors) for _ in range(units))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = super().forward(x)
        for u in self.units:
            x = u(x)
        return x


def _shard(root: _Root, dtype: torch.dtype, device: torch.device) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    # the executor's policy (executor.parallel._fsdp): bf16 on the wire for bf16 plans,
    # the fp32 parameters otherwise (fp16 plans too)
    mp = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=dtype) \
        if dtype == torch.bfloat16 else MixedPrecisionPolicy()
    for u in root.units:
        fully_shard(u, mesh=mesh, mp_policy=mp, reshard_after_forward=True)
    fully_shard(root, mesh=mesh, mp_policy=mp, reshard_after_forward=True)


def _samples(root: nn.Module, device: torch.device, warmup: int, samples: int
             ) -> tuple[list[float], list[float]]:
    """(forward, backward) seconds per sample, the slowest rank's."""
    x = torch.zeros(4, device=device)
    fwd, bwd = [], []
    for i in range(warmup + samples):
        for p in root.parameters():
            p.grad = None
        sync(device)
        dist.barrier()
        t0 = time.perf_counter()
        out = root(x).sum()
        sync(device)
        t1 = time.perf_counter()
        out.backward()
        sync(device)
        t2 = time.perf_counter()
        f, b = slowest(t1 - t0), slowest(t2 - t1)
        if i >= warmup:
            fwd.append(f)
            bwd.append(b)
    return fwd, bwd


def _check_collectives(root: nn.Module, device: torch.device, units: int) -> None:
    """One more step, recorded: FSDP2 must have gathered every unit (the root too) in the
    forward and again in the backward and reduce-scattered it once, as the cost model takes
    them out (:mod:`sim.cost.fsdp`); a torch that does otherwise is refused, not fitted."""
    from executor.collectives import CollectiveRecorder

    for p in root.parameters():
        p.grad = None
    with CollectiveRecorder({}) as rec:
        root(torch.zeros(4, device=device)).sum().backward()
    seen = Counter(kind for kind, *_ in rec.log)
    want = Counter({"all_gather": 2 * (units + 1), "reduce_scatter": units + 1})
    if seen != want:
        raise RuntimeError(f"FSDP2 issued {dict(seen)} for {units + 1} units, where the cost "
                           f"model takes out {dict(want)}: this torch shards differently")


def _shape_rows(cfg: dict[str, Any], shape: dict[str, Any], device: torch.device
                ) -> list[dict[str, Any]]:
    dtype = getattr(torch, cfg["torch_dtype"])
    rows = []
    for op in ("fsdp-plain", "fsdp-units"):
        torch.manual_seed(0)
        # parameters are kept in fp32 (FSDP2 casts them for the wire, as the executor's do)
        root = _Root(shape["params"], cfg["tensors"], shape["units"]).to(device)
        if op == "fsdp-units":
            _shard(root, dtype, device)
        fwd, bwd = _samples(root, device, cfg["warmup"], cfg["samples"])
        if op == "fsdp-units":
            _check_collectives(root, device, shape["units"])
        rows.append({"op": op, **shape["key"], **stats("fwd", fwd), **stats("bwd", bwd),
                     "repeats": len(fwd)})
    return rows


def run(cfg: dict[str, Any], out: Path, rank: int) -> dict[str, Any]:
    return run_shapes(cfg, out, rank, _shape_rows)


def main(argv: list[str] | None = None) -> int:
    return rank_main(run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
