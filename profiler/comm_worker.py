"""One rank of ``trainsim profile comm`` (started by torchrun; rank 0 writes the results).

Sizes follow the simulator's convention: the full buffer of an all-reduce or broadcast,
the output of an all-gather, the input of a reduce-scatter, what one rank sends in an
all-to-all or a send/recv. Each sample is the slowest rank's time; send/recv is half of a
ping-pong between ranks 0 and 1. As in nccl-tests, a sample is the average of several
back-to-back iterations (enough to last ``--sample-s``); the row reports the median sample.

In situ (``--insitu-sizes``): a training rank issues each collective right after a burst of
its own compute, not back to back. The cost it sees then is larger than the back-to-back
time: the ranks arrive apart (their compute jitters), the communication thread has to be
woken, and on a CPU it shares the rank's core. So a second measurement times ``N`` rounds
of [compute burst, collective] against ``N`` compute bursts alone (rounds interleaved, the
slowest rank's time each); their difference per collective, minus the back-to-back time
measured alongside, is the collective's *in-situ overhead*, which the simulator adds to
every collective of a step (``comm_insitu.csv``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast",
               "send_recv")
BUS_FACTOR = {  # nccl-tests: busbw = algbw * factor(n)
    "all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n, "all_to_all": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0, "send_recv": lambda n: 1.0}


def _ping_pong(buf: torch.Tensor, rank: int) -> None:
    if rank == 0:
        dist.send(buf, 1)
        dist.recv(buf, 1)
    elif rank == 1:
        dist.recv(buf, 0)
        dist.send(buf, 0)


# torch >= 2.11 names them *_single; older releases only have *_into_tensor / *_tensor.
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def _op(kind: str, size_bytes: int, world: int, rank: int, device: torch.device
        ) -> Callable[[], object]:
    n = max(world, size_bytes // 4 // world * world)  # float32 elements, divisible by world
    full = torch.ones(n, device=device)
    part = torch.ones(n // world, device=device)
    ops: dict[str, Callable[[], object]] = {
        "all_reduce": lambda: dist.all_reduce(full),
        "all_gather": lambda: _all_gather(full, part),
        "reduce_scatter": lambda: _reduce_scatter(part, full),
        "all_to_all": lambda: dist.all_to_all_single(torch.empty_like(full), full),
        "broadcast": lambda: dist.broadcast(full, 0),
        "send_recv": lambda: _ping_pong(full, rank)}
    return ops[kind]


def _sample(fn: Callable[[], object], device: torch.device, number: int) -> float:
    """Seconds per iteration over ``number`` back-to-back iterations, slowest rank."""
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(number):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    elapsed = torch.tensor([(time.perf_counter() - t0) / number], dtype=torch.float64,
                           device=device)  # NCCL reduces device tensors only
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    return float(elapsed.item())


def _measure(fns: dict[int, Callable[[], object]], device: torch.device, rounds: int,
             sample_s: float) -> dict[int, list[float]]:
    """Samples per size, taken in ``rounds`` passes over all sizes so that slow phases of
    the machine spread over every size instead of bending the curve at a few."""
    number = {}
    for size, fn in fns.items():
        first = max(_sample(fn, device, 1), _sample(fn, device, 1))  # warm-up
        number[size] = max(1, min(200, round(sample_s / max(first, 1e-7))))
    samples: dict[int, list[float]] = {size: [] for size in fns}
    for _ in range(rounds):
        for size, fn in fns.items():
            samples[size].append(_sample(fn, device, number[size]))
    return samples


def _burst(device: torch.device, seconds: float) -> Callable[[], object]:
    """A compute burst of about ``seconds``: GEMMs shaped like a small transformer's MLP."""
    a = torch.randn(1024, 256, device=device)
    b = torch.randn(256, 704, device=device)
    a @ b
    if device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(8):
        a @ b
    if device.type == "cuda":
        torch.cuda.synchronize()
    per = (time.perf_counter() - t0) / 8
    count = torch.tensor([max(1, round(seconds / max(per, 1e-7)))], dtype=torch.float64,
                         device=device)
    dist.all_reduce(count, op=dist.ReduceOp.MAX)  # every rank does the same work
    n = int(count.item())

    def work() -> object:
        for _ in range(n):
            a @ b
        return None
    return work


