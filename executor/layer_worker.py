"""One rank of ``trainsim profile tp`` (started by torchrun; see :mod:`executor.layer_profile`).

Builds the executor's own one-layer model, applies the executor's tensor-parallel plan
(:func:`executor.parallel.apply_tp`: DTensor ``parallelize_module``, vocab-parallel output,
sequence parallelism when asked), and times, for each requested shape:

* ``tp-layer[-sp]``: one transformer layer, forward, then backward, as a training step runs
  it on this rank: DTensor dispatch, the layer's TP collectives, autograd;
* ``tp-head[-sp]``: final norm, vocab-parallel output projection and ``loss_parallel``
  cross-entropy, forward and backward.

Each sample starts after a barrier and is the slowest rank's time (an all-reduce of the
ranks' elapsed times), as a step waits for the slower rank; a row keeps the median sample
with its 10th and 90th percentiles. Rank 0 returns the rows.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from executor.model import Transformer
from executor.parallel import apply_tp
from executor.rank import progress, rank_main
from profiler.timing import summarize
from sim.spec.model import ModelSpec

__all__ = ["main", "time_ranks", "slowest", "stats", "sync", "run_shapes"]

Fn = Callable[[], object]


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def time_ranks(fn: Fn, device: torch.device, warmup: int, samples: int) -> list[float]:
    """Seconds of ``fn`` per sample, the slowest rank's, after a barrier each."""
    for _ in range(warmup):
        fn()
    sync(device)
    out = []
    for _ in range(samples):
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        sync(device)
        out.append(slowest(time.perf_counter() - t0))
    return out


def slowest(seconds: float) -> float:
    """The largest of every rank's ``seconds`` (a step waits for the slowest rank)."""
    took = torch.tensor([seconds], dtype=torch.float64)
    dist.all_reduce(took, op=dist.ReduceOp.MAX)
    return float(took)


def stats(prefix: str, samples: list[float]) -> dict[str, float]:
    """A row's median, 10th and 90th percentile columns for ``prefix`` (fwd, bwd)."""
    st = summarize(samples)
    return {f"{prefix}_median_s": st.median_s, f"{prefix}_p10_s": st.p10_s,
            f"{prefix}_p90_s": st.p90_s}


def _fwd_bwd(forward: Callable[[], torch.Tensor], device: torch.device, warmup: int,
             samples: int) -> tuple[list[float], list[float]]:
    """Forward samples, and backward samples (each over a graph kept from one forward)."""
    fwd = time_ranks(forward, device, warmup, samples)
    out = forward()
    grad = torch.ones_like(out) if out.dim() == 0 else torch.randn_like(out)

    def backward() -> None:
        torch.autograd.backward(out, grad, retain_graph=True)

    return fwd, time_ranks(backward, device, warmup, samples)


def _model(spec: ModelSpec, seq: int, sp: bool, device: torch.device, dtype: torch.dtype
           ) -> Transformer:
    from torch.distributed.device_mesh import DeviceMesh

    model = Transformer(spec, seq).to(device=device, dtype=dtype)
    mesh = DeviceMesh(device.type, torch.arange(dist.get_world_size()), mesh_dim_names=("tp",))
    apply_tp(model, mesh, sp)
    return model


def _shape_rows(cfg: dict[str, Any], shape: dict[str, Any], device: torch.device
                ) -> list[dict[str, Any]]:
    """The layer row and the head row of one (micro-batch, seq, sp) shape."""
    spec = ModelSpec.from_dict(cfg["model"])
    dtype = getattr(torch, cfg["torch_dtype"])
    mb, seq, sp, tp = shape["micro_batch"], shape["seq_len"], shape["sp"], dist.get_world_size()
    model = _model(spec, seq, sp, device, dtype)
    local_seq = seq // tp if sp else seq
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(mb, local_seq, spec.hidden_size, generator=g) * 0.02).to(device, dtype)
    x.requires_grad_()
    rope = (model.rope_cos, model.rope_sin) if hasattr(model, "rope_cos") else None
    layer = model.layers["0"]
    target = torch.randint(0, spec.vocab_size, (mb, seq), generator=g).to(device)
    assert model.norm is not None and model.output is not None

    def head() -> torch.Tensor:
        logits = model.output(model.norm(x))  # type: ignore[misc]
        return F.cross_entropy(logits.flatten(0, 1).float(), target.flatten())

    from torch.distributed.tensor.parallel import loss_parallel

    suffix = "-sp" if sp else ""
    rows = []
    for op, fn, ctx in ((f"tp-layer{suffix}", lambda: layer(x, rope), contextlib.nullcontext),
                        (f"tp-head{suffix}", head, loss_parallel)):
        with ctx():
            fwd, bwd = _fwd_bwd(fn, device, cfg["warmup"], cfg["samples"])
        rows.append({"op": op, **shape["keys"][op], **stats("fwd", fwd), **stats("bwd", bwd),
                     "repeats": len(fwd)})
    return rows


def run_shapes(cfg: dict[str, Any], out: Path, rank: int,
               shape_rows: Callable[[dict[str, Any], dict[str, Any], torch.device],
                                    list[dict[str, Any]]]) -> dict[str, Any]:
    """Every shape of ``cfg`` in turn, progress reported; rank 0 returns the rows."""
    device = torch.device(cfg["device"])
    rows: list[dict[str, Any]] = []
    for i, shape in enumerate(cfg["shapes"]):
        progress(out, rank, i + 1, f"shape {i + 1}/{len(cfg['shapes'])}")
        rows += shape_rows(cfg, shape, device)
    return {"rows": rows if rank == 0 else []}


def run(cfg: dict[str, Any], out: Path, rank: int) -> dict[str, Any]:
    return run_shapes(cfg, out, rank, _shape_rows)


def main(argv: list[str] | None = None) -> int:
    return rank_main(run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
