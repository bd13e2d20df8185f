"""Real DiLoCo runs on a small language-modelling task on this CPU (issue 17): how many inner
steps DiLoCo needs to reach a test loss, against BSP, as its period H grows.

Run: ``.venv/bin/python experiments/diloco_text_cpu.py [--steps 2000] [--periods 1,500]``
(about 30 minutes on 2 cores, a line a run; ``--periods`` reruns those periods only, 1 for
BSP, and keeps the other rows). Two workers (two "sites") under torchrun over gloo, each
training the ``text`` task (:mod:`executor.sync.text`: next-character prediction on
CPython's bundled documentation prose, a 110,400-parameter causal transformer of width 64
and 2 layers, windows of 64 characters, 16 windows a worker a step) on its own half of the
training text, with AdamW inside (betas 0.9/0.95, weight decay 0.1, as DiLoCo) and:

- BSP: the two workers' mean gradient every step (AdamW on it);
- DiLoCo, H in {10, 50, 100, 250, 500}: H inner AdamW steps alone, then the mean
  pseudo-gradient (fp32) through the outer Nesterov SGD (lr 0.7, momentum 0.9: Douillard et
  al. 2023's values, the plan's defaults);

at inner learning rates 1e-3, 2e-3 and 4e-3, seed 0; each run ``--steps`` inner steps or
8 synchronisations, whichever is more (H = 500: 4,000). Worker 0 evaluates every 50 steps on
256 held-out windows; a DiLoCo run is evaluated at its outer (global) parameters, the model
the run has between synchronisations. An update is one inner step of a worker.

Writes ``experiments/results/diloco_text_cpu.csv`` (a row per run: steps to each target
loss), ``diloco_text_curves_cpu.csv`` (test loss against steps), ``diloco_text_cpu.png``
(the curves at lr 2e-3) and the runs the bundled
statistical-efficiency model ``text-cpu`` is fitted to, ``sim/data/convergence/text_cpu.csv``
(``updates_to_target``: steps to a test loss of 1.9 nats a character).

``--workers 4`` (the whole grid, about 21 minutes here; ``--workers 8 --periods 1,50,500
--lrs 2e-3`` about 8) runs the same task with four (eight) replicas, each on its quarter
(eighth) of the text, 16 windows a worker a step (BSP's batch grows with them), and writes
``diloco_text_cpu_4w.csv``, ``diloco_text_curves_cpu_4w.csv`` and ``diloco_text_cpu_4w.png``
(``_8w``); the bundled model is left as the two-worker runs fitted it.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

import pandas as pd

from executor.sync.launch import execute_sync_batch
from sim.cost.convergence import BUNDLED
from sim.io import atomic_write_text
from sim.spec.plan import Plan

RESULTS = Path(__file__).resolve().parent / "results"
BATCH = 16
PERIODS = (10, 50, 100, 250, 500)
LRS = (1e-3, 2e-3, 4e-3)
TARGETS = (2.2, 2.0, 1.9, 1.8)  # test loss, nats a character
TARGET = 1.9  # the bundled model's


def _plan(sync: object, n: int) -> Plan:
    return Plan(global_batch_size=n * BATCH, seq_len=64, dp=n, sync=sync)  # type: ignore[arg-type]


def _files(n: int) -> tuple[Path, Path, Path]:
    """(runs, curves, figure) of ``n`` workers."""
    tail = "" if n == 2 else f"_{n}w"
    return (RESULTS / f"diloco_text_cpu{tail}.csv", RESULTS / f"diloco_text_curves_cpu{tail}.csv",
            RESULTS / f"diloco_text_cpu{tail}.png")


def steps_to(evals: list[dict[str, Any]], loss: float) -> int | None:
    """Inner steps until worker 0 first measured a test loss at most ``loss``."""
    for e in evals:
        if e["loss"] <= loss:
            return int(e["updates"])
    return None


def runs(periods: set[int] | None = None, n: int = 2, lrs: tuple[float, ...] = LRS
         ) -> list[tuple[str, Plan, float]]:
    """(label, plan, lr) of the grid, or of its ``periods`` (1: BSP)."""
    out = [("BSP", _plan("bsp", n), lr) for lr in lrs]
    out += [(f"DiLoCo H={h}", _plan({"kind": "diloco", "period": h}, n), lr)
            for h in PERIODS for lr in lrs]
    return [r for r in out if periods is None or _period(r[1]) in periods]


def _period(p: Plan) -> int:
    return p.sync.period if p.sync.kind == "diloco" else 1


def _row(label: str, p: Plan, lr: float, r: dict[str, Any]) -> dict[str, Any]:
    ev = r["evals"]
    row = {"strategy": label, "kind": p.sync.kind,
           "period": _period(p), "lr": lr, "seed": 0,
           "steps": r["steps"], "final_loss": ev[-1]["loss"],
           "final_accuracy": ev[-1]["accuracy"],
           "diverged": not math.isfinite(ev[-1]["loss"]) or ev[-1]["loss"] > ev[0]["loss"],
           "wall_s": r["wall_s"]}
    row.update({f"steps_to_{t:g}": steps_to(ev, t) for t in TARGETS})
    return row


def _write(df: pd.DataFrame, curves: list[dict[str, Any]], n: int) -> None:
    RESULTS.mkdir(exist_ok=True)
    table, curve_file, _ = _files(n)
    atomic_write_text(table, df.to_csv(index=False, float_format="%.6g"))
    atomic_write_text(curve_file, pd.DataFrame(curves).to_csv(index=False, float_format="%.6g"))
    grid = {(h, lr) for h in (1, *PERIODS) for lr in LRS}
    if n != 2 or set(zip(df["period"], df["lr"], strict=True)) != grid:
        return  # (the bundled model: the two-worker runs, the whole grid)
    fit = pd.DataFrame({
        "kind": df["kind"], "lr": df["lr"], "staleness_mean": 0.0, "period": df["period"],
        "updates_to_target": df[f"steps_to_{TARGET:g}"], "diverged": df["diverged"],
        "task": "text", "target_loss": TARGET, "seed": df["seed"], "steps": df["steps"]})
    atomic_write_text(BUNDLED / "text_cpu.csv", fit.to_csv(index=False, float_format="%.6g"))


def _kept(todo: list[tuple[str, Plan, float]], n: int
          ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The rows and curves of the (period, lr) pairs not rerun."""
    table, curve_file, _ = _files(n)
    if not table.is_file():
        return [], []
    df = pd.read_csv(table)
    curves = pd.read_csv(curve_file)
    redo = {(_period(p), lr) for _, p, lr in todo}
    df = df[[(h, lr) not in redo for h, lr in zip(df["period"], df["lr"], strict=True)]]
    keep = {(s, lr) for s, lr in zip(df["strategy"], df["lr"], strict=True)}
    curves = curves[[(s, lr) in keep for s, lr in zip(curves["strategy"], curves["lr"],
                                                       strict=True)]]
    return df.to_dict("records"), curves.to_dict("records")


