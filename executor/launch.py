"""Start ``torchrun`` for a plan, watch it, and summarise what the ranks measured.

Whatever happens — a rank crashes, a rank stops making progress for ``timeout_s``, the caller
is interrupted — torchrun and every rank it started are stopped before :func:`execute`
returns or raises, so nothing is left behind.
Multi-node runs use torchrun's own rendezvous: start the same command on every node with
``--nnodes``/``--rdzv-endpoint`` (see docs/guide/executor.md); this launcher starts the
single-node case.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from executor.capabilities import unsupported
from sim.errors import SpecError
from sim.spec.model import ModelSpec
from sim.spec.plan import Plan
from sim.spec.workload import Workload

__all__ = ["execute", "launch", "check_runnable", "ExecutionError", "summarize_ranks"]


class ExecutionError(RuntimeError):
    """A run that did not finish: one line saying which rank and why."""


def _config(spec: ModelSpec | Workload, plan: Plan, **run: Any) -> dict[str, Any]:
    key = "workload" if isinstance(spec, Workload) else "model"  # the worker's two runners
    return {key: spec.to_dict(), "plan": plan.to_dict(), **run}


def _command(nproc: int, config: Path, module: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc-per-node={nproc}", "--max-restarts=0", "--monitor-interval=0.2",
            "-m", module, str(config)]


def _children(pid: int) -> list[int]:
    """Every descendant of ``pid`` (from /proc; torchrun starts each rank in a session of
    its own, so signalling torchrun's process group does not reach them)."""
    parents: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        kids = parents.get(todo.pop(), [])
        out += kids
        todo += kids
    return out


def _alive(pids: list[int]) -> list[int]:
    out = []
    for pid in pids:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        out.append(pid)
    return out


def _stop(proc: subprocess.Popen, seen: set[int]) -> None:
    """SIGTERM to torchrun and every rank (``seen`` while it ran, or found now), SIGKILL
    after 5 s; returns once none is left."""
    pids = [proc.pid, *sorted(seen | set(_children(proc.pid)))]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in _alive(pids):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.time() + 5.0
        while time.time() < deadline:
            proc.poll()  # reap torchrun as soon as it exits
            if not _alive([p for p in pids if p != proc.pid]) and proc.returncode is not None:
                return
            time.sleep(0.05)
    proc.wait()


STARTUP_S = 120.0  # a rank's first report may take this long (imports, model build)


def _last_progress(folder: Path, nproc: int, started: float, timeout_s: float
                   ) -> tuple[float, str, float]:
    """(earliest deadline of any rank, the rank to blame, the time of its last report): a
    rank must report within ``timeout_s`` of its last report, or of the start plus the
    startup allowance. When one
    rank stalls the others soon wait for it inside a collective, and which of them reported
    last is a race; the rank to blame is the one that got least far (then the oldest)."""
    deadline = math.inf
    behind: tuple[int, float, str] = (1 << 62, math.inf, "")
    for r in range(nproc):
        f = folder / f"progress{r}"
        parts = f.read_text().split(maxsplit=2) if f.exists() else []
        if len(parts) == 3:
            when, stage, what = float(parts[0]), int(parts[1]), parts[2].strip()
            mine = when + timeout_s
        else:
            when, stage, what = started, 0, "starting"
            mine = started + max(timeout_s, STARTUP_S)
        deadline = min(deadline, mine)
        behind = min(behind, (stage, when, f"rank {r} ({what})"))
    if behind[0] == 0:  # ranks that did start wait for this one: give it the allowance
        deadline = started + max(timeout_s, STARTUP_S)
    return deadline, behind[2], behind[1]


def _failure(folder: Path, nproc: int, returncode: int) -> str:
    """The first rank to fail (the others usually fail because it went away)."""
    errors = [(f.stat().st_mtime, r, f) for r in range(nproc)
              if (f := folder / f"error{r}.txt").exists()]
    if not errors:
        return f"torchrun exited with status {returncode}" + _log_tail(folder)
    _, rank, path = min(errors)
    return f"rank {rank} failed: {path.read_text().strip()}"


def _log_tail(folder: Path) -> str:
    """What torchrun's own log says last of an error (no rank wrote one): the last line
    naming an error, else its last line; one line, at most 300 characters."""
    try:
        lines = [x.strip() for x in (folder / "torchrun.log").read_text(
            errors="replace").splitlines() if x.strip()]
    except OSError:
        return ""
    if not lines:
        return ""
    named = [x for x in lines if "Error" in x or "error" in x]
    return f"; its log ends: {(named or lines)[-1][:300]}"


def _watch(proc: subprocess.Popen, folder: Path, nproc: int, timeout_s: float,
           seen: set[int]) -> None:
    started = time.time()
    while proc.poll() is None:
        seen.update(_children(proc.pid))
        deadline, who, since = _last_progress(folder, nproc, started, timeout_s)
        now = time.time()
        if now > deadline:
            raise ExecutionError(f"{who} made no progress for {now - since:.0f} s (timeout "
                                 f"{timeout_s:g} s): stopped all ranks")
        if any((folder / f"error{r}.txt").exists() for r in range(nproc)):
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout_s)  # torchrun stops the other ranks itself
            raise ExecutionError(_failure(folder, nproc, proc.returncode))
        time.sleep(0.2)
    done = all((folder / f"rank{r}.json").exists() for r in range(nproc))
    if proc.returncode != 0 and not done:
        raise ExecutionError(_failure(folder, nproc, proc.returncode))
    # every rank wrote its result before the closing barrier: a rank dying in gloo's
    # teardown after that (seen on this loaded 2-core host) loses no work


