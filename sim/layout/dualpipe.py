"""DualPipeV: DeepSeek's DualPipe cut in half (Sea AI Lab's "cut-in-half"), as DeepSeek's
reference code (``deepseek-ai/DualPipe``, ``dualpipev.py``) and torch's
``ScheduleDualPipeV`` run it.

Each of the ``pp`` ranks holds two of the ``2 pp`` virtual stages, in a V: rank ``r`` holds
stage ``r`` (phase 0, the way down) and stage ``2 pp - 1 - r`` (phase 1, the way back), so
rank 0 holds the first and the last stage (the embedding and the loss) and the turn at rank
``pp - 1`` needs no transfer. The backward is split: ``B`` computes the input gradient (and,
where it is not deferred, the weight gradient too), ``W`` a deferred weight gradient (zero
bubble), and ``FB`` is one phase's forward beside the other's backward, the pair whose
communication and computation DualPipe overlaps. A rank's program, in the reference's eight
steps (``m >= 2 pp`` micro-batches)::

    1  2 (pp - r - 1) x F0            5  (pp - r - 1) x B1, FB(F1, B0)
    2  (r + 1) x F0, F1               6  (r + 1) x B1, B0   (the second half deferring W)
    3  (pp - r - 1) x B1*, W, F1      7  (pp - r - 1) x W, B0*
    4  (m - 2 pp + r + 1) x FB(F0, B1), FB(F1, B0)     8  (r + 1) x W

(``*``: the weight gradient deferred). :func:`makespan` runs the programs against the
dependencies between stages, the duration of each pass given, which is how both tiers time
the schedule and how the tests check it against the published bubble,
``(pp - 1)(F&B + B - 3W)`` for ``2 pp`` stages of one chunk's passes.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["Pass", "rank_of_stage", "stages_of_rank", "rank_program", "rank_ops",
           "paired_share", "peak_activations", "makespan", "published_bubble", "uniform"]


@dataclass(frozen=True)
class Pass:
    """One pass of a rank's program: ``kind`` ``F`` (forward), ``B`` (backward: input
    gradient, and the weight gradient unless ``deferred``), ``W`` (a deferred weight
    gradient) or ``FB`` (the forward of ``(mb, stage)`` beside the backward of
    ``(mb2, stage2)``)."""

    kind: str
    mb: int
    stage: int
    deferred: bool = False
    mb2: int = -1
    stage2: int = -1


def rank_of_stage(pp: int, stage: int) -> int:
    return stage if stage < pp else 2 * pp - 1 - stage


def stages_of_rank(pp: int, rank: int) -> tuple[int, int]:
    """The rank's virtual stages, phase 0 first."""
    return rank, 2 * pp - 1 - rank


class _Program:
    """Hands out each phase's next micro-batch, in order, as the reference's counters do."""

    def __init__(self, pp: int, rank: int) -> None:
        self.stage = stages_of_rank(pp, rank)
        self.f, self.b = [0, 0], [0, 0]
        self.queue: deque[tuple[int, int]] = deque()
        self.out: list[Pass] = []

    def fwd(self, phase: int) -> Pass:
        self.f[phase] += 1
        return Pass("F", self.f[phase] - 1, self.stage[phase])

    def bwd(self, phase: int, defer: bool = False) -> Pass:
        self.b[phase] += 1
        mb, stage = self.b[phase] - 1, self.stage[phase]
        if defer:
            self.queue.append((mb, stage))
        return Pass("B", mb, stage, defer)

    def add(self, *passes: Pass) -> None:
        self.out += passes

    def weight(self) -> None:
        mb, stage = self.queue.popleft()
        self.out.append(Pass("W", mb, stage))

    def pair(self, f_phase: int, b_phase: int) -> None:
        f, b = self.fwd(f_phase), self.bwd(b_phase)
        self.out.append(Pass("FB", f.mb, f.stage, False, b.mb, b.stage))


def rank_program(pp: int, m: int, rank: int) -> list[Pass]:
    """Rank ``rank``'s passes in order (module docstring)."""
    if pp < 1 or m < 2 * pp:
        raise ValueError(f"DualPipeV needs m >= 2 pp micro-batches (m {m}, pp {pp})")
    g, r, down = _Program(pp, rank), rank, pp - rank - 1
    g.add(*(g.fwd(0) for _ in range(2 * down)))
    for _ in range(r + 1):
        g.add(g.fwd(0), g.fwd(1))
    for _ in range(down):
        g.add(g.bwd(1, defer=True))
        g.weight()
        g.add(g.fwd(1))
    for i in range(m - 2 * pp + r + 1):
        if i == 0 and r == pp - 1:  # the turn: not overlapped, as in the reference
            g.add(g.fwd(0), g.bwd(1))
        else:
            g.pair(0, 1)
        g.pair(1, 0)
    for _ in range(down):
        g.add(g.bwd(1))
        g.pair(1, 0)
    half = (r + 1) // 2
    for i in range(r + 1):  # the second half defers its weight gradients
        g.add(g.bwd(1, defer=i > half or (i == half and r % 2 == 1)))
        g.add(g.bwd(0, defer=i >= half))
    for _ in range(down):
        g.weight()
        g.add(g.bwd(0, defer=True))
    for _ in range(r + 1):
        g.weight()
    assert not g.queue and g.f == g.b == [m, m], "DualPipeV program inconsistent"
    return g.out


