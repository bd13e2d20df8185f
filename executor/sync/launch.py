"""Launch a real synchronisation run (:mod:`executor.sync.worker`) and summarise what its
ranks measured: updates/s and samples/s in the steady part, the staleness the servers saw,
the test accuracy against updates and wall time."""

from __future__ import annotations

import statistics
from collections import Counter
from pathlib import Path
from typing import Any

from executor.launch import launch
from executor.sync.task import TASKS, check_task
from sim.errors import SpecError
from sim.spec.plan import Plan
from sim.spec.sync import architecture
from sim.strategies.result import SCOPES, samples_per_update

__all__ = ["execute_sync", "execute_sync_batch", "runnable", "summarize_sync", "updates_to"]


def runnable(plan: Plan) -> tuple[str, str] | None:
    """(field, rule) of what the real runs do not do yet, or None."""
    s = plan.sync
    if s.kind == "diloco" and s.pseudo_gradient_dtype == "int8":
        return "plan.sync.pseudo_gradient_dtype", "int8 pseudo-gradients are simulated only: " \
            "the real runs round to fp32, bf16 or fp16"
    if plan.compression.kind != "none" and (s.kind != "bsp"
                                            or architecture(plan) != "allreduce"):
        return "plan.compression.kind", "the real runs compress BSP over all-reduce only: " \
            "compression with other strategies or servers is simulated only"
    c = plan.communication
    if c.partition_MB or c.aggregate != "worker":
        field = "partition_MB" if c.partition_MB else "aggregate"
        return f"plan.communication.{field}", "BytePS-style partitions and node " \
            "aggregation are simulated only: the real servers take whole shards per worker"
    if plan.tp * plan.pp * plan.cp != 1:
        return "plan.tp", "the real sync runs train one-process workers (tp = pp = cp = 1)"
    return None


def execute_sync(plan: Plan, task: str = "digits", steps: int = 200, lr: float = 0.1,
                 hidden: tuple[int, ...] | None = None, eval_every: int = 10, seed: int = 0,
                 timeout_s: float = 60.0, threads: int = 1, workdir: Path | None = None
                 ) -> dict[str, Any]:
    """Run ``plan``'s strategy for ``steps`` local steps a worker on ``task``."""
    return execute_sync_batch([(plan, lr, seed)], task, steps, hidden, eval_every, timeout_s,
                              threads, workdir=workdir)[0]


def execute_sync_batch(runs: list[tuple[Plan, float, int]], task: str = "digits",
                       steps: int = 200, hidden: tuple[int, ...] | None = None,
                       eval_every: int = 10, timeout_s: float = 60.0, threads: int = 1,
                       stragglers: list[dict[str, float] | None] | None = None,
                       workdir: Path | None = None, inner: str = "sgd",
                       eval_global: bool = False) -> list[dict[str, Any]]:
    """Several runs, each ``(plan, lr, seed)``, on one torchrun start (their plans must
    have the same workers and servers): torchrun's start-up (~10 s here) paid once.
    ``stragglers[i]``: run ``i``'s slowed worker, ``{"worker": w, "factor": f}`` (its
    compute takes ``f`` times as long). ``inner``: the workers' optimizer (``sgd`` or
    ``adamw``); ``eval_global``: DiLoCo runs evaluate their outer parameters."""
    if not runs:
        return []
    ranks_of = {p.dp + (p.communication.servers if architecture(p) == "ps" else 0)
                for p, _, _ in runs}
    if len({p.dp for p, _, _ in runs}) > 1 or len(ranks_of) > 1:
        raise SpecError("runs", "a batch's plans need the same dp and servers")
    for p, _, _ in runs:
        why = runnable(p)
        if why is not None:
            raise SpecError(*why)
    if inner not in ("sgd", "adamw"):
        raise SpecError("inner", f"must be sgd or adamw, got {inner!r}")
    check_task(task, runs[0][0], hidden)
    for name, value in (("steps", steps), ("eval_every", eval_every)):
        if value < 1:
            raise SpecError(name, f"must be >= 1, got {value}")
    if stragglers is not None:
        if len(stragglers) != len(runs):
            raise SpecError("stragglers", f"one entry (or None) a run: {len(runs)} runs, "
                            f"{len(stragglers)} entries")
        for slow in stragglers:
            if slow is not None and not (0 <= slow.get("worker", -1) < runs[0][0].dp
                                         and slow.get("factor", 0) >= 1):
                raise SpecError("stragglers", f"need worker in 0..dp-1 and factor >= 1, "
                                f"got {slow!r}")
    each = [{"plan": p.to_dict(), "lr": lr, "seed": seed,
             "straggler": (stragglers or [None] * len(runs))[i]}
            for i, (p, lr, seed) in enumerate(runs)]
    base: dict[str, Any] = {
        "task": task, "hidden": list(hidden or TASKS[task]), "steps": steps,
        "eval_every": eval_every, "inner": inner, "eval_global": eval_global, "device": "cpu",
        "threads": threads, "timeout_s": timeout_s,
        "plan": runs[0][0].to_dict(), "lr": runs[0][1], "seed": runs[0][2], "runs": each}
    ranks = launch("executor.sync.worker", base, ranks_of.pop(), timeout_s, threads, workdir)
    out = []
    for i, (p, _, _) in enumerate(runs):
        cfg = {**base, **each[i]}
        out.append(summarize_sync([r["runs"][i] for r in ranks], p, cfg))
    return out


