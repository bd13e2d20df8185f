"""The analytic tier's data-parallel seconds of one pipeline rank: DDP's bucketed gradient
reduction (ZeRO-0/1/2) and ZeRO-3's per-layer weight gathers and gradient reduce-scatters,
each split into what waits and what runs beside compute."""

from __future__ import annotations

from dataclasses import dataclass

from sim.analytic.buckets import bucketed_s
from sim.analytic.context import Ctx
from sim.layout.inventory import chunk_buckets, rank_buckets
from sim.layout.memory import layer_rank_params, rank_params
from sim.layout.stages import StageLayers, rank_virtual_stages, virtual_stage_moe
from sim.spec.zero import regathers

__all__ = ["DPCost", "dp_costs"]


@dataclass(frozen=True)
class DPCost:
    """Data-parallel seconds: per micro-batch (ZeRO-2/3) and once after the last backward."""

    mb_exposed_s: float = 0.0
    mb_overlapped_s: float = 0.0
    tail_exposed_s: float = 0.0
    tail_overlapped_s: float = 0.0


def _hide(comm_s: float, window_s: float) -> tuple[float, float]:
    """(exposed, overlapped) seconds of ``comm_s`` run beside ``window_s`` of compute."""
    return max(0.0, comm_s - window_s), min(comm_s, window_s)


def _bucketed(x: Ctx, rank: int, kind: str) -> float:
    x.buckets = x.buckets or rank_buckets(x.m, x.p)
    return bucketed_s(x.coll, kind, x.buckets[rank], x.p.grad_bytes, x.bucket_s)


def _pair(x: Ctx, kind: str, dense: float, expert: float) -> float:
    """Seconds of one ``kind`` over ``dense`` parameters (data-parallel group) and
    ``expert`` ones (expert-data-parallel group): weights in the training dtype, gradients
    in ``plan.grad_reduce_dtype``."""
    width = x.e if kind == "all_gather" else x.p.grad_bytes
    return x.coll("dp", kind, dense * width) + x.coll("edp", kind, expert * width)


def dp_costs(x: Ctx, st: StageLayers, compute_s: float, rank: int, beside_s: float = 0.0
             ) -> DPCost:
    """Gradient reduction and ZeRO weight gathers of one pipeline rank. Gathered weights
    move in the training dtype (fp32 for fp32 training, else 16 bits), gradients in
    ``plan.grad_reduce_dtype``; ZeRO-0/1/2 reduce in DDP's buckets. ``beside_s``: seconds
    a micro-batch waits on collectives whose links ZeRO-2/3's traffic does not use (it
    goes on beside them as beside compute; ZeRO-2's reduce-scatters beside the backward's
    share)."""
    dense, expert = rank_params(x.m, x.p, st)

    def both(kind: str) -> float:
        return _pair(x, kind, dense, expert)

    backward_s = st.dense * x.dense.backward + st.moe * x.moe.backward
    window_s = backward_s * x.overlap if x.p.overlap_grad_reduce else 0.0
    if x.p.zero_stage == 3:  # gather per pass, reduce-scatter per micro-batch, prefetched
        # forward, backward (a recomputed forward reuses the backward's gather); the
        # forward's only where the weights are kept for the backward
        passes = 2 if regathers(x.p) else 1
        comm_s = passes * both("all_gather") + both("reduce_scatter")
        waits = min(comm_s, _z3_waits(x, rank))  # nothing to hide behind
        exposed, overlapped = _hide(comm_s - waits,
                                   max(0.0, compute_s + beside_s - waits) * x.overlap)
        return DPCost(exposed + waits, overlapped)
    if x.p.zero_stage == 2:  # sharded gradients: reduce-scatter every micro-batch beside the
        # backward's compute and its share of the collectives on other links; each chunk's
        # backward ends when they have (sim.des.data_parallel.DataParallel.settle): its last
        # bucket, started at the end, waits
        if compute_s > 0:
            window_s *= 1 + beside_s / compute_s
        total = _bucketed(x, rank, "reduce_scatter")
        waits = min(total, _z2_waits(x, rank))
        exposed, overlapped = _hide(total - waits, window_s)
        return DPCost(exposed + waits, overlapped, both("all_gather"))
    if x.p.zero_stage == 1:
        exposed, overlapped = _hide(_bucketed(x, rank, "reduce_scatter"), window_s)
        return DPCost(tail_exposed_s=exposed + both("all_gather"), tail_overlapped_s=overlapped)
    exposed, overlapped = _hide(_bucketed(x, rank, "all_reduce"), window_s)
    return DPCost(tail_exposed_s=exposed, tail_overlapped_s=overlapped)


def _z2_waits(x: Ctx, rank: int) -> float:
    """ZeRO-2: each chunk's last bucket, flushed at the end of its backward, which waits
    for it."""
    x.chunk_buckets = x.chunk_buckets or chunk_buckets(x.m, x.p)
    return sum(bucketed_s(x.coll, "reduce_scatter", chunk[-1:], x.p.grad_bytes, x.bucket_s)
               for chunk in x.chunk_buckets[rank])


def _z3_waits(x: Ctx, rank: int) -> float:
    """ZeRO-3 collectives nothing hides, per micro-batch, as the DES runs them
    (:class:`sim.des.data_parallel.DataParallel`): each chunk (virtual stage) of the
    pipeline rank prefetches its next layer's weights behind the current one but waits for
    the first it runs, in the forward (its first layer) and, unless it kept the forward's,
    the backward (its last); and its backward ends when the reduce-scatter of the last
    layer it ran (its first) has."""
    flags = virtual_stage_moe(x.p, x.m)

    def one(kind: str, moe: bool) -> float:
        return _pair(x, kind, *layer_rank_params(x.m, x.p, moe))
    again = regathers(x.p)
    return sum(one("all_gather", flags[vs][0]) + again * one("all_gather", flags[vs][-1])
               + one("reduce_scatter", flags[vs][0])
               for vs in rank_virtual_stages(x.p, rank) if flags[vs])
