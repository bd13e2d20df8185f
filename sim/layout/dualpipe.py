"""DualPipeV: DeepSeek's DualPipe cut in half (Sea AI Lab's "cut-in-half"), as DeepSeek's
reference code (``deepseek-ai/DualPipe``, ``dualpipev.py``) and torch's
``ScheduleDualPipeV`` run it; and DualPipe itself (``dualpipe.py``, ``mirrored``).

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

(``*``: the weight gradient deferred). :func:`sim.layout.dualpipe_time.makespan` runs the
programs against the dependencies between stages, the duration of each pass given, which
is how both tiers time the schedule and how the tests check it against the published
bubble, ``(pp - 1)(F&B + B - 3W)`` for ``2 pp`` stages of one chunk's passes.

DualPipe (``mirrored``) feeds the model from both ends of ``pp`` ranks (even): half the
micro-batches enter at rank 0 and run stages ``0 .. pp - 1`` on ranks ``0 .. pp - 1``
(chain 0), half enter at rank ``pp - 1`` and run them on ranks ``pp - 1 .. 0`` (chain 1).
Virtual stage ``c pp + s`` is stage ``s`` of chain ``c``; rank ``r`` holds stage ``r`` of
chain 0 and stage ``pp - 1 - r`` of chain 1, so ranks ``r`` and ``pp - 1 - r`` hold the
same layers (the parameters twice) and sum their gradients. The reference's program for
rank ``r`` is DualPipeV's for rank ``min(r, pp - 1 - r)`` of ``pp / 2`` ranks with ``m / 2``
micro-batches a chain, its phase 0 the chain the rank starts (chain 0 on the first half of
the ranks, chain 1 on the second), with one difference: the turn is not on the rank but
between the two middle ranks, which send to each other (``is_middle_rank``).
"""

from __future__ import annotations

import functools
from collections import Counter, deque
from dataclasses import dataclass

__all__ = ["Pass", "Msg", "Call", "rank_of_stage", "stages_of_rank", "chain_length",
           "chain_microbatches", "rank_calls", "rank_program", "pass_counts", "paired_share",
           "peak_held", "peak_activations"]


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


def chain_length(pp: int, mirrored: bool = False) -> int:
    """Stages a micro-batch runs through: ``2 pp`` in a V, ``pp`` under DualPipe."""
    return pp if mirrored else 2 * pp


def chain_microbatches(m: int, mirrored: bool = False) -> int:
    """Micro-batches each chain (each of a rank's stages) runs: DualPipe halves them."""
    return m // 2 if mirrored else m


def rank_of_stage(pp: int, stage: int, mirrored: bool = False) -> int:
    if mirrored:
        chain, s = divmod(stage, pp)
        return s if chain == 0 else pp - 1 - s
    return stage if stage < pp else 2 * pp - 1 - stage


def stages_of_rank(pp: int, rank: int, mirrored: bool = False) -> tuple[int, int]:
    """The rank's virtual stages, phase 0 first."""
    if mirrored:
        down, back = rank, 2 * pp - 1 - rank  # chain 0's stage r, chain 1's stage pp - 1 - r
        return (back, down) if rank >= pp // 2 else (down, back)
    return rank, 2 * pp - 1 - rank


Msg = tuple[str, int, int]  # ("F" activation | "B" gradient, micro-batch, stage it enters)
Call = tuple[tuple[Msg, ...], tuple[Msg, ...]]  # one batched call: its sends, its receives