def rank_ops(pp: int, m: int, rank: int) -> list[tuple[str, int, int]]:
    """The program as ``(kind, micro_batch, chunk)`` ops in order (chunk 0: the way down,
    1: the way back); a pair is its forward, then its backward."""
    chunk = {s: c for c, s in enumerate(stages_of_rank(pp, rank))}
    out: list[tuple[str, int, int]] = []
    for p in rank_program(pp, m, rank):
        if p.kind == "FB":
            out += [("F", p.mb, chunk[p.stage]), ("B", p.mb2, chunk[p.stage2])]
        else:
            out.append((p.kind, p.mb, chunk[p.stage]))
    return out


def paired_share(pp: int, m: int, rank: int) -> float:
    """The share of the rank's forward and backward passes that run in pairs."""
    pairs = sum(p.kind == "FB" for p in rank_program(pp, m, rank))
    return 2 * pairs / (4 * m)


def peak_activations(pp: int, m: int, rank: int) -> int:
    """The most chunk activations the rank holds at once: each from its forward until its
    weight gradient is done (with its backward, or the deferred ``W``)."""
    live = peak = 0
    for p in rank_program(pp, m, rank):
        if p.kind in ("F", "FB"):
            live += 1
            peak = max(peak, live)
        if (p.kind in ("B", "FB") and not p.deferred) or p.kind == "W":
            live -= 1
    return peak


Durations = Callable[[Pass], float]


def _needs(p: Pass, last: int) -> list[tuple[str, int, int]]:
    """The passes (kind, mb, stage) that must be done before ``p`` starts."""
    out: list[tuple[str, int, int]] = []
    if p.kind in ("F", "FB") and p.stage > 0:
        out.append(("F", p.mb, p.stage - 1))
    if p.kind == "B" or p.kind == "FB":
        mb, stage = (p.mb, p.stage) if p.kind == "B" else (p.mb2, p.stage2)
        out.append(("F", mb, stage) if stage == last else ("B", mb, stage + 1))
    if p.kind == "W":
        out.append(("B", p.mb, p.stage))
    return out


def _done_as(p: Pass) -> list[tuple[str, int, int]]:
    if p.kind == "FB":
        return [("F", p.mb, p.stage), ("B", p.mb2, p.stage2)]
    return [(p.kind, p.mb, p.stage)]


def makespan(pp: int, m: int, duration: Durations, transfer: float = 0.0
             ) -> tuple[float, list[float]]:
    """(time the last pass ends, each rank's busy seconds): every rank runs its program in
    order, a pass starting once the rank is free and what it needs is done (``transfer``
    seconds later when that was on another rank)."""
    programs = [rank_program(pp, m, r) for r in range(pp)]
    last = 2 * pp - 1
    done: dict[tuple[str, int, int], float] = {}
    free, busy, at = [0.0] * pp, [0.0] * pp, [0] * pp
    while any(at[r] < len(programs[r]) for r in range(pp)):
        moved = False
        for r in range(pp):
            while at[r] < len(programs[r]):
                p = programs[r][at[r]]
                needs = _needs(p, last)
                if any(n not in done for n in needs):
                    break
                start = max([free[r]] + [done[n] + (transfer if rank_of_stage(pp, n[2]) != r
                                                    else 0.0) for n in needs])
                seconds = duration(p)
                free[r], busy[r] = start + seconds, busy[r] + seconds
                for key in _done_as(p):
                    done[key] = free[r]
                at[r] += 1
                moved = True
        if not moved:
            raise RuntimeError("DualPipeV programs deadlock")  # a bug, not bad input
    return max(free), busy


def published_bubble(pp: int, f: float, b: float, w: float, fb: float) -> float:
    """DeepSeek's table: ``(PP/2 - 1)(F&B + B - 3W)`` for ``PP = 2 pp`` stages, ``B`` a
    full backward (input and weight gradients)."""
    return (pp - 1) * (fb + b - 3 * w)


def uniform(f: float, b: float, w: float, fb: float | None = None,
            ) -> Callable[[Pass], float]:
    """Durations of identical stages: ``b`` a full backward, ``w`` its weight part."""
    table = {"F": f, "W": w, "FB": f + b if fb is None else fb}

    def seconds(p: Pass) -> float:
        return (b - w if p.deferred else b) if p.kind == "B" else table[p.kind]
    return seconds