def _window(times: list[float], until: float, warmup: float = 0.1) -> tuple[int, float]:
    """(events, seconds) of ``times`` after the first ``warmup`` share, up to ``until``."""
    ts = sorted(t for t in times if t <= until)
    ts = ts[int(len(ts) * warmup):]
    if len(ts) < 2:
        return 0, 0.0
    return len(ts) - 1, ts[-1] - ts[0]


def summarize_sync(ranks: list[dict[str, Any]], plan: Plan, cfg: dict[str, Any]
                   ) -> dict[str, Any]:
    workers = [r for r in ranks if r["role"] == "worker"]
    servers = [r for r in ranks if r["role"] == "server"]
    scope = SCOPES[plan.sync.kind]
    until = min(w["step_end"][-1] for w in workers)  # while every worker still runs
    if servers:
        times = servers[0]["applied_at"]
    elif scope == "local":
        times = [t for w in workers for t in w["step_end"]]
    else:
        times = workers[0]["step_end"]
    count, span = _window(times, until)
    per = count / span if span else 0.0
    if scope == "local":
        per /= plan.dp
    per_update = samples_per_update(plan, scope)
    stale = servers[0]["staleness"] if servers else []
    hist = Counter(stale)
    return {"strategy": plan.sync.to_dict(), "architecture": architecture(plan),
            "workers": plan.dp, "servers": len(servers), "update_scope": scope,
            "updates_per_s": per, "samples_per_s": per * per_update,
            "compute_s": statistics.median(x for w in workers for x in w["compute_s"][1:]),
            "staleness": {"mean": statistics.fmean(stale) if stale else 0.0,
                          "histogram": {str(k): hist[k] for k in sorted(hist)}},
            "server_busy_s": [s["busy_s"] for s in servers],
            "sent_bytes_per_step": statistics.median(
                x for w in workers for x in w.get("sent_bytes", [])[1:]) if any(
                len(w.get("sent_bytes", [])) > 1 for w in workers) else None,
            "compression": plan.compression.to_dict(),
            "swaps_served": sum(w.get("swaps_served", [0])[0] for w in workers),  # ad-psgd
            "dropped": servers[0].get("dropped", 0) if servers else 0,  # pushes (shard 0)
            "evals": workers[0]["evals"], "steps": cfg["steps"], "lr": cfg["lr"],
            "task": cfg["task"], "hidden": cfg["hidden"], "straggler": cfg.get("straggler"),
            "wall_s": max(w["step_end"][-1] for w in workers) - workers[0]["start"][0],
            "cpu_s": {"workers": [w["cpu_s"][0] for w in workers if "cpu_s" in w],
                      "servers": [s["cpu_s"] for s in servers if "cpu_s" in s]}}


def updates_to(summary: dict[str, Any], accuracy: float) -> int | None:
    """Updates (in the strategy's scope) until worker 0 first measured ``accuracy`` on the
    test split; None if it never did."""
    for e in summary["evals"]:
        if e["accuracy"] >= accuracy:
            return int(e["updates"])
    return None
