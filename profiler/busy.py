"""Busy neighbours: CPU profiles measured while the other ranks' cores work too.

A ``cpu:RANKS`` cluster runs RANKS processes on one host, each on its own core; they share
the host's memory bandwidth, caches and (on many virtual machines) physical cores. An op
timed on an otherwise idle host is faster than the same op in a training run. On the
2-vCPU machines trainsim is developed on, one GEMM loop takes 5.3 ms per call alone and
11.2-11.5 ms while a second process runs the same loop. So CPU compute profiles are taken
with ``busy`` background processes (one per other rank) each running one thread of GEMMs
sized like a small transformer's, for as long as the measurement lasts.
"""

from __future__ import annotations

import multiprocessing as mp
import os
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["busy_neighbours", "default_busy"]


def default_busy() -> int:
    """Other ranks of a full ``cpu:RANKS`` run on this host: one per other core."""
    return max(0, (os.cpu_count() or 1) - 1)


def _spin(stop: object, ready: object, kind: str) -> None:
    import torch

    torch.set_num_threads(1)
    if kind == "gemm":
        a, b = torch.randn(1024, 256), torch.randn(256, 1024)

        def work() -> object:
            return a @ b
    else:  # a small training step: GEMMs, attention, element-wise passes, autograd
        from profiler.layer import ReferenceLayer
        from sim.spec.zoo import load_model

        layer = ReferenceLayer(load_model("tiny"), 512)
        x = torch.randn(2, 512, 256, requires_grad=True)

        def work() -> object:
            layer(x).sum().backward()
            return None
    work()
    ready.release()  # type: ignore[attr-defined]
    while not stop.is_set():  # type: ignore[attr-defined]
        work()


@contextmanager
def busy_neighbours(count: int, kind: str = "layer") -> Iterator[None]:
    """Run ``count`` single-thread loops (of a small transformer layer's forward and
    backward, or of one GEMM) in separate processes while the body runs."""
    if count <= 0:
        yield
        return
    ctx = mp.get_context("spawn")
    stop, ready = ctx.Event(), ctx.Semaphore(0)
    procs = [ctx.Process(target=_spin, args=(stop, ready, kind), daemon=True)
             for _ in range(count)]
    for p in procs:
        p.start()
    try:
        for _ in procs:  # every neighbour is busy before the first measurement
            if not ready.acquire(timeout=120) or not all(p.is_alive() for p in procs):
                raise RuntimeError("a busy-neighbour process did not start")
        yield
    finally:
        stop.set()
        for p in procs:
            p.join(5)
            if p.is_alive():
                p.kill()