class _Program:
    """The reference's calls for one rank: each phase's next micro-batch in order (its
    counters), the receives and sends it posts, and the batched call that commits them and
    waits before each pass (``_commit_and_wait_comm``)."""

    def __init__(self, pp: int, rank: int, mirrored: bool = False, phys: int = 0) -> None:
        """``pp`` and ``rank`` of the DualPipeV program run (under DualPipe: half the ranks,
        the half-rank id), its stages those of rank ``phys`` of ``2 pp`` when ``mirrored``."""
        self.pp, self.rank, self.mirrored = pp, rank, mirrored
        self.stage = stages_of_rank(2 * pp, phys, True) if mirrored else stages_of_rank(pp, rank)
        self.count = {k: [0, 0] for k in ("F", "B", "rF", "rB", "sF", "sB")}
        self.queue: deque[tuple[int, int]] = deque()
        self.sends: list[Msg] = []
        self.recvs: list[Msg] = []
        self.items: list[Pass | Call] = []

    def _next(self, key: str, phase: int) -> int:
        self.count[key][phase] += 1
        return self.count[key][phase] - 1

    def _alone(self, phase: int, towards_loss: bool) -> bool:
        """No neighbour that way: the first rank's way in and its loss, the last rank's
        turn (its two stages pass to each other on the rank)."""
        first, last = self.rank == 0, self.rank == self.pp - 1
        if self.mirrored:  # the turn is between the middle ranks: only the ends are alone
            return first and phase == (1 if towards_loss else 0)
        return (first and phase == (1 if towards_loss else 0)) or \
            (last and phase == (0 if towards_loss else 1))

    def recv_f(self, phase: int) -> None:
        if not self._alone(phase, towards_loss=False):
            self.recvs.append(("F", self._next("rF", phase), self.stage[phase]))

    def send_f(self, phase: int) -> None:
        if not self._alone(phase, towards_loss=True):
            self.sends.append(("F", self._next("sF", phase), self.stage[phase] + 1))

    def recv_b(self, phase: int) -> None:
        if not self._alone(phase, towards_loss=True):
            self.recvs.append(("B", self._next("rB", phase), self.stage[phase]))

    def send_b(self, phase: int) -> None:
        if not self._alone(phase, towards_loss=False):
            self.sends.append(("B", self._next("sB", phase), self.stage[phase] - 1))

    def commit(self) -> None:
        if self.sends or self.recvs:
            self.items.append((tuple(self.sends), tuple(self.recvs)))
            self.sends, self.recvs = [], []

    def _pass(self, kind: str, phase: int, defer: bool = False) -> Pass:
        mb, stage = self._next(kind, phase), self.stage[phase]
        if defer:
            self.queue.append((mb, stage))
        return Pass(kind, mb, stage, defer)

    def forward(self, phase: int, recv: bool = True, send: bool = True) -> None:
        if recv:
            self.recv_f(phase)
        self.commit()
        self.items.append(self._pass("F", phase))
        if send:
            self.send_f(phase)

    def backward(self, phase: int, defer: bool = False, recv: bool = True, send: bool = True
                 ) -> None:
        if recv:
            self.recv_b(phase)
        self.commit()
        self.items.append(self._pass("B", phase, defer))
        if send:
            self.send_b(phase)

    def pair(self, f_phase: int, b_phase: int, recv0: bool = True) -> None:
        if recv0:
            self.recv_f(f_phase)
        self.recv_b(b_phase)
        self.commit()
        f, b = self._pass("F", f_phase), self._pass("B", b_phase)
        self.items.append(Pass("FB", f.mb, f.stage, False, b.mb, b.stage))
        self.send_f(f_phase)
        self.send_b(b_phase)

    def weight(self) -> None:
        self.commit()
        mb, stage = self.queue.popleft()
        self.items.append(Pass("W", mb, stage))


def _steps_1_to_4(g: _Program, pp: int, m: int) -> None:
    r, down, last = g.rank, pp - g.rank - 1, g.rank == pp - 1
    for _ in range(2 * down):
        g.forward(0)
    g.recv_f(0)
    middle = last and g.mirrored  # DualPipe's middle rank sends its turn at once
    for i in range(r + 1):
        g.forward(0, recv=False, send=middle)
        g.recv_f(0)
        g.forward(1, send=not last or i < r)
        if not middle:
            g.send_f(0)
    for _ in range(down):
        g.backward(1, defer=True)
        g.recv_f(1)
        g.weight()
        g.forward(1, recv=False)
    for i in range(m - 2 * pp + r + 1):
        if i == 0 and last:  # the turn: not overlapped, as in the reference
            g.forward(0, recv=False, send=False)
            g.send_f(1)
            g.backward(1, send=False)
            g.send_f(0)
            g.send_b(1)
        else:
            g.pair(0, 1, recv0=i > 0)
        g.pair(1, 0)


