"""What every rank started by ``torchrun`` does around its work (:mod:`executor.launch`):
pin CPU cores, join the process group, report progress for the launcher's hang detection,
write ``rank<R>.json``, and turn a failure into one line in ``error<R>.txt``."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["progress", "rank_main"]


def progress(out: Path, rank: int, stage: int, text: str) -> None:
    """Atomic (rename), so the launcher never reads a half-written file. ``stage`` counts
    how far the rank got (it only grows), so the launcher can blame the rank behind."""
    tmp = out / f".progress{rank}"
    tmp.write_text(f"{time.time()} {stage} {text}\n")
    tmp.replace(out / f"progress{rank}")


def _pin(local_rank: int, threads: int) -> None:
    """Give each CPU rank cores of its own when there are enough: unpinned ranks migrate
    between cores and share them unevenly, which made one rank of a pair up to 30% slower
    for a whole step on our 2-core VM (the step waits for the slower one)."""
    cores = sorted(os.sched_getaffinity(0))
    world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    if world * threads <= len(cores):
        os.sched_setaffinity(0, cores[local_rank * threads:(local_rank + 1) * threads])


def rank_main(run: Callable[[dict[str, Any], Path, int], dict[str, Any]],
              argv: list[str] | None = None) -> int:
    """``python -m MODULE CONFIG.json``: ``run(config, folder, rank)`` on this rank."""
    path = Path((argv or sys.argv[1:])[0])
    cfg = json.loads(path.read_text())
    out = path.parent
    rank = int(os.environ.get("RANK", "0"))
    try:
        if cfg["device"] == "cpu":
            torch.set_num_threads(cfg["threads"])
            if os.environ.get("TRAINSIM_PIN", "1").lower() not in ("0", "false", "no", "off"):
                _pin(int(os.environ.get("LOCAL_RANK", "0")), cfg["threads"])
        else:
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        backend = "gloo" if cfg["device"] == "cpu" else "nccl"
        dist.init_process_group(backend, timeout=timedelta(seconds=cfg["timeout_s"]))
        result = run(cfg, out, rank)
        (out / f"rank{rank}.json").write_text(json.dumps(result))
        dist.barrier()  # gloo aborts a rank whose peer tears its connections down first
        dist.destroy_process_group()
    except BaseException as exc:  # one line for the launcher, then a non-zero exit
        lines = [x.strip() for x in str(exc).splitlines() if x.strip()]
        text = " / ".join(lines[:3]) if lines else "(no message)"  # one line
        (out / f"error{rank}.txt").write_text(f"{type(exc).__name__}: {text[:400]}")
        raise
    return 0