def figure(curves: pd.DataFrame, path: Path, lr: float = 2e-3, n: int = 2) -> None:
    """Test loss against inner steps at one inner learning rate, BSP and every H."""
    import matplotlib.pyplot as plt

    from trainsim.plots.output import save_figure

    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for label, c in curves[curves["lr"] == lr].groupby("strategy", sort=False):
        ax.plot(c["updates"], c["loss"], label=label)
    ax.axhline(TARGET, color="grey", linestyle=":", label=f"target {TARGET} nats")
    ax.set_ylim(1.3, 3.5)
    ax.set_xlabel("Inner steps of a worker")
    ax.set_ylabel("Test loss (nats a character)")
    ax.set_title(f"DiLoCo vs BSP, {n} workers, text task, inner AdamW lr {lr:g}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, path)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=2000, help="inner steps a run, at least "
                    "(2000)")
    ap.add_argument("--periods", help="rerun these periods only (comma-separated, 1: BSP)")
    ap.add_argument("--plot-only", action="store_true", help="redraw the figure from the "
                    "curves already written")
    ap.add_argument("--workers", type=int, default=2, help="replicas (2: the bundled model's "
                    "runs; others write *_<N>w files)")
    ap.add_argument("--lrs", help="inner learning rates (comma-separated; default 1e-3,2e-3,"
                    "4e-3)")
    args = ap.parse_args()
    n = args.workers
    if not 2 <= n <= 8:
        ap.error(f"--workers: 2 to 8 replicas on this machine, got {n}")
    _, curve_file, png = _files(n)
    if args.plot_only:
        figure(pd.read_csv(curve_file), png, n=n)
        return
    only = {int(x) for x in args.periods.split(",")} if args.periods else None
    lrs = tuple(float(x) for x in args.lrs.split(",")) if args.lrs else LRS
    todo = runs(only, n, lrs)
    rows, curves = _kept(todo, n) if only is not None or args.lrs else ([], [])
    for i, (label, p, lr) in enumerate(todo):  # a torchrun start a run: none starves the rest
        steps = max(args.steps, 8 * _period(p))
        r = execute_sync_batch([(p, lr, 0)], "text", steps=steps, eval_every=50,
                               timeout_s=3600, inner="adamw", eval_global=True)[0]
        rows.append(_row(label, p, lr, r))
        curves += [{"strategy": label, "lr": lr, **e} for e in r["evals"]]
        print(f"[{i + 1}/{len(todo)}] {label} lr {lr:g}: final loss "
              f"{rows[-1]['final_loss']:.3f}, steps to {TARGET}: "
              f"{rows[-1][f'steps_to_{TARGET:g}']} ({r['wall_s']:.0f} s)", flush=True)
        _write(pd.DataFrame(rows), curves, n)  # what has run survives an interruption
    df = pd.DataFrame(rows).sort_values(["period", "lr"], kind="stable")
    _write(df, curves, n)
    figure(pd.DataFrame(curves), png, lr=lrs[0] if 2e-3 not in lrs else 2e-3, n=n)
    cols = ["strategy", "lr", "final_loss"] + [f"steps_to_{t:g}" for t in TARGETS]
    print(df[cols].to_string(index=False))


if __name__ == "__main__":
    main()
