"""The pipeline phase under DualPipeV in the analytic tier: every rank's program run pass
by pass (:func:`sim.layout.dualpipe.makespan`) with each pass's duration built from its
stage's compute and the rank's communication.

A pass's compute is its stage's: forward ``f``, backward ``b`` (a deferred one ``b - w``),
weight gradient ``w`` (the layers' GEMMs again), times the rank's compute scale. Its
expert all-to-alls are its stage's (``e_f`` forward, ``e_b`` backward; none in a weight
pass): whole, or scaled to the rank's exposed share under shared-expert overlap; under
the ``a2a`` overlap a pair's hide behind the pair's compute and TP collectives
(``max(0, E - C)``, each hidden second costing the exchange kernels' SM share) and an
unpaired pass waits for its own, which is where DualPipeV's overlap differs from
interleaved 1F1B's. The rank's other
per-micro-batch communication (TP, CP, pipeline transfers, ZeRO's per-micro-batch
collectives) is spread over its forward and input-gradient passes by their compute.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sim.layout.dualpipe import Pass, pass_counts, rank_of_stage, stages_of_rank
from sim.layout.dualpipe_time import makespan

__all__ = ["StagePasses", "RankTime", "dualpipev_pipeline"]


@dataclass(frozen=True)
class StagePasses:
    """Seconds of one virtual stage per micro-batch, unscaled: compute of the forward,
    the full backward and its weight part, and the forward's and backward's expert
    all-to-alls."""

    f: float
    b: float
    w: float
    e_f: float = 0.0
    e_b: float = 0.0


@dataclass(frozen=True)
class RankTime:
    """A pipeline rank per micro-batch: its whole time, its compute (scaled), its exposed
    expert all-to-all time (as the tier's averaged account has them) and its TP
    collectives (on the compute stream: what a pair's all-to-alls may hide behind)."""

    total: float
    compute: float
    ep_exposed: float
    tp: float = 0.0


def dualpipev_pipeline(pp: int, m: int, stages: Sequence[StagePasses],
                       ranks: Sequence[RankTime], a2a_overlap: bool, sm_share: float,
                       bound: bool = False, mirrored: bool = False) -> float:
    """Seconds of the pipeline phase (module docstring); ``bound``: a lower bound on them,
    in time independent of the number of micro-batches: no rank starts before the first
    micro-batch's forwards on the stages before its own are done, nor ends before its
    passes, end to end, are. ``mirrored``: DualPipe's programs (a rank's time per
    micro-batch of each chain, ``m / 2`` of them)."""
    durations = [_rank_durations(pp, r, stages, ranks[r], a2a_overlap, sm_share, mirrored)
                 for r in range(pp)]
    if bound:
        start = [0.0]
        for r in range(pp - 1):
            start.append(start[-1] + durations[r](Pass("F", 0, r)))
        return max(start[r] + sum(n * durations[r](p)
                                  for p, n in pass_counts(pp, m, r, mirrored))
                   for r in range(pp))

    def seconds(p: Pass) -> float:
        return durations[rank_of_stage(pp, p.stage, mirrored)](p)
    return makespan(pp, m, seconds, mirrored=mirrored)[0]


def _rank_durations(pp: int, r: int, stages: Sequence[StagePasses], rank: RankTime,
                    a2a_overlap: bool, sm_share: float, mirrored: bool = False
                    ) -> Callable[[Pass], float]:
    mine = [stages[s] for s in stages_of_rank(pp, r, mirrored)]
    work = sum(s.f + s.b for s in mine)
    if work <= 0:  # no layers: the rank's time over its forward and backward passes (four
        even = rank.total / 4  # a micro-batch: two chunks); a weight pass has nothing

        def flat(p: Pass) -> float:
            return {"FB": 2 * even, "W": 0.0}.get(p.kind, even)
        return flat
    k = rank.compute / work
    exchange = sum(s.e_f + s.e_b for s in mine)
    e_scale = 1.0 if a2a_overlap or exchange == 0 else rank.ep_exposed / exchange
    other = max(0.0, rank.total - rank.compute - rank.ep_exposed)
    inputs = sum(s.f + s.b - s.w for s in mine)
    spread = other / inputs if inputs > 0 else 0.0
    tp_share = rank.tp / inputs if inputs > 0 else 0.0

    def own(s: StagePasses, kind: str, deferred: bool) -> tuple[float, float]:
        """(compute with its share of the other communication, all-to-all) of a pass."""
        if kind == "W":
            return k * s.w, 0.0
        c = s.f if kind == "F" else s.b - s.w
        full = 0.0 if kind == "F" or deferred else k * s.w
        return k * c + spread * c + full, (s.e_f if kind == "F" else s.e_b) * e_scale

    def seconds(p: Pass) -> float:
        if p.kind != "FB":
            c, e = own(stages[p.stage], p.kind, p.deferred)
            return c + e
        (cf, ef), (cb, eb) = own(stages[p.stage], "F", False), own(stages[p.stage2], "B", False)
        if not a2a_overlap:
            return cf + ef + cb + eb
        sf, sb = stages[p.stage], stages[p.stage2]  # the pair's compute and TP collectives
        hidden = min(ef + eb, k * (sf.f + sb.b) + tp_share * (sf.f + sb.b - sb.w))
        return cf + cb + (ef + eb - hidden) + hidden * sm_share
    return seconds