def _insitu_row(kind: str, size: int, fn: Callable[[], object], burst: Callable[[], object],
                device: torch.device, rounds: int, number: int, world: int, fabric: str,
                backend: str) -> dict[str, Any]:
    """Back-to-back time, burst time and in-situ cost of one collective; medians over
    ``rounds`` interleaved triples (so a slow spell of the machine hits all three)."""
    half = 2 if kind == "send_recv" else 1
    iso, alone, both = [], [], []
    fn()
    for _ in range(rounds):
        iso.append(_sample(fn, device, number) / half)
        alone.append(_sample(burst, device, number))
        both.append(_sample(lambda: (burst(), fn()), device, number))
    insitu = statistics.median(b - a for a, b in zip(alone, both, strict=True)) / half
    isolated = statistics.median(iso)
    return {"collective": kind, "backend": backend, "fabric": fabric, "group_size": world,
            "size_bytes": size, "isolated_s": isolated, "insitu_s": insitu,
            "overhead_s": insitu - isolated, "burst_s": statistics.median(alone),
            "repeats": rounds}


def _row(kind: str, size: int, samples: list[float], world: int, fabric: str, backend: str
         ) -> dict[str, Any]:
    t = statistics.median(samples) / (2 if kind == "send_recv" else 1)
    s = sorted(samples)
    half = 2 if kind == "send_recv" else 1
    algbw = size / t / 1e9
    return {"collective": kind, "backend": backend, "fabric": fabric, "group_size": world,
            "size_bytes": size, "time_median_s": t, "time_p10_s": s[len(s) // 10] / half,
            "time_p90_s": s[min(len(s) - 1, 9 * len(s) // 10)] / half, "algbw_GBps": algbw,
            "busbw_GBps": algbw * BUS_FACTOR[kind](world), "repeats": len(samples)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--sizes", required=True, help="comma-separated bytes")
    ap.add_argument("--collectives", default=",".join(COLLECTIVES))
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--sample-s", type=float, default=0.05)
    ap.add_argument("--insitu-sizes", default="", help="comma-separated bytes ('' = none)")
    ap.add_argument("--insitu-out", default="")
    ap.add_argument("--burst-s", type=float, default=0.02)
    args = ap.parse_args()
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    local = int(os.environ.get("LOCAL_RANK", 0))
    device = torch.device(f"cuda:{local}" if backend == "nccl" else "cpu")
    if backend == "nccl":
        torch.cuda.set_device(device)
    elif hasattr(os, "sched_setaffinity"):
        cores = sorted(os.sched_getaffinity(0))  # the cores this job may use
        if local < len(cores):
            os.sched_setaffinity(0, {cores[local]})  # one core per rank, as in training
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    same_host = int(os.environ.get("LOCAL_WORLD_SIZE", world)) == world
    fabric = "intra" if same_host else "inter"
    rows: list[dict[str, Any]] = []
    sizes = [int(s) for s in args.sizes.split(",")]
    for kind in args.collectives.split(","):
        fns = {size: _op(kind, size, world, rank, device) for size in sizes}
        for size, samples in _measure(fns, device, args.rounds, args.sample_s).items():
            rows.append(_row(kind, size, samples, world, fabric, backend))
            if rank == 0:
                print(f"{kind} {size} B: {rows[-1]['time_median_s'] * 1e6:.1f} us", flush=True)
        del fns
    insitu: list[dict[str, Any]] = []
    if args.insitu_sizes:
        burst = _burst(device, args.burst_s)
        for kind in args.collectives.split(","):
            for size in (int(s) for s in args.insitu_sizes.split(",")):
                row = _insitu_row(kind, size, _op(kind, size, world, rank, device), burst,
                                  device, max(3, (args.rounds + 1) // 2), 10, world, fabric,
                                  backend)
                insitu.append(row)
                if rank == 0:
                    print(f"{kind} {size} B in situ: {row['insitu_s'] * 1e6:.1f} us "
                          f"(back to back {row['isolated_s'] * 1e6:.1f} us)", flush=True)
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump(rows, f)
        if args.insitu_out:
            with open(args.insitu_out, "w") as f:
                json.dump(insitu, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
