"""Timing one operation: warm-up, then repeats; CUDA events on GPU, wall clock on CPU."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

__all__ = ["Stats", "time_op", "summarize"]


@dataclass(frozen=True)
class Stats:
    median_s: float
    p10_s: float
    p90_s: float
    repeats: int


def _quantile(samples: list[float], q: float) -> float:
    s = sorted(samples)
    return s[min(len(s) - 1, int(q * len(s)))]


def summarize(samples: list[float]) -> Stats:
    """Median, p10 and p90 of timed samples (seconds)."""
    return Stats(statistics.median(samples), _quantile(samples, 0.1), _quantile(samples, 0.9),
                 len(samples))


def _one_cuda(fn: Callable[[], object], number: int) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(number):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / number


def _one_cpu(fn: Callable[[], object], number: int) -> float:
    t0 = time.perf_counter()
    for _ in range(number):
        fn()
    return (time.perf_counter() - t0) / number


def time_op(fn: Callable[[], object], device: str, warmup: int = 2, repeats: int = 7,
            min_sample_s: float = 1e-3, budget_s: float = 2.0) -> Stats:
    """Median (and p10/p90) seconds of ``fn``. Short operations run several times per
    sample so that a sample lasts at least ``min_sample_s``; long ones stop early once
    three samples have spent ``budget_s``."""
    one = _one_cuda if device == "cuda" else _one_cpu
    for _ in range(warmup):
        first = one(fn, 1)
    number = max(1, min(1000, int(min_sample_s / max(first, 1e-9))))
    samples: list[float] = []
    while len(samples) < repeats and (len(samples) < 3 or sum(samples) * number < budget_s):
        samples.append(one(fn, number))
    return summarize(samples)
