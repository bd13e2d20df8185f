"""Timing DualPipe(V)'s programs (:mod:`sim.layout.dualpipe`) pass by pass: each rank runs
its program in order against the dependencies between stages, which is how both tiers
time the schedules and how the tests check them against DeepSeek's published bubble."""

from __future__ import annotations

import functools
from collections.abc import Callable

from sim.layout.dualpipe import (
    Pass,
    chain_length,
    chain_microbatches,
    rank_of_stage,
    rank_program,
)

__all__ = ["Durations", "makespan", "published_bubble", "uniform"]

Durations = Callable[[Pass], float]


def _needs(p: Pass, chain: int) -> list[tuple[str, int, int]]:
    """The passes (kind, mb, stage) that must be done before ``p`` starts (a chain of
    ``chain`` stages: a micro-batch's first and last stage)."""
    out: list[tuple[str, int, int]] = []
    if p.kind in ("F", "FB") and p.stage % chain:
        out.append(("F", p.mb, p.stage - 1))
    if p.kind == "B" or p.kind == "FB":
        mb, stage = (p.mb, p.stage) if p.kind == "B" else (p.mb2, p.stage2)
        out.append(("F", mb, stage) if stage % chain == chain - 1 else ("B", mb, stage + 1))
    if p.kind == "W":
        out.append(("B", p.mb, p.stage))
    return out


def _done_as(p: Pass) -> list[tuple[str, int, int]]:
    if p.kind == "FB":
        return [("F", p.mb, p.stage), ("B", p.mb2, p.stage2)]
    return [(p.kind, p.mb, p.stage)]


_Step = tuple[Pass, tuple[tuple[int, bool], ...], tuple[int, ...]]


@functools.lru_cache(maxsize=8)
def _steps(pp: int, m: int, mirrored: bool) -> tuple[tuple[_Step, ...], ...]:
    """Each rank's program as (pass, what it needs as (event, on another rank), the events
    it completes), the events ``(kind, mb, stage)`` numbered."""
    chain = chain_length(pp, mirrored)

    def event(n: tuple[str, int, int]) -> int:
        return (n[1] * 2 * pp + n[2]) * 2 + (n[0] == "B")
    return tuple(tuple((p, tuple((event(n), rank_of_stage(pp, n[2], mirrored) != r)
                                 for n in _needs(p, chain)),
                        tuple(event(n) for n in _done_as(p)))
                       for p in rank_program(pp, m, r, mirrored)) for r in range(pp))


def makespan(pp: int, m: int, duration: Durations, transfer: float = 0.0,
             mirrored: bool = False) -> tuple[float, list[float]]:
    """(time the last pass ends, each rank's busy seconds): every rank runs its program in
    order, a pass starting once the rank is free and what it needs is done (``transfer``
    seconds later when that was on another rank). ``duration`` depends on a pass's kind,
    stages and deferral, not on its micro-batch (it is asked once for each).
    ``mirrored``: DualPipe's programs (``m`` micro-batches, half a chain)."""
    programs = _steps(pp, m, mirrored)
    asked: dict[tuple[str, int, bool, int], float] = {}
    seconds = []
    for program in programs:
        row = []
        for p, _, _ in program:
            key = (p.kind, p.stage, p.deferred, p.stage2)
            if key not in asked:
                asked[key] = duration(p)
            row.append(asked[key])
        seconds.append(row)
    done: list[float | None] = [None] * (4 * pp * chain_microbatches(m, mirrored))
    free, busy, at = [0.0] * pp, [0.0] * pp, [0] * pp
    while any(at[r] < len(programs[r]) for r in range(pp)):
        moved = False
        for r in range(pp):
            program, i, t = programs[r], at[r], free[r]
            while i < len(program):
                start, (_, needs, dones) = t, program[i]
                for e, cross in needs:
                    d = done[e]
                    if d is None:
                        break
                    if cross:
                        d += transfer
                    if d > start:
                        start = d
                else:
                    t = start + seconds[r][i]
                    busy[r] += seconds[r][i]
                    for e in dones:
                        done[e] = t
                    i += 1
                    continue
                break
            moved = moved or i > at[r]
            at[r], free[r] = i, t
        if not moved:
            raise RuntimeError("DualPipe(V) programs deadlock")  # a bug, not bad input
    return max(free), busy


def published_bubble(pp: int, f: float, b: float, w: float, fb: float,
                     mirrored: bool = False) -> float:
    """DeepSeek's table: ``(PP/2 - 1)(F&B + B - 3W)`` for ``PP`` stages (``2 pp`` in a V on
    ``pp`` ranks; ``pp`` under DualPipe), ``B`` a full backward (input and weight
    gradients)."""
    return ((pp // 2 if mirrored else pp) - 1) * (fb + b - 3 * w)


def uniform(f: float, b: float, w: float, fb: float | None = None,
            ) -> Callable[[Pass], float]:
    """Durations of identical stages: ``b`` a full backward, ``w`` its weight part."""
    table = {"F": f, "W": w, "FB": f + b if fb is None else fb}

    def seconds(p: Pass) -> float:
        return (b - w if p.deferred else b) if p.kind == "B" else table[p.kind]
    return seconds
