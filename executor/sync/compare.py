"""Measured beside predicted for a real synchronisation run (``trainsim compare --task``):
one torchrun start profiles its own ranks (:mod:`executor.sync.probe`) and then runs the
plan; the multi-step DES predicts the run from that profile alone
(:func:`predict_sync`); throughput, staleness and updates to the target are put side by
side, with time-to-target from a statistical-efficiency model when one is named.

How the profile becomes a prediction (``experiments/validate_sync_cpu.py`` measures how
well it does): every worker's local step is drawn from the measured steps (per worker and
step, :mod:`sim.strategies.host`); the all-reduce and averages take the measured reduction;
the loopback latency is set so a message takes the measured time (an exchange's for
D-PSGD); a server's CPU time per push is the first server's measured handling of its shard;
and the CPU seconds every rank spent on each of those cap the rate where the ranks need more
cores than the host has (:func:`sim.strategies.host.host_cap`).
"""

from __future__ import annotations

import statistics
from typing import Any

from executor.launch import launch
from executor.sync.launch import runnable, summarize_sync, updates_to
from sim.errors import SpecError
from sim.layout.sync import parameter_tensors, shard_fractions
from sim.spec.cluster import load_cluster
from sim.spec.plan import Plan
from sim.spec.scenario import apply_cluster_edits
from sim.spec.sync import architecture
from sim.strategies.host import CPU_KEYS

__all__ = ["compare_sync", "profile_of", "predict_sync", "task_workload"]

KEYS = ("step_s", "allreduce_s", "exchange_s", "p2p_s", "service_s", "handling_s", "push_s")


def profile_of(probes: list[dict[str, Any]]) -> dict[str, Any]:
    """The ranks' probe results as one profile: means over the ranks that measured each;
    a server's handling, the first server's (it is priced against shard 0's bytes)."""
    def mean(key: str) -> float | None:
        xs = [r[key] for r in probes if key in r]
        return statistics.fmean(xs) if xs else None

    first = next((r for r in probes if "service_s" in r), {})  # the first server's own
    serve = [r["serve_cpu_s"] for r in probes if "serve_cpu_s" in r]
    return {**{k: mean(k) for k in KEYS + CPU_KEYS},
            "service_s": first.get("service_s"), "handling_s": first.get("handling_s"),
            "serve_cpu_s": sum(serve) if serve else None,  # a push reaches every server
            "host_cores": min((r["host_cores"] for r in probes if "host_cores" in r),
                              default=None),
            "step_samples_s": [x for r in probes for x in r.get("step_samples_s", [])],
            "numel": probes[0]["numel"]}


def task_workload(task: str, hidden: tuple[int, ...], batch: int) -> Any:
    """The task's model traced into a workload graph (what the simulator times)."""
    import torch

    from executor.sync.task import Task, build_model, load_task
    from profiler.graph.trace import trace_module

    t = load_task(task)
    if isinstance(t, Task):
        name = task if task == "digits-resnet18" else f"{task}-mlp"
        return trace_module(build_model(t, hidden, 0), torch.zeros(batch, *t.x_train.shape[1:]),
                            name)
    ids = torch.zeros(batch, t.context, dtype=torch.long)
    return trace_module(build_model(t, hidden, 0), ids, f"{task}-transformer")


def predict_sync(plan: Plan, profile: dict[str, Any], workload: Any, steps: int,
                 **kw: Any) -> Any:
    """The DES's prediction of ``plan``'s run from ``profile`` (``kw``: simulate_sync's
    ``convergence``, ``lr``, ``target``)."""
    from sim.strategies import simulate_sync

    payload = profile["numel"] * 4
    cluster = load_cluster(f"cpu:{plan.dp}")
    bw = float(cluster.intra_node.bandwidth_GBps or 0.0) * 1e9
    message_s = profile["exchange_s"] if plan.sync.kind == "gossip" else profile["p2p_s"]
    if message_s is None:
        raise SpecError("profile", "the probe measured no message time (p2p_s, exchange_s)")
    lat_us = max(1.0, (message_s - payload / bw) * 1e6) if bw else 1.0
    cluster = apply_cluster_edits(cluster, [("intra_node.latency_us", lat_us)])
    if profile.get("service_s") and architecture(plan) == "ps":
        comm = plan.communication
        shard = payload * shard_fractions(parameter_tensors(workload), comm.servers,
                                          comm.sharding)[0]
        d = plan.to_dict()
        d["communication"] = {**comm.to_dict(), "architecture": "ps",  # auto resolved
                              **{k: getattr(comm, k) for k in ("servers", "placement",
                                                               "sharding")},
                              "server_cpu_GBps": shard / profile["service_s"] / 1e9}
        plan = Plan.from_dict(d)
    host = {k: profile[k] for k in ("host_cores", *CPU_KEYS) if profile.get(k) is not None}
    return simulate_sync(workload, cluster, plan, "des", steps=steps, measured={
        "step_samples_s": profile["step_samples_s"],
        "allreduce_s": profile["allreduce_s"], **host}, **kw)


