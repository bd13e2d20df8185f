"""Iteration times from training logs, for ``trainsim calibrate``.

- **Megatron-LM** prints, every ``log-interval`` iterations, a line with ``elapsed time per
  iteration (ms): 12345.6`` (the mean over the interval);
- **torchtitan** prints, every ``log_freq`` steps, ``step: 10  loss: ...  tps: 5,762 ...``:
  tokens per second per device over the interval, so an iteration takes
  ``global_batch x seq_len / devices / tps`` seconds (the plan gives those).

ANSI colour codes are ignored. The first reported interval is left out (start-up, compile
and warm-up land there) when there are more than two; the iteration time is the median of
the rest.
"""

from __future__ import annotations

import re
import statistics
from pathlib import Path

from sim.errors import SpecError
from sim.io import read_text
from sim.spec.plan import Plan

__all__ = ["iteration_s_from_log"]

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_MEGATRON = re.compile(r"elapsed time per iteration \(ms\):\s*([0-9.]+)")
_TITAN = re.compile(r"step:\s*\d+\b.*?\btps:\s*([0-9,]+(?:\.[0-9]+)?)")


def iteration_s_from_log(path: Path, plan: Plan, field: str = "log") -> float:
    """The median iteration time (s) a Megatron-LM or torchtitan log reports."""
    text = _ANSI.sub("", read_text(path, field))
    megatron = [float(x) / 1000 for x in _MEGATRON.findall(text)]
    titan = [float(x.replace(",", "")) for x in _TITAN.findall(text)]
    if megatron and titan:
        raise SpecError(field, f"{path.name} has both Megatron-LM and torchtitan lines: give "
                        "one run's log")
    if titan:
        devices = plan.dp * plan.tp * plan.pp * plan.cp
        tokens = plan.global_batch_size * plan.seq_len / devices
        if any(t <= 0 for t in titan):
            raise SpecError(field, f"{path.name} reports a throughput of 0 tokens/s")
        times = [tokens / t for t in titan]
    else:
        times = megatron
    if not times or any(t <= 0 for t in times):
        raise SpecError(field, f"{path.name} has no iteration-time lines (Megatron-LM's "
                        "'elapsed time per iteration (ms):' or torchtitan's 'step: ... tps:')")
    if len(times) > 2:
        times = times[1:]  # the first interval holds start-up and warm-up
    return statistics.median(times)
