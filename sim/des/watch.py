"""Progress and a wall-clock limit for long discrete-event runs.

A :class:`Watch` is called by the environment every :data:`EVERY` events
(:class:`~sim.des.context.CountingEnv`). Once a run has taken ``show_after_s`` of wall time
it reports progress — events simulated and the events the whole step will take, estimated
from how far the simulated clock is into ``estimate_s`` (the analytic tier's iteration
time) — to its ``progress`` callback; past ``max_wall_s`` it raises :class:`WallLimit`,
which carries what the run learned: the step takes at least the simulated time reached.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Watch", "WallLimit", "EVERY"]

EVERY = 2048  # events between two looks at the clock


class WallLimit(RuntimeError):
    """A run stopped at its wall-clock limit; ``learned`` says how far it got."""

    def __init__(self, learned: dict[str, Any]) -> None:
        self.learned = learned
        super().__init__(
            f"stopped after {learned['wall_s']:.3g} s of wall time (--max-wall-s "
            f"{learned['max_wall_s']:g}): simulated {learned['simulated_s']:.6g} s of the "
            f"step in {learned['events']:,} events, so the iteration takes at least "
            f"{learned['simulated_s']:.6g} s" + (
                f" (the analytic tier estimates {learned['estimate_s']:.6g} s)"
                if learned.get("estimate_s") else ""))


@dataclass
class Watch:
    """``progress(events, estimated_total)`` once a run is slow; ``max_wall_s`` stops it."""

    max_wall_s: float | None = None
    progress: Callable[[int, int], None] | None = None
    estimate_s: float | None = None
    show_after_s: float = 3.0
    started: float = field(default_factory=time.perf_counter)
    done: int = 0  # events of earlier runs of this step (a reduced run that fell back)

    def __call__(self, events: int, now: float) -> None:
        wall = time.perf_counter() - self.started
        if self.max_wall_s is not None and wall > self.max_wall_s:
            raise WallLimit({"wall_s": wall, "max_wall_s": self.max_wall_s,
                             "events": self.done + events, "simulated_s": now,
                             "estimate_s": self.estimate_s})
        if self.progress is not None and wall >= self.show_after_s:
            self.progress(self.done + events, self.done + self.estimated(events, now))

    def rerun(self, events: int) -> None:
        """The step starts again (unreduced) after ``events``: progress goes on from them."""
        self.done += events

    def estimated(self, events: int, now: float) -> int:
        """Events the whole step will take, from the simulated fraction of the estimate."""
        if not self.estimate_s or now <= 0:
            return events
        return max(events, int(events * self.estimate_s / now))
