"""The executor's validation suite: two-rank plans of the ``tiny`` model on ``cpu:2``, one
per parallelism the executor applies (tests run every one; ``experiments/
validate_executor_cpu.py`` compares them with the simulator)."""

from __future__ import annotations

from sim.spec.plan import Plan

__all__ = ["suite_plans"]


def suite_plans(global_batch_size: int = 8, seq_len: int = 512) -> dict[str, Plan]:
    """Name -> plan. Every plan trains the same global batch (so times compare)."""
    base = {"global_batch_size": global_batch_size, "seq_len": seq_len, "dtype": "fp32"}
    mb = global_batch_size // 4  # four micro-batches on pipelines, two per DP rank
    return {
        "dp2": Plan(**base, dp=2, micro_batch_size=mb),
        "tp2": Plan(**base, tp=2, micro_batch_size=2 * mb),
        "tp2-sp": Plan(**base, tp=2, micro_batch_size=2 * mb, sequence_parallel=True),
        "pp2-gpipe": Plan(**base, pp=2, micro_batch_size=mb, schedule="gpipe"),
        "pp2-1f1b-4mb": Plan(**base, pp=2, micro_batch_size=mb),
        "pp2-1f1b-8mb": Plan(**base, pp=2, micro_batch_size=mb // 2),
        "zero3-fsdp": Plan(**base, dp=2, micro_batch_size=mb, zero_stage=3),
        "dp2-recompute": Plan(**base, dp=2, micro_batch_size=mb, recompute="full"),
    }