def summarize_ranks(ranks: list[dict[str, Any]], plan: Plan) -> dict[str, Any]:
    """Iteration time per step = the slowest rank's; losses from the ranks that compute
    them (the last pipeline stage); collectives per rank as recorded."""
    steps = [max(r["step_s"][i] for r in ranks) for i in range(len(ranks[0]["step_s"]))]
    losses = [next((r["loss"][i] for r in ranks if r["loss"][i] is not None), None)
              for i in range(len(steps))]
    return {"step_s": steps, "loss": losses,
            "peak_bytes": [r["peak_bytes"] for r in ranks],
            "base_rss_bytes": [r["base_rss_bytes"] for r in ranks],
            "collectives": {str(r["rank"]): r["collectives"] for r in ranks},
            "tokens_per_step": plan.global_batch_size * plan.seq_len,
            "torch": ranks[0]["torch"], "threads": ranks[0]["threads"]}


def measured(summary: dict[str, Any], warmup: int) -> dict[str, float]:
    """Median and spread of the timed steps (warm-up dropped), tokens/s."""
    timed = summary["step_s"][warmup:]
    med = statistics.median(timed)
    return {"iteration_s": med, "min_s": min(timed), "max_s": max(timed),
            "tokens_per_s": summary["tokens_per_step"] / med}


def check_runnable(spec: ModelSpec | Workload, plan: Plan, nproc: int | None = None) -> None:
    """Refuse, before anything is launched, a plan the worker would refuse after torchrun
    started (:func:`executor.capabilities.unsupported`, for workload graphs
    :func:`executor.graph_run.graph_unsupported`) or a rank count that is not the plan's
    world size: a SpecError naming the field."""
    if isinstance(spec, Workload):
        from executor.graph_run import graph_unsupported

        why = graph_unsupported(spec, plan)
    else:
        why = unsupported(spec, plan)
    if why is not None:
        raise SpecError(*why)
    if nproc is not None and nproc != plan.world_size:
        raise SpecError("execute.nproc", f"{nproc} != plan world size dp*tp*pp*cp = "
                        f"{plan.world_size}")


def execute(spec: ModelSpec | Workload, plan: Plan, nproc: int | None = None, steps: int = 5,
            warmup: int = 2, timeout_s: float = 60.0, device: str = "cpu", threads: int = 1,
            seed: int = 0, lr: float = 1e-3, fault: dict[str, Any] | None = None,
            workdir: Path | None = None, optimizer: str = "adamw") -> dict[str, Any]:
    """Run ``plan`` on ``nproc`` local ranks; the summary of :func:`summarize_ranks` plus
    the timed figures, the model and the plan. A plan the worker cannot run is refused
    before launch (:func:`check_runnable`, SpecError); :class:`ExecutionError` (one line)
    when the run fails."""
    check_runnable(spec, plan, nproc)
    nproc = plan.world_size
    for name, value, low in (("steps", steps, 1), ("warmup", warmup, 0), ("threads", threads, 1)):
        if value < low:
            raise SpecError(f"execute.{name}", f"must be >= {low}, got {value}")
    if optimizer not in ("adamw", "sgd"):
        raise SpecError("execute.optimizer", f"must be adamw or sgd, got {optimizer!r}")
    ranks = launch("executor.worker", _config(
        spec, plan, steps=steps, warmup=warmup, timeout_s=timeout_s, device=device,
        threads=threads, seed=seed, lr=lr, fault=fault, optimizer=optimizer), nproc, timeout_s,
        threads, workdir)
    summary = summarize_ranks(ranks, plan)
    summary.update(measured(summary, warmup), warmup=warmup, steps=steps, nproc=nproc,
                   device=device, model=spec.to_dict(), plan=plan.to_dict())
    return summary


def launch(module: str, config: dict[str, Any], nproc: int, timeout_s: float, threads: int,
           workdir: Path | None = None) -> list[dict[str, Any]]:
    """Run ``python -m MODULE CONFIG.json`` on ``nproc`` local ranks under torchrun
    (:func:`executor.rank.rank_main` on each), watched for crashes and hangs; each rank's
    ``rank<R>.json``. :class:`ExecutionError` (one line) when the run fails."""
    with tempfile.TemporaryDirectory(prefix="trainsim-exec-", dir=workdir) as tmp:
        folder = Path(tmp)
        path = folder / "config.json"
        path.write_text(json.dumps(config))
        env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONUNBUFFERED": "1",
               "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[1]),
                                              os.environ.get("PYTHONPATH", "")])}
        log = (folder / "torchrun.log").open("w")
        proc = subprocess.Popen(_command(nproc, path, module), stdout=log,
                                stderr=subprocess.STDOUT, env=env, start_new_session=True)
        seen: set[int] = set()
        try:
            _watch(proc, folder, nproc, timeout_s, seen)
        finally:
            _stop(proc, seen)
            log.close()
        return [json.loads((folder / f"rank{r}.json").read_text()) for r in range(nproc)]
