"""What a user asks of the search beyond speed: the framework that must run the plan, the
highest ZeRO stage, degrees held fixed, a memory budget per device and a floor on MFU.

The framework and the fixed degrees shape the space itself (plans that break them are
never generated or moved to), so the best plan a framework can run is searched for, not
filtered out of another search's top K. The memory budget joins the memory filter; the MFU
floor is applied to every tier's figure.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from sim.errors import SpecError
from sim.spec.model import ModelSpec
from sim.spec.plan import Plan

__all__ = ["Constraints", "FIXABLE", "FRAMEWORK_CHOICES", "parse_fix"]

FRAMEWORK_CHOICES = ("any", "megatron", "torchtitan", "deepspeed")
# --fix NAME=VALUE: plan fields the search can hold fixed
FIXABLE = ("tp", "pp", "dp", "cp", "ep", "vpp", "micro_batch_size")


@dataclass(frozen=True)
class Constraints:
    framework: str = "any"  # only plans this export format expresses
    max_zero_stage: int = 3
    fixed: tuple[tuple[str, int], ...] = ()  # (field, value) held fixed
    max_memory_gib: float | None = None  # per-device budget below the device's capacity
    min_mfu: float | None = None  # 0..1

    def __post_init__(self) -> None:
        if self.framework not in FRAMEWORK_CHOICES:
            raise SpecError("--framework", f"must be one of {', '.join(FRAMEWORK_CHOICES)}, "
                            f"got {self.framework!r}")
        if self.max_zero_stage not in (0, 1, 2, 3):
            raise SpecError("--max-zero-stage", f"must be 0, 1, 2 or 3, got "
                            f"{self.max_zero_stage}")
        if self.max_memory_gib is not None and not 0 < self.max_memory_gib < 1e6:
            raise SpecError("--max-memory-gib", f"must be in (0, 1e6) GiB, got "
                            f"{self.max_memory_gib}")
        if self.min_mfu is not None and not 0 <= self.min_mfu < 1:
            raise SpecError("--min-mfu", f"must be a fraction in [0, 1), got {self.min_mfu}")

    def fixed_value(self, name: str) -> int | None:
        return dict(self.fixed).get(name)

    def admits(self, plan: Plan, model: ModelSpec) -> bool:
        """Whether the plan keeps the fixed values, the ZeRO ceiling and the framework."""
        from optimizer.export import refusal

        if plan.zero_stage > self.max_zero_stage:
            return False
        if any(getattr(plan, name) != value for name, value in self.fixed):
            return False
        return self.framework == "any" or refusal(self.framework, plan, model) is None

    def describe(self) -> list[str]:
        out = [] if self.framework == "any" else [f"framework {self.framework}"]
        out += [f"ZeRO <= {self.max_zero_stage}"] if self.max_zero_stage < 3 else []
        out += [f"{k}={v}" for k, v in self.fixed]
        out += [f"<= {self.max_memory_gib:g} GiB"] if self.max_memory_gib is not None else []
        out += [f"MFU >= {100 * self.min_mfu:g}%"] if self.min_mfu is not None else []
        return out


def parse_fix(items: Iterable[str]) -> tuple[tuple[str, int], ...]:
    """``["tp=8", "pp=4"]`` -> ``(("pp", 4), ("tp", 8))``; one-line errors otherwise."""
    out: dict[str, int] = {}
    for item in items:
        name, sep, value = item.partition("=")
        name = name.strip().replace("-", "_")
        name = "micro_batch_size" if name in ("mbs", "micro_batch") else name
        if not sep or name not in FIXABLE:
            raise SpecError("--fix", f"takes NAME=VALUE with NAME one of {', '.join(FIXABLE)}, "
                            f"got {item!r}")
        if not value.strip().isdigit() or int(value) < 1:
            raise SpecError("--fix", f"{name} must be a positive integer, got {value!r}")
        if name in out:
            raise SpecError("--fix", f"{name} is given twice")
        out[name] = int(value)
    return tuple(sorted(out.items()))
