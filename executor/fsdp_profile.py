"""``trainsim profile fsdp``: what FSDP2 (ZeRO-3) costs around its collectives, timed over
``torchrun`` ranks into the profile DB.

The tiers charge a ZeRO-3 unit its all-gathers and reduce-scatter from the collective
profile. FSDP2 does more on the host for each: it copies a unit's shards into the
all-gather's buffer and the gathered tensor out into the parameters, concatenates the
gradients into the reduce-scatter's buffer and divides and accumulates its result, and
runs Python hooks around each unit's forward and backward. On our 2-core VM that left the
executor's ZeRO-3 plan 9-24% slower than predicted in every run (``experiments/NOTES.md``).

These rows measure it with synthetic units (:mod:`executor.fsdp_worker`): ``fsdp-units``
(params per unit, child units, dp ranks) is a root of ``units`` children, all wrapped by
FSDP2, forward and backward; ``fsdp-plain`` the same modules unwrapped; variant
``reshard=True;tensors=T``. Two child counts per size separate the cost of one unit from
the root's own (:func:`sim.cost.fsdp.fsdp_tables`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from executor.layer_profile import TORCH_DTYPES, profile_ranks
from sim.errors import SpecError

__all__ = ["FSDP_OPS", "DEFAULT_PARAMS", "COLUMNS", "fsdp_shapes", "run_fsdp_profile"]

FSDP_OPS = ("fsdp-plain", "fsdp-units")
DEFAULT_PARAMS = [1 << 16, 1 << 18, 1 << 20, 1 << 22]  # 256 KiB to 16 MiB in fp32
UNITS = (1, 3)  # child units: the difference is two units' cost, the rest the root's
TENSORS = 8  # parameter tensors per unit, as a transformer layer's
COLUMNS = 256  # each one's width
MAX_PARAMS = 1 << 28


def fsdp_shapes(params: list[int], dp: int, dtype: str) -> list[dict[str, Any]]:
    """One worker shape per (params per unit, child units), with its DB key."""
    if dp < 2:
        raise SpecError("--dp", f"must be >= 2 (a data-parallel group), got {dp}")
    step = TENSORS * COLUMNS * dp  # whole matrices, evenly sharded
    for p in params:
        if not step <= p <= MAX_PARAMS or p % step:
            raise SpecError("--params", f"{p} must be a multiple of {step} ({TENSORS} "
                            f"matrices of {COLUMNS} columns, rows split over {dp} ranks) up "
                            f"to {MAX_PARAMS}")
    return [{"params": p, "units": n,
             "key": {"variant": f"reshard=True;tensors={TENSORS}", "dtype": dtype,
                     "grid": "fsdp", "m": p, "n": n, "k": dp}}
            for p in sorted(set(params)) for n in UNITS]


def run_fsdp_profile(dp: int, params: list[int], root: str | Path, device: str = "cpu",
                     dtype: str = "fp32", passes: int = 1, samples: int = 25, warmup: int = 2,
                     timeout_s: float = 1800.0) -> tuple[Path, list[dict[str, Any]]]:
    """Measure every shape ``passes`` times (separate torchrun runs; each row keeps its
    median pass), merge the rows into the DB's compute table; (device folder, rows)."""
    shapes = fsdp_shapes(params, dp, dtype)
    cfg = {"shapes": shapes, "device": device, "threads": 1, "timeout_s": timeout_s,
           "torch_dtype": TORCH_DTYPES[dtype], "samples": samples, "warmup": warmup,
           "tensors": TENSORS}
    return profile_ranks("executor.fsdp_worker", cfg, dp, root, passes,
                         {"kind": "fsdp-units", "device": device, "dp": dp})
