"""Fit the software-stack values that ``sim/data/stacks.toml`` marks as fitted, each from one
cited published measurement, and check them on the measurements held out (issue 19).

Run: ``.venv/bin/python experiments/fit_stacks.py`` (seconds). Writes
``experiments/results/fit_stacks.csv`` and prints the values to put in the catalog
(``tests/test_stacks.py`` checks that the catalog reproduces what they were fitted to).

* ``torchtitan-compile.elementwise_scale``: torch.compile fuses element-wise ops. Fitted so
  that trainsim's ratio of the eager to the compiled step equals torchtitan's published one
  on Llama 3.1 8B, FSDP, 8 H100 (6,667 / 5,762 tokens/s a GPU,
  ``experiments/data/torchtitan_h100_benchmarks.csv``, a copy of the shared data). A ratio
  between two stacks on the same machine does not depend on the machine's own speed (the
  parts are power-limited Grand Teton H100s, ``grand-teton`` here), which is why a ratio is
  fitted, not a time. Held out: the same pair on 128 GPUs. If even fusing every element-wise
  op to 5% of its time falls short of the published ratio, the value is not identifiable
  from this pair (what compile gains lies then also outside trainsim's element-wise ops) and
  stays 1, as the table says.
* ``torchtitan-compile.fp8_cast_bytes``: then the ratio of Float8 + compile to BF16 +
  compile on the same 8 GPUs (8,532 / 6,667). Held out: 128 GPUs.
* ``torchtitan-compile.tp_overlap_eff``: the share of each GEMM's time that hides the
  tensor-parallel collective fused with it under async TP. Fitted so that trainsim's ratio
  of the vanilla-TP to the async-TP step equals torchtitan's published one on Llama 3 70B,
  FSDP 32 x TP 8, 256 H100, BF16 + compile (652.4 / 597.3 tokens/s a GPU, the 2025-06 async
  TP benchmark). Held out: the same pair for Llama 3 8B (FSDP 8 x TP 8, 64 GPUs) and the
  2024-12 70B Float8 pair (the plans of ``experiments/calibrate_torchtitan.py``).
* ``deepspeed.comm_overlap`` and ``nic_eff``: ``trainsim calibrate``'s fit (``--factors
  nic_eff,comm_overlap --prior 0.005``) on the first ZeRO-3 row of Megatron-LM SC'21 Table
  2 (175B on 384 A100, ``experiments/calibrate_zero3.py``'s runs). Held out: the other five.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))

from calibrate_zero3 import runs as zero3_runs  # noqa: E402

from optimizer.calibrate import fit  # noqa: E402
from sim import load_cluster, simulate  # noqa: E402
from sim.io import atomic_write_text  # noqa: E402
from sim.spec.cluster import ClusterSpec  # noqa: E402
from sim.spec.plan import Plan  # noqa: E402
from sim.spec.zoo import load_any  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "experiments" / "results" / "fit_stacks.csv"
TT = ROOT / "experiments" / "data" / "torchtitan_h100_benchmarks.csv"


def tt_tps(gpus: int, mode: str) -> float:
    """Published tokens/s a GPU of the 8B FSDP run (the CSV spells the compiled BF16 mode
    two ways)."""
    df = pd.read_csv(TT)
    modes = {mode, mode.replace("torch.compile", "compile")}
    row = df[df["model"].eq("Llama 3.1 8B") & df["parallelism"].eq("FSDP")
             & df["gpus"].astype(str).eq(str(gpus)) & df["precision_mode"].isin(modes)]
    return float(row["tokens_per_s_per_gpu"].iloc[0])


def tt_step(gpus: int, dtype: str, stack: str, **values: float) -> float:
    """trainsim's step of torchtitan's 8B FSDP run on ``gpus`` Grand Teton H100s."""
    plan = Plan(global_batch_size=2 * gpus, seq_len=8192, dp=gpus, micro_batch_size=2,
                zero_stage=3, recompute="selective", dtype=dtype)
    cluster = dataclasses.replace(load_cluster(f"grand-teton:{gpus // 8}"), stack=stack)
    return simulate(load_any("llama3-8b"), _on_devices(cluster, **values), plan
                    ).iteration_time_s


def _on_devices(cluster: ClusterSpec, **values: float) -> ClusterSpec:
    """``cluster`` with ``values`` on every device (on top of its stack's)."""
    if not values:
        return cluster
    gpu = dataclasses.replace(cluster.gpu, **values)
    return dataclasses.replace(cluster, gpu=gpu, node_groups=tuple(
        dataclasses.replace(g, gpu=gpu) for g in cluster.node_groups))


def solve(f: Callable[[float], float], target: float, lo: float, hi: float) -> float:
    """The x in [lo, hi] where the monotone ``f`` meets ``target`` (an end if it never does)."""
    f_lo, f_hi = f(lo), f(hi)
    if (f_lo - target) * (f_hi - target) > 0:
        return lo if abs(f_lo - target) < abs(f_hi - target) else hi
    for _ in range(60):
        mid = (lo + hi) / 2
        if (f(mid) - target) * (f_lo - target) > 0:
            lo, f_lo = mid, f(mid)
        else:
            hi = mid
    return (lo + hi) / 2


def torchtitan_rows() -> list[dict[str, object]]:
    eager, compiled, fp8 = "BF16 eager", "BF16 + torch.compile", "Float8 + compile"

    def pub(gpus: int, a: str, b: str) -> float:
        return tt_tps(gpus, b) / tt_tps(gpus, a)

    eager_s = tt_step(8, "bf16", "torchtitan-eager")
    scale = solve(lambda s: eager_s / tt_step(8, "bf16", "torchtitan-compile",
                                              elementwise_scale=s),
                  pub(8, eager, compiled), 0.05, 1.0)
    if eager_s / tt_step(8, "bf16", "torchtitan-compile", elementwise_scale=scale) \
            < pub(8, eager, compiled) * 0.995:  # fusing every element-wise op falls short
        scale = None  # not identifiable from this pair: left unfused (see the module)
    fitted_scale, scale = scale is not None, 1.0 if scale is None else scale
    cast = solve(lambda c: tt_step(8, "bf16", "torchtitan-compile", elementwise_scale=scale)
                 / tt_step(8, "fp8", "torchtitan-compile", elementwise_scale=scale,
                           fp8_cast_bytes=c), pub(8, compiled, fp8), 0.0, 16.0)
    kw = {"elementwise_scale": scale, "fp8_cast_bytes": cast}
    rows = []
    for field, value, (a, b), dtypes in (
            ("elementwise_scale", scale, (eager, compiled), ("bf16", "bf16")),
            ("fp8_cast_bytes", cast, (compiled, fp8), ("bf16", "fp8"))):
        for gpus in (8, 128):
            first = "torchtitan-eager" if a == eager else "torchtitan-compile"
            pred = tt_step(gpus, dtypes[0], first, **({} if a == eager else kw)) \
                / tt_step(gpus, dtypes[1], "torchtitan-compile", **kw)
            role = "fitted" if gpus == 8 else "held out"
            if field == "elementwise_scale" and not fitted_scale:
                role = "not identifiable: left at 1"
            rows.append({"stack": "torchtitan-compile", "field": field, "value": value,
                         "check": f"{b} / {a}, 8B FSDP, {gpus} GPUs", "role": role,
                         "published": pub(gpus, a, b), "predicted": pred})
    return rows


def async_tp_rows() -> list[dict[str, object]]:
    from calibrate_torchtitan import runs as tt_runs

    by_label = {r.label: r for r in tt_runs()[0]}
    pairs = [("70B", "FSDP32 x TP8 vanilla TP 256 GPUs BF16 + compile",
              "FSDP32 x TP8 async TP 256 GPUs BF16 + compile"),
             ("8B", "FSDP8 x TP8 vanilla TP 64 GPUs BF16 + compile",
              "FSDP8 x TP8 async TP 64 GPUs BF16 + compile"),
             ("70B", "FSDP32 x TP8 256 GPUs Float8 + compile",
              "FSDP32 x TP8 + AsyncTP 256 GPUs Float8 + compile")]

    def ratio(pair: tuple[str, str, str], eff: float) -> float:
        size, vanilla, fused = pair
        a, b = by_label[f"{size} {vanilla}"], by_label[f"{size} {fused}"]
        return simulate(a.model, a.cluster, a.plan).iteration_time_s / simulate(
            b.model, _on_devices(b.cluster, tp_overlap_eff=eff), b.plan).iteration_time_s

    def published(pair: tuple[str, str, str]) -> float:
        size, vanilla, fused = pair
        return by_label[f"{size} {vanilla}"].measured_s / by_label[f"{size} {fused}"].measured_s
    eff = solve(lambda e: ratio(pairs[0], e), published(pairs[0]), 0.0, 1.0)
    return [{"stack": "torchtitan-compile", "field": "tp_overlap_eff", "value": eff,
             "check": f"vanilla / async TP step, {p[0]} {p[2]}",
             "role": "fitted" if i == 0 else "held out", "published": published(p),
             "predicted": ratio(p, eff)} for i, p in enumerate(pairs)]


def deepspeed_rows() -> list[dict[str, object]]:
    rs = zero3_runs()
    cal = fit(rs[:1], factors=("nic_eff", "comm_overlap"), prior=0.005)
    out = []
    for i, run in enumerate(rs):
        c = _on_devices(dataclasses.replace(run.cluster, stack="deepspeed"), **cal["factors"])
        t = simulate(run.model, c, run.plan).iteration_time_s
        for field, value in cal["factors"].items():
            out.append({"stack": "deepspeed", "field": field, "value": value,
                        "check": f"ZeRO-3 {run.label} iteration (s)",
                        "role": "fitted" if i == 0 else "held out",
                        "published": run.measured_s, "predicted": t})
    return out


def main() -> int:
    df = pd.DataFrame(torchtitan_rows() + async_tp_rows() + deepspeed_rows())
    df["error_pct"] = 100 * (df["predicted"] / df["published"] - 1)
    atomic_write_text(OUT, df.to_csv(index=False, float_format="%.4g"))
    print(df.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    values = df.drop_duplicates(["stack", "field"])[["stack", "field", "value"]]
    print("\nfor sim/data/stacks.toml:")
    for r in values.itertuples():
        print(f"  [{r.stack}] {r.field} = {r.value:.3g}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