@functools.lru_cache(maxsize=1024)
def rank_calls(pp: int, m: int, rank: int, mirrored: bool = False) -> tuple[Pass | Call, ...]:
    """Rank ``rank``'s passes in order with the batched calls between them: as the
    reference, each pass first commits what was posted since the last call (the sends of
    the passes before it, the receives it and the next ones need) and waits for it.
    ``mirrored``: DualPipe's (``m`` micro-batches, half a chain)."""
    phys = rank
    if mirrored:
        if pp < 2 or pp % 2 or m % 2 or m < 2 * pp:
            raise ValueError(f"DualPipe needs an even pp >= 2 and an even m >= 2 pp "
                             f"micro-batches (m {m}, pp {pp})")
        pp, m, rank = pp // 2, m // 2, min(rank, pp - 1 - rank)
    elif pp < 2 or m < 2 * pp:
        raise ValueError(f"DualPipeV needs pp >= 2 and m >= 2 pp micro-batches (m {m}, "
                         f"pp {pp})")
    g, r, down = _Program(pp, rank, mirrored, phys), rank, pp - rank - 1
    _steps_1_to_4(g, pp, m)
    for _ in range(down):
        g.backward(1)
        g.pair(1, 0)
    half = (r + 1) // 2
    for i in range(r + 1):  # the second half defers its weight gradients
        g.backward(1, defer=i > half or (i == half and r % 2 == 1))
        g.backward(0, defer=i >= half)
    for _ in range(down):
        g.weight()
        g.backward(0, defer=True)
    for _ in range(r + 1):
        g.weight()
    g.commit()
    assert not g.queue and g.count["F"] == g.count["B"] == [m, m], "DualPipe(V) inconsistent"
    return tuple(g.items)


@functools.lru_cache(maxsize=1024)
def rank_program(pp: int, m: int, rank: int, mirrored: bool = False) -> tuple[Pass, ...]:
    """Rank ``rank``'s passes in order."""
    return tuple(p for p in rank_calls(pp, m, rank, mirrored) if isinstance(p, Pass))


@functools.lru_cache(maxsize=1024)
def pass_counts(pp: int, m: int, rank: int, mirrored: bool = False
                ) -> tuple[tuple[Pass, int], ...]:
    """The rank's distinct passes as a duration sees them (kind, stages, deferral; the
    micro-batch set to 0), each with how many times it runs."""
    seen = Counter((p.kind, p.stage, p.deferred, p.stage2)
                   for p in rank_program(pp, m, rank, mirrored))
    return tuple((Pass(kind, 0, stage, deferred, 0 if kind == "FB" else -1, stage2), n)
                 for (kind, stage, deferred, stage2), n in seen.items())


@functools.lru_cache(maxsize=1024)
def paired_share(pp: int, m: int, rank: int, mirrored: bool = False) -> float:
    """The share of the rank's forward and backward passes that run in pairs."""
    pairs = sum(p.kind == "FB" for p in rank_program(pp, m, rank, mirrored))
    return 2 * pairs / (4 * chain_microbatches(m, mirrored))


def peak_held(pp: int, m: int, rank: int, stored: dict[int, float],
              waiting: dict[int, float], mirrored: bool = False) -> float:
    """The most a rank holds at once, a chunk of stage ``s`` counting ``stored[s]`` from
    its forward to its backward and ``waiting[s]`` from a backward that defers its weight
    gradient to that ``W`` (what the weight gradient still needs: with recomputation, more
    than the stored inputs); both are sizes, not negative."""
    s0, s1 = stages_of_rank(pp, rank, mirrored)
    x = (stored[s0], stored[s1], waiting[s0], waiting[s1])
    return max(sum(c * v for c, v in zip(counts, x, strict=True))
               for counts in _held_counts(pp, m, rank, mirrored))


@functools.lru_cache(maxsize=1024)
def _held_counts(pp: int, m: int, rank: int, mirrored: bool
                 ) -> tuple[tuple[int, int, int, int], ...]:
    """The chunks a rank holds at each point of its program where the total may peak, as
    (stored of its first stage, of its second, waiting of its first, of its second):
    distinct, none below another in every count (the sizes are not negative), none held
    at the start."""
    s0, _ = stages_of_rank(pp, rank, mirrored)
    held, seen = [0, 0, 0, 0], {(0, 0, 0, 0)}
    for p in rank_program(pp, m, rank, mirrored):
        if p.kind in ("F", "FB"):
            held[p.stage != s0] += 1
        seen.add(tuple(held))  # type: ignore[arg-type]
        if p.kind in ("B", "FB"):
            stage = p.stage2 if p.kind == "FB" else p.stage
            held[stage != s0] -= 1
            held[2 + (stage != s0)] += p.deferred
        elif p.kind == "W":
            held[2 + (p.stage != s0)] -= 1
        seen.add(tuple(held))  # type: ignore[arg-type]
    return tuple(c for c in seen if not any(
        o != c and all(a >= b for a, b in zip(o, c, strict=True)) for o in seen))


def peak_activations(pp: int, m: int, rank: int, mirrored: bool = False) -> int:
    """The most chunk activations the rank holds at once: each from its forward until its
    weight gradient is done (with its backward, or the deferred ``W``)."""
    one = dict.fromkeys(stages_of_rank(pp, rank, mirrored), 1.0)
    return int(peak_held(pp, m, rank, one, one, mirrored))