def compare_sync(plan: Plan, task: str = "digits", steps: int | None = None, lr: float = 0.1,
                 eval_every: int | None = None, reps: int | None = None,
                 timeout_s: float = 120.0,
                 threads: int = 1, convergence: str | None = None,
                 target: float = 0.95) -> dict[str, Any]:
    """Profile, run and predict ``plan`` on ``task``; measured beside predicted. ``steps``,
    ``reps`` (the probe's repetitions) and ``eval_every`` (0: at the start and the end) default
    by task (``COMPARE_DEFAULTS``)."""
    refused = runnable(plan)
    if refused is not None:
        raise SpecError(*refused)
    from executor.sync.task import COMPARE_DEFAULTS, TASKS, check_task

    check_task(task, plan, None)
    hidden = TASKS[task]
    default_steps, default_reps, default_every = COMPARE_DEFAULTS[task]
    steps = default_steps if steps is None else steps
    reps = default_reps if reps is None else reps
    every = default_every if eval_every is None else eval_every
    for name, value, least in (("steps", steps, 1), ("reps", reps, 1), ("eval_every", every, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise SpecError(name, f"must be an integer >= {least}, got {value!r}")
    eval_every = every or steps
    servers = plan.communication.servers if architecture(plan) == "ps" else 0
    cfg = {"task": task, "hidden": list(hidden), "steps": steps, "eval_every": eval_every,
           "device": "cpu", "threads": threads, "timeout_s": timeout_s, "lr": lr, "seed": 0,
           "plan": plan.to_dict(), "runs": [{"probe": reps}, {}]}
    ranks = launch("executor.sync.worker", cfg, plan.dp + servers, timeout_s, threads)
    profile = profile_of([r["runs"][0] for r in ranks])
    measured = summarize_sync([r["runs"][1] for r in ranks], plan, cfg)
    batch = plan.global_batch_size // plan.dp
    kw = {"convergence": convergence, "lr": lr, "target": target} if convergence else {}
    pred = predict_sync(plan, profile, task_workload(task, hidden, batch), steps, **kw)
    return {"plan": plan.to_dict(), "task": task, "measured": measured,
            "predicted": _predicted(pred),
            "profile": {k: profile[k] for k in (*KEYS, *CPU_KEYS, "host_cores")},
            "errors": _errors(measured, pred, target)}


def _predicted(r: Any) -> dict[str, Any]:
    t = r.time_to_target
    return {"updates_per_s": r.updates_per_s, "samples_per_s": r.samples_per_s,
            "staleness_mean": r.staleness.get("mean"), "update_scope": r.update_scope,
            "updates_to_target": None if not t or t["diverges"] else t["updates"],
            "updates_band": None if not t or t["diverges"] else (t["updates_low"],
                                                                 t["updates_high"]),
            "diverges": bool(t and t["diverges"]), "time_to_target": t or None,
            "warnings": r.warnings}


def _errors(m: dict[str, Any], r: Any, target: float) -> dict[str, Any]:
    out: dict[str, Any] = {"updates_per_s": r.updates_per_s / m["updates_per_s"] - 1
                           if m["updates_per_s"] else None}
    stale = r.staleness.get("mean")
    if m["servers"] and stale is not None and m["staleness"]["mean"]:
        out["staleness_mean"] = stale / m["staleness"]["mean"] - 1
    u = updates_to(m, target)
    t = r.time_to_target
    if u and t and not t["diverges"]:
        out["updates_to_target"] = t["updates"] / u - 1
    return out
