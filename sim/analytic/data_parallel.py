"""The analytic tier's data-parallel seconds of one pipeline rank: DDP's bucketed gradient
reduction (ZeRO-0/1/2) and ZeRO-3's per-layer weight gathers and gradient reduce-scatters,
each split into what waits and what runs beside compute."""

from __future__ import annotations

from dataclasses import dataclass

from sim.analytic.buckets import bucketed_s
from sim.analytic.context import Ctx
from sim.layout.inventory import rank_buckets
from sim.layout.memory import layer_rank_params, rank_params
from sim.layout.stages import StageLayers, rank_virtual_stages, virtual_stage_moe

__all__ = ["DPCost", "dp_costs", "hide"]


@dataclass(frozen=True)
class DPCost:
    """Data-parallel seconds: per micro-batch (ZeRO-2/3) and once after the last backward."""

    mb_exposed_s: float = 0.0
    mb_overlapped_s: float = 0.0
    tail_exposed_s: float = 0.0
    tail_overlapped_s: float = 0.0


def hide(comm_s: float, window_s: float) -> tuple[float, float]:
    """(exposed, overlapped) seconds of ``comm_s`` run beside ``window_s`` of compute."""
    return max(0.0, comm_s - window_s), min(comm_s, window_s)


def _bucketed(x: Ctx, rank: int, kind: str) -> float:
    x.buckets = x.buckets or rank_buckets(x.m, x.p)
    return bucketed_s(x.coll, kind, x.buckets[rank], x.p.grad_bytes, x.bucket_s)


def dp_costs(x: Ctx, st: StageLayers, compute_s: float, rank: int) -> DPCost:
    """Gradient reduction and ZeRO weight gathers of one pipeline rank. Gathered weights
    move in the training dtype (fp32 for fp32 training, else 16 bits), gradients in
    ``plan.grad_reduce_dtype``; ZeRO-0/1/2 reduce in DDP's buckets."""
    dense, expert = rank_params(x.m, x.p, st)

    def both(kind: str, scale: float = 1.0) -> float:
        width = x.e if kind == "all_gather" else x.p.grad_bytes
        return (x.coll("dp", kind, dense * width * scale)
                + x.coll("edp", kind, expert * width * scale))

    backward_s = st.dense * x.dense.backward + st.moe * x.moe.backward
    window_s = backward_s * x.overlap if x.p.overlap_grad_reduce else 0.0
    if x.p.zero_stage == 3:  # gather per pass, reduce-scatter per micro-batch, prefetched
        passes = 2  # forward, backward (a recomputed forward reuses the backward's gather)
        comm_s = passes * both("all_gather") + both("reduce_scatter")
        first_layer_s = (_z3_first_gathers(x, rank)
                         + both("reduce_scatter", 1 / st.total))  # nothing to hide behind
        exposed, overlapped = hide(comm_s - first_layer_s,
                                    (compute_s - first_layer_s) * x.overlap)
        return DPCost(exposed + first_layer_s, overlapped)
    if x.p.zero_stage == 2:  # sharded gradients: reduce-scatter every micro-batch
        exposed, overlapped = hide(_bucketed(x, rank, "reduce_scatter"), window_s)
        return DPCost(exposed, overlapped, both("all_gather"))
    if x.p.zero_stage == 1:
        exposed, overlapped = hide(_bucketed(x, rank, "reduce_scatter"), window_s)
        return DPCost(tail_exposed_s=exposed + both("all_gather"), tail_overlapped_s=overlapped)
    exposed, overlapped = hide(_bucketed(x, rank, "all_reduce"), window_s)
    return DPCost(tail_exposed_s=exposed, tail_overlapped_s=overlapped)


def _z3_first_gathers(x: Ctx, rank: int) -> float:
    """ZeRO-3 gathers nothing hides, per micro-batch: each chunk (virtual stage) of the
    pipeline rank prefetches its next layer's weights behind the current one, but waits
    for the first it runs, in the forward (its first layer) and the backward (its last),
    as the DES does (:meth:`sim.des.data_parallel.DataParallel.z3_gather`)."""
    flags = virtual_stage_moe(x.p, x.m)

    def gather(moe: bool) -> float:
        dense, expert = layer_rank_params(x.m, x.p, moe)
        return (x.coll("dp", "all_gather", dense * x.e)
                + x.coll("edp", "all_gather", expert * x.e))
    return sum(gather(flags[vs][0]) + gather(flags[vs][-1])
               for vs in rank_virtual_stages(x.p, rank) if flags[vs])
